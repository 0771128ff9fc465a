"""best.ckpt and last.ckpt (Lightning's ModelCheckpoint twice: scripts/training/checkpoints.py) through the real CLI:
last.ckpt is the end of every finished epoch, also after SIGTERM or SIGKILL; a fit started again with its
--checkpoint_dir resumes bit for bit and goes on in its MLflow run, every epoch's metrics there once, as a preempted
Azure ML job restarted with the same command."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from tests.conftest import REPO, run_module

pytestmark = pytest.mark.slow

EPOCHS = 24
STEPS = 60  # 240 training penguins, batch 4: epochs long enough (~0.2 s) to stop one in its middle


def fit(outputs: Path, folder: Path) -> list[str]:
    return [
        "fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", str(EPOCHS),
        "--data.init_args.batch_size", "4", "--trainer.callbacks", "[]",  # no early stop: every run trains EPOCHS
        "--trainer.default_root_dir", str(outputs), "--checkpoint_dir", str(folder), "--test_after_fit", "false",
    ]  # fmt: skip


def load(path: Path) -> dict:
    return torch.load(path, weights_only=False, map_location="cpu")


def epoch_of(path: Path) -> int:
    """The epoch of the checkpoint at `path`, or -1 while there is none (or it is being written)."""
    try:
        return load(path)["epoch"]
    except (OSError, RuntimeError, EOFError, KeyError):
        return -1


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory) -> dict:
    outputs = tmp_path_factory.mktemp("never-stopped")
    result = run_module("scripts.train", *fit(outputs, outputs / "checkpoints"))
    assert result.returncode == 0, result.stderr[-3000:]
    return load(outputs / "checkpoints" / "last.ckpt")


def test_last_is_the_final_epoch_and_best_the_lowest_val_loss(never_stopped, tmp_path):
    assert (never_stopped["epoch"], never_stopped["global_step"]) == (EPOCHS - 1, EPOCHS * STEPS)
    result = run_module("scripts.train", *fit(tmp_path, tmp_path / "checkpoints"))
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val_loss")}
    best = load(tmp_path / "checkpoints" / "best.ckpt")
    assert best["epoch"] == min(history, key=history.get)


def stop_by_signal(command: list[str], folder: Path, stop: signal.Signals) -> None:
    """Runs `command` and sends it `stop` some way into an epoch after the third."""
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while epoch_of(folder / "last.ckpt") < 2:
            assert time.monotonic() < deadline and process.poll() is None, "no third epoch finished"
            time.sleep(0.05)
        time.sleep(0.1)  # into the next epoch
        process.send_signal(stop)
        assert process.wait(timeout=60) == (128 + stop if stop == signal.SIGTERM else -stop)
    finally:
        process.kill()


# Where a stop can come: SIGTERM and SIGKILL wherever they land in an epoch; and exactly where the run's record and
# last.ckpt part: when validation ends (its metrics logged, not sent), and at the epoch's end before its checkpoints
# (the previous epoch's training metrics, which Lightning logged after that epoch's checkpoints, not sent).
STOPS = ["sigterm", "sigkill", "on_validation_end", "on_train_epoch_end"]


@pytest.mark.parametrize("stop", STOPS)
def test_a_fit_stopped_and_started_again_ends_as_one_that_never_stopped_with_every_metric_once(
    never_stopped, tmp_path, stop
):
    folder = tmp_path / "checkpoints"  # an Azure ML job's rw_mount output: it outlives the process and the node
    command = [sys.executable, "-m", "scripts.train", *fit(tmp_path, folder)]
    if stop in ("sigterm", "sigkill"):
        stop_by_signal(command, folder, signal.SIGTERM if stop == "sigterm" else signal.SIGKILL)
    else:
        killer = f"[{{class_path: tests.stopping.KillAt, init_args: {{hook: {stop}, epoch: 3}}}}]"
        killed = subprocess.run([*command, "--trainer.callbacks", killer], cwd=REPO, capture_output=True, timeout=300)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    stopped = load(folder / "last.ckpt")
    assert 2 <= stopped["epoch"] < EPOCHS - 1
    assert stopped["global_step"] == (stopped["epoch"] + 1) * STEPS  # an epoch's end, not a step within one

    again = run_module("scripts.train", *fit(tmp_path, folder))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {folder / 'last.ckpt'}" in again.stdout
    final = load(folder / "last.ckpt")
    assert final["global_step"] == never_stopped["global_step"]
    for name, weights in never_stopped["state_dict"].items():
        assert torch.equal(final["state_dict"][name], weights), name  # bit for bit on the CPU

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])  # one run, continued
    assert run.info.status == "FINISHED"
    for metric in ("val_loss", "val_acc", "train_loss", "train_acc", "train_samples_per_sec"):
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, metric))
        assert steps == list(range(EPOCHS)), metric  # every epoch's, none lost at the stop, none logged twice
