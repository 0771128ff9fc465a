"""A fit stopped and started again through the CLI (best.ckpt and last.ckpt: scripts/training/checkpoints.py):
last.ckpt is the end of every finished epoch, also after SIGTERM or SIGKILL; a fit started again with its
--checkpoint_dir resumes bit for bit, random numbers included, and goes on in its MLflow run, every epoch's metrics
there once, as a preempted Azure ML job restarted with the same command; Ctrl-C ends the run as killed.

The stops and resumes compare with one fit that never stopped (a module fixture); every fit is a process of its own,
forked from the warm launcher (tests/warm_launcher.py), sent SIGTERM, SIGKILL or SIGINT as Azure ML or a user sends
it. Those that train a dozen epochs or three fits (5-9 s each on an idle machine) are marked slow; Ctrl-C is not.

.venv/bin/python -m pytest -q tests/test_stop_and_resume.py
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from mlflow.entities import ViewType

from tests import warm_launcher
from tests.conftest import MNIST, REPO, bird_folders, needs_mnist, run_module

EPOCHS = 12  # a stop after the third epoch lands before the last one with 8 epochs (~3 s) to spare
STEPS = 59  # 235 training penguins, batch 4: epochs long enough (~0.2 s) to stop one in its middle


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


def the_run(outputs: Path):
    """The one MLflow run in outputs/mlflow.db (a deleted one counts too)."""
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()], run_view_type=ViewType.ALL)
    return client, run


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory) -> Path:
    """The outputs folder of a fit of EPOCHS epochs that nothing stopped; its checkpoints in outputs/checkpoints."""
    outputs = tmp_path_factory.mktemp("never-stopped")
    result = run_module("scripts.train", *fit(outputs, outputs / "checkpoints"))
    assert result.returncode == 0, result.stderr[-3000:]
    return outputs


@pytest.mark.slow
def test_last_is_the_final_epoch_and_best_the_lowest_val_loss(never_stopped):
    last = load(never_stopped / "checkpoints" / "last.ckpt")
    assert (last["epoch"], last["global_step"]) == (EPOCHS - 1, EPOCHS * STEPS)
    client, run = the_run(never_stopped)
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val_loss")}
    best = load(never_stopped / "checkpoints" / "best.ckpt")
    assert best["epoch"] == min(history, key=history.get)


def stop_by_signal(args: list[str], folder: Path, stop: signal.Signals) -> None:
    """Runs `python -m scripts.train ARGS` and sends it `stop` some way into an epoch after the third."""
    process = warm_launcher.start("scripts.train", args, REPO)
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


@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS)
def test_a_fit_stopped_and_started_again_ends_as_one_that_never_stopped_with_every_metric_once(
    never_stopped, tmp_path, stop
):
    folder = tmp_path / "checkpoints"  # an Azure ML job's rw_mount output: it outlives the process and the node
    if stop in ("sigterm", "sigkill"):
        stop_by_signal(fit(tmp_path, folder), folder, signal.SIGTERM if stop == "sigterm" else signal.SIGKILL)
    else:
        killer = f"[{{class_path: tests.stopping.KillAt, init_args: {{hook: {stop}, epoch: 3}}}}]"
        killed = run_module("scripts.train", *fit(tmp_path, folder), "--trainer.callbacks", killer, timeout=300)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    stopped = load(folder / "last.ckpt")
    assert 2 <= stopped["epoch"] < EPOCHS - 1
    assert stopped["global_step"] == (stopped["epoch"] + 1) * STEPS  # an epoch's end, not a step within one

    again = run_module("scripts.train", *fit(tmp_path, folder))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {folder / 'last.ckpt'}" in again.stdout
    final, expected = load(folder / "last.ckpt"), load(never_stopped / "checkpoints" / "last.ckpt")
    assert final["global_step"] == expected["global_step"]
    for name, weights in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][name], weights), name  # bit for bit on the CPU

    client, run = the_run(tmp_path)  # one run, continued
    assert run.info.status == "FINISHED"
    for metric in ("val_loss", "val_acc", "train_loss", "train_acc", "train_samples_per_sec"):
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, metric))
        assert steps == list(range(EPOCHS)), metric  # every epoch's, none lost at the stop, none logged twice


def random_fit(task: str, tmp_path: Path) -> list[str]:
    """A fit of 3 epochs that draws random numbers: dropout and MNIST's warps, or birds' shuffled order, random crops
    and flips in the main process (no DataLoader workers, which keep generators of their own)."""
    if task == "birds":
        data = bird_folders(tmp_path / "data", count=4)
        options = ["--config", "configs/birds.yaml", "--data.init_args.data_dir", str(data),
                   "--data.init_args.batch_size", "2", "--data.init_args.image_size", "32",
                   "--data.init_args.num_workers", "0"]  # fmt: skip
    else:
        options = ["--config", "configs/mnist.yaml", "--data.init_args.data_dir", str(MNIST),
                   "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1"]  # fmt: skip
    return ["fit", *options, "--trainer.max_epochs", "3", "--trainer.logger", "false", "--test_after_fit", "false"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["birds", pytest.param("mnist", marks=needs_mnist)])
def test_a_fit_resumed_draws_the_random_numbers_one_never_stopped_does(tmp_path, task):
    """Killed at epoch 1's end and started again: the weights bit for bit those of a fit never stopped (the penguin
    recipe above draws no random numbers while it trains)."""
    args = random_fit(task, tmp_path)
    never = run_module("scripts.train", *args, "--checkpoint_dir", str(tmp_path / "never"))
    assert never.returncode == 0, never.stderr[-3000:]
    folder = tmp_path / "resumed"
    killer = "{class_path: tests.stopping.KillAt, init_args: {hook: on_train_epoch_end, epoch: 1}}"
    killed = run_module("scripts.train", *args, "--checkpoint_dir", str(folder), "--trainer.callbacks+", killer)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert load(folder / "last.ckpt")["epoch"] == 0
    again = run_module("scripts.train", *args, "--checkpoint_dir", str(folder))
    assert again.returncode == 0, again.stderr[-3000:]
    final, expected = load(folder / "last.ckpt"), load(tmp_path / "never" / "last.ckpt")
    assert final["global_step"] == expected["global_step"]
    for name, weights in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][name], weights), name


@pytest.mark.slow
def test_ctrl_c_exits_130_and_ends_the_run_as_killed(tmp_path):
    folder = tmp_path / "checkpoints"
    process = warm_launcher.start("scripts.train", fit(tmp_path, folder), REPO)
    try:
        deadline = time.monotonic() + 120
        while epoch_of(folder / "last.ckpt") < 0:
            assert time.monotonic() < deadline and process.poll() is None, "no epoch finished"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert "Traceback" not in stderr
    _, run = the_run(tmp_path)
    assert run.info.status == "KILLED"
