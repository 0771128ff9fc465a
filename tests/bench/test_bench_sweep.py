"""scripts/bench/sweep.py runs end to end as `make bench` runs it, at its smallest: a sweep file of one trial of 2
epochs around configs/penguins.yaml, and its trial of "about a minute" held to 2 epochs. Each command's wall time as it
ends, then the sweep against the default fit, the trials' states, both validation figures at their best epoch, both
test accuracies, the best values and the trials' start-up. Times are not checked (the bench is where they are read).
Its start-up clock (StartupClock): in a real fit it logs, once, to the fit's run, the seconds from its process's start
to its first training batch and the CPU spent by then.

.venv/bin/python -m pytest -q tests/bench/test_bench_sweep.py
"""

from __future__ import annotations

import re

import pytest
import yaml
from mlflow import MlflowClient

from scripts.bench.sweep import STARTUP, STARTUP_CPU, minute_epochs
from tests.bench.printed import summary_figure
from tests.conftest import run_module


def tiny_sweep(folder) -> str:
    (folder / "two_epochs.yaml").write_text(yaml.safe_dump({"trainer": {"max_epochs": 2}}))
    sweep = {
        "config": ["configs/penguins.yaml", str(folder / "two_epochs.yaml")],
        "objective": {"metric": "val_loss", "goal": "minimize"},
        "sampling": {"algorithm": "random", "seed": 42},
        "budget": {"trials": 1},
        "early_termination": {"policy": "median", "delay_evaluation": 1, "evaluation_interval": 1},
        "search_space": {"model.optimizer.init_args.lr": {"loguniform": [1.0e-3, 1.0e-1]}},
    }
    (folder / "tiny.yaml").write_text(yaml.safe_dump(sweep))
    return str(folder / "tiny.yaml")


@pytest.mark.slow  # three fits and a sweep, each a process of its own
def test_prints_each_command_as_it_ends_then_the_sweep_against_the_default_fit(tmp_path):
    sweep = tiny_sweep(tmp_path)
    result = run_module("scripts.bench.sweep", "--sweep", sweep, "--minute_epochs", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    commands = ("default config, one fit", "sweep (python -m scripts.sweep)", "best trial's config trained again",
                "one trial of 2 epochs")  # fmt: skip
    for command in commands:
        assert summary_figure(printed, rf"^{re.escape(command)}: (\S+) s$") > 0
    assert f"{sweep}: 1 trials, random sampling, median early termination" in printed
    assert summary_figure(printed, r"^  sweep \(python -m scripts.sweep\) +\S+ s +(\S+)x the default fit$") > 0
    assert "  trials: 1 complete, 0 pruned, 0 fail; 2 epochs trained in all" in printed
    assert "  pruned: trials none" in printed
    for config in ("default config", r"best trial \( 0\)"):
        assert 0 < summary_figure(printed, rf"^    {config} +(\S+) +\S+$") <= 1
    assert 0 < summary_figure(printed, r"^  test_acc: default (\S+), best config trained again \S+$") <= 1
    assert 0 < summary_figure(printed, r"^  test_acc: default \S+, best config trained again (\S+)$") <= 1
    assert "  best values: seed_everything 42, model.optimizer.init_args.lr " in printed
    assert (
        summary_figure(
            printed, r"^trial start-up \(process start to first training batch\), median of 1 trials: (\S+) s"
        )
        > 0
    )
    assert summary_figure(printed, r"^  one trial of 2 epochs: start-up (\S+) s") > 0


def test_a_fit_with_the_clock_logs_its_start_up_once(train_cli, tmp_path):
    args = ("--config", "configs/penguins.yaml", "--trainer.max_epochs", "2", "--test_after_fit", "false")
    result = train_cli("fit", *args, "--trainer.callbacks+", "scripts.bench.sweep.StartupClock")
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/outputs/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (startup,), (cpu,) = (client.get_metric_history(run.info.run_id, name) for name in (STARTUP, STARTUP_CPU))
    assert startup.step == cpu.step == 0
    assert cpu.value > 0 and startup.value > 0


def test_the_trial_of_about_a_minute_takes_the_epochs_its_time_an_epoch_gives():
    assert minute_epochs((10.0, 6.0, 35.0, 100)) == 200  # 25 s of 100 epochs after a 10 s start: 50 s of 200
    assert minute_epochs((70.0, 60.0, 80.0, 10)) == 1  # a start-up past a minute still trains
