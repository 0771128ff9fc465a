"""The learning-rate options mean what they say, read off the lr Lightning's LearningRateMonitor logs at every step:
the module's warm-up and decay, `model.lr_scheduler` in their place, and LightningCLI's own `--optimizer` and
`--lr_scheduler` refused in one line naming the module's (they would replace its configure_optimizers). And
`--trainer.profiler`: the profiler given, else Lightning's default (PassThroughProfiler: no profiling).

.venv/bin/python -m pytest -q tests/test_lr_options.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.conftest import run_module

STEPS_PER_EPOCH = 12  # the penguins' training split at configs/penguins.yaml's batch size


def logged_lr(tmp_path: Path, *args: str) -> list[float]:
    """The lr of each optimizer step of a 2-epoch penguin fit with `args`."""
    result = run_module(
        "scripts.train", "fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "2",
        "--test_after_fit", "false", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.init_args.save_dir", str(tmp_path),
        "--trainer.log_every_n_steps", "1",
        "--trainer.callbacks+", "lightning.pytorch.callbacks.LearningRateMonitor",
        "--trainer.callbacks.logging_interval", "step", *args,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (metrics,) = tmp_path.glob("lightning_logs/*/metrics.csv")
    with metrics.open() as rows:
        return [float(row["lr-Adam"]) for row in csv.DictReader(rows) if row.get("lr-Adam")]


def test_no_schedule_keeps_the_lr(tmp_path):
    assert logged_lr(tmp_path) == [0.001] * (2 * STEPS_PER_EPOCH)


def test_warm_up_then_polynomial_decay(tmp_path):
    lrs = logged_lr(tmp_path, "--model.warmup_steps", "4", "--model.poly_decay_power", "1")
    assert lrs[:4] == pytest.approx([0.00025, 0.0005, 0.00075, 0.001])
    total = 2 * STEPS_PER_EPOCH
    assert lrs[4:] == pytest.approx([0.001 * (1 - (step - 4) / (total - 4)) for step in range(4, total)])


def test_model_lr_scheduler_is_the_schedule(tmp_path):
    step_lr = [
        "--model.lr_scheduler",
        "torch.optim.lr_scheduler.StepLR",
        "--model.lr_scheduler.init_args.step_size",
        "1",
    ]
    lrs = logged_lr(tmp_path, *step_lr, "--model.lr_scheduler.init_args.gamma", "0.1")
    assert lrs == pytest.approx([0.001] * STEPS_PER_EPOCH + [0.0001] * STEPS_PER_EPOCH)  # an epoch-wise scheduler


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--optimizer", "torch.optim.SGD"],
         "error: --optimizer: LightningCLI's own option would replace the module's configure_optimizers (its warm-up, "
         "decay and lr scaling); give --model.optimizer instead, with the same class path and init_args"),
        (["--lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size", "1"],
         "error: --lr_scheduler: LightningCLI's own option would replace the module's configure_optimizers (its "
         "warm-up, decay and lr scaling); give --model.lr_scheduler instead, with the same class path and init_args"),
        (["--model.lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--model.lr_scheduler.init_args.step_size", "1",
          "--model.warmup_steps", "5"],
         "error: model.lr_scheduler replaces the module's own schedule, which is set (warmup_steps 5, "
         "poly_decay_power 0.0); give --model.warmup_steps 0 --model.poly_decay_power 0 with it, or leave "
         "model.lr_scheduler out"),
    ],
    ids=["optimizer", "lr_scheduler", "scheduler-with-warm-up"],
)  # fmt: skip
def test_options_that_would_drop_the_module_s_schedule_are_refused(tmp_path, args, line):
    result = run_module("scripts.train", "fit", "--config", "configs/penguins.yaml", "--trainer.default_root_dir",
                        str(tmp_path), *args)  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == line
    assert not (tmp_path / "mlflow.db").exists() or not list(tmp_path.glob("*/*/config.yaml"))


@pytest.mark.parametrize("given", [[], ["--trainer.profiler", "simple"]], ids=["none", "simple"])
def test_the_trainer_s_profiler_is_the_one_given_else_none(tmp_path, given):
    from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler

    from scripts.train import cli_main

    args = ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "1", "--test_after_fit", "false",
            "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path), *given]  # fmt: skip
    profiler = cli_main(args).trainer.profiler
    if given:  # Lightning's, timing the fit
        assert isinstance(profiler, SimpleProfiler) and "run_training_epoch" in profiler.recorded_durations
    else:
        assert type(profiler) is PassThroughProfiler
