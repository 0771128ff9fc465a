"""What a resume checks (scripts/training/resume.py check_resume) through the CLI: a resume with another config
than the checkpoint's stops in one line before it touches anything, following its advice resumes, and what does not
change the training (a newer release's option, the logging interval, more epochs) resumes in the same run; a fit that
diverges stops in one line, keeps its last finite best.ckpt and last.ckpt and ends its run as failed. Stopped fits
started again: tests/test_stop_and_resume.py.

.venv/bin/python -m pytest -q tests/test_checkpoint.py
"""

from __future__ import annotations

import hashlib
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient

from tests.conftest import run_module


def load(path: Path) -> dict:
    return torch.load(path, weights_only=False, map_location="cpu")


def snapshot(outputs: Path) -> tuple[dict, list]:
    """Every file under `outputs` (checkpoints, config.yaml, artifacts) by checksum; every run's status and params."""
    files = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(outputs.rglob("*")) if p.is_file()}
    files = {path: digest for path, digest in files.items() if not path.endswith(("mlflow.db", ".lock"))}
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], run_view_type=3)
    return files, [(r.info.run_id, r.info.status, r.info.lifecycle_stage, r.data.params) for r in runs]


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory) -> Path:
    """A fit of 2 epochs into outputs/ with --checkpoint_dir outputs/checkpoints, the logger on."""
    outputs = tmp_path_factory.mktemp("two-epochs")
    result = run_module("scripts.train", *resume(outputs, "--trainer.max_epochs", "2"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "exists and is not empty" not in result.stderr  # the folder holds mlflow_run_id, ours: nothing to act on
    return outputs


def resume(outputs: Path, *args: str) -> list[str]:
    return [
        "fit", "--config", "configs/penguins.yaml", "--trainer.default_root_dir", str(outputs),
        "--checkpoint_dir", str(outputs / "checkpoints"), "--test_after_fit", "false", *args,
    ]  # fmt: skip


CHANGED = [  # what a resume cannot change, and the line it ends in (LAST: the checkpoint_dir's last.ckpt)
    (["--model.optimizer.init_args.lr", "0.01"],
     "--model.optimizer.init_args.lr 0.01: {last} was trained with 0.001, and a resume goes on as it began; give "
     "--model.optimizer.init_args.lr 0.001, or a new --checkpoint_dir to train anew"),
    (["--model.network.init_args.hidden", "20"],
     "--model.network.init_args.hidden 20: {last} was trained with 10, and a resume goes on as it began; give "
     "--model.network.init_args.hidden 10, or a new --checkpoint_dir to train anew"),
    (["--config", "configs/mnist.yaml"],  # another task's folder
     "--data.class_path datamodules.mnist.MNISTDataModule: {last} was trained with "
     "datamodules.penguins.PenguinDataModule (and {more} more option(s)), and a resume goes on as it began; give "
     "--data.class_path datamodules.penguins.PenguinDataModule, or a new --checkpoint_dir to train anew"),
    (["--model.lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--model.lr_scheduler.init_args.step_size", "1"],
     "--model.lr_scheduler torch.optim.lr_scheduler.StepLR: {last} was trained with null, and a resume goes on as it "
     "began; give --model.lr_scheduler null, or a new --checkpoint_dir to train anew"),
    (["--trainer.overfit_batches", "3"],  # a Trainer option the old list of what trains did not name
     "--trainer.overfit_batches 3: {last} was trained with 0.0, and a resume goes on as it began; give "
     "--trainer.overfit_batches 0.0, or a new --checkpoint_dir to train anew"),
    (["--trainer.max_epochs", "1"],
     "--trainer.max_epochs 1: {last} has trained 2 epochs already (its config: 2); give 2 or more, or a new "
     "--checkpoint_dir to train anew"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "line"),
    CHANGED,
    ids=["lr", "width", "other-task", "scheduler-added", "overfit", "fewer-epochs"],
)
def test_a_resume_with_another_config_stops_in_one_line_and_touches_nothing(two_epochs, args, line):
    before = snapshot(two_epochs)
    result = run_module("scripts.train", *resume(two_epochs, *args))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = two_epochs / "checkpoints" / "last.ckpt"
    assert re.fullmatch(re.escape("error: " + line.format(last=last, more="@")).replace("@", r"\d+"),
                        result.stderr.strip().splitlines()[-1])  # fmt: skip
    assert snapshot(two_epochs) == before  # no parameter added, no config.yaml rewritten, no folder deleted


@pytest.mark.parametrize("args", [CHANGED[0][0], CHANGED[1][0]], ids=["lr", "width"])
def test_following_a_refusals_advice_resumes(two_epochs, tmp_path, args):
    outputs = tmp_path / "outputs"
    shutil.copytree(two_epochs, outputs)
    refused = run_module("scripts.train", *resume(outputs, *args, "--trainer.max_epochs", "3"))
    advice = re.search(r"; give (--\S+) (\S+), or a new", refused.stderr)
    assert refused.returncode == 1 and advice, refused.stderr[-2000:]
    result = run_module("scripts.train", *resume(outputs, *args, "--trainer.max_epochs", "3", *advice.groups()))
    assert result.returncode == 0, result.stderr[-3000:]
    assert load(outputs / "checkpoints" / "last.ckpt")["epoch"] == 2


def test_a_resume_compares_what_trains_not_what_a_newer_release_added(two_epochs, tmp_path):
    """An option the checkpoint's config lacks (a module argument or a Trainer argument added since it was written)
    and options that do not change what is trained (the logging interval) resume."""
    outputs = tmp_path / "outputs"
    shutil.copytree(two_epochs, outputs)
    last = outputs / "checkpoints" / "last.ckpt"
    checkpoint = load(last)
    config = yaml.safe_load(checkpoint["fit_config"])
    del config["model"]["poly_decay_power"], config["trainer"]["barebones"]
    checkpoint["fit_config"] = yaml.safe_dump(config)
    torch.save(checkpoint, last)
    result = run_module("scripts.train", *resume(outputs, "--trainer.max_epochs", "3",
                                                 "--trainer.log_every_n_steps", "7"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert load(last)["epoch"] == 2


def test_a_resume_may_train_longer_in_the_same_run(two_epochs, tmp_path):
    outputs = tmp_path / "outputs"
    shutil.copytree(two_epochs, outputs)
    ((run_id, *_),) = snapshot(outputs)[1]
    result = run_module("scripts.train", *resume(outputs, "--trainer.max_epochs", "3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert load(outputs / "checkpoints" / "last.ckpt")["epoch"] == 2
    ((same, status, _, params),) = snapshot(outputs)[1]
    assert (same, status, params["trainer.max_epochs"]) == (run_id, "FINISHED", "2")  # MLflow keeps a param's first
    assert "max_epochs: 3" in load(outputs / "checkpoints" / "last.ckpt")["fit_config"]


def test_a_fit_that_diverges_stops_in_one_line_and_keeps_its_last_finite_checkpoints(tmp_path):
    # SGD at 0.01 trains epoch 0; then ExponentialLR makes the lr 1e38 and the weights overflow in epoch 1.
    diverging = ["--model.optimizer", "torch.optim.SGD", "--model.optimizer.init_args.lr", "0.01",
                 "--model.lr_scheduler", "torch.optim.lr_scheduler.ExponentialLR",
                 "--model.lr_scheduler.init_args.gamma", "1e40", "--trainer.max_epochs", "3"]  # fmt: skip
    result = run_module("scripts.train", *resume(tmp_path, *diverging))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: training diverged at epoch 1: train_loss is nan; no checkpoint of it is written (best.ckpt and "
        "last.ckpt keep the last finite epoch, if any); lower model.optimizer.init_args.lr or check the data"
    )
    for name in ("best.ckpt", "last.ckpt"):
        checkpoint = load(tmp_path / "checkpoints" / name)
        assert checkpoint["epoch"] == 0
        assert all(weights.isfinite().all() for weights in checkpoint["state_dict"].values()), name
    ((_, status, _, _),) = snapshot(tmp_path)[1]
    assert status == "FAILED"
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert math.isnan(run.data.metrics["train_loss"])  # the run shows why it failed
