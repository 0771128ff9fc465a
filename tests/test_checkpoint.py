"""best.ckpt and last.ckpt (ModelCheckpoint twice: scripts/training/checkpoints.py) through the CLI: last.ckpt
is the end of every finished epoch, also after SIGTERM or SIGKILL; a fit started again with its --checkpoint_dir
resumes bit for bit and goes on in its MLflow run, every epoch's metrics there once, as a preempted Azure ML job
restarted with the same command; a resume with another config than the checkpoint's stops before it touches anything;
a fit that diverges, or is stopped with Ctrl-C, ends with a run record that says so."""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient

from tests.conftest import MNIST, REPO, bird_folders, needs_mnist, run_module

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


@pytest.mark.parametrize("task", ["birds", pytest.param("mnist", marks=needs_mnist)])
def test_a_fit_resumed_draws_the_random_numbers_one_never_stopped_does(tmp_path, task):
    """Killed at epoch 1's end and started again: the weights bit for bit those of a fit never stopped (the penguin
    recipe above draws no random numbers while it trains)."""
    args = random_fit(task, tmp_path)
    never = run_module("scripts.train", *args, "--checkpoint_dir", str(tmp_path / "never"))
    assert never.returncode == 0, never.stderr[-3000:]
    folder = tmp_path / "resumed"
    killer = "{class_path: tests.stopping.KillAt, init_args: {hook: on_train_epoch_end, epoch: 1}}"
    command = [sys.executable, "-m", "scripts.train", *args, "--checkpoint_dir", str(folder)]
    killed = subprocess.run([*command, "--trainer.callbacks+", killer], cwd=REPO, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert load(folder / "last.ckpt")["epoch"] == 0
    again = run_module("scripts.train", *args, "--checkpoint_dir", str(folder))
    assert again.returncode == 0, again.stderr[-3000:]
    final, expected = load(folder / "last.ckpt"), load(tmp_path / "never" / "last.ckpt")
    assert final["global_step"] == expected["global_step"]
    for name, weights in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][name], weights), name


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
    (["--trainer.max_epochs", "1"],
     "--trainer.max_epochs 1: {last} has trained 2 epochs already (its config: 2); give 2 or more, or a new "
     "--checkpoint_dir to train anew"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "line"), CHANGED, ids=["lr", "width", "other-task", "fewer-epochs"])
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


def test_ctrl_c_exits_130_and_ends_the_run_as_killed(tmp_path):
    folder = tmp_path / "checkpoints"
    process = subprocess.Popen(
        [sys.executable, "-m", "scripts.train", *fit(tmp_path, folder)], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
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
    ((_, status, _, _),) = snapshot(tmp_path)[1]
    assert status == "KILLED"
