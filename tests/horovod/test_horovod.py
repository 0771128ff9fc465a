"""Horovod for Lightning 2.x (strategies/horovod/) on CPUs: processes horovodrun starts (and plain mpirun, with
HOROVOD_CONTROLLER=gloo refused) train as one process of their combined batch, one MLflow run, one report; its
reductions, its refusals in one line, sharded DataLoaders and MNIST's channels-last network. Under plain mpirun as
Azure ML starts it: tests/test_azure_world.py.

    make horovod && .venv/bin/python -m pytest -q tests/horovod
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from tests.azure_world import LAUNCH_VARIABLES, node_checkouts
from tests.conftest import (
    DDP_EPOCHS,
    MNIST,
    REPO,
    assert_same_training,
    bird_folders,
    last_checkpoint,
    mpirun,
    needs_mnist,
    penguin_fit,
)
from tests.test_azure_world import assert_one_finished_run, checkpoints, fit, job_run

pytestmark = pytest.mark.slow


HOROVOD = ["--config", "configs/trainer/horovod.yaml"]


def needs_horovod() -> None:
    if importlib.util.find_spec("horovod") is None:
        pytest.skip("needs Horovod: make horovod (python -m scripts.build_horovod; .ci/run builds it)")


def horovodrun(*args: str, python: tuple[str, ...] = ("-m", "scripts.train"), timeout: float = 600):
    """`horovodrun -np 2 python -m scripts.train ARGS` (or `python PYTHON ARGS`) from the repository root."""
    needs_horovod()
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    launcher = [str(Path(sys.executable).parent / "horovodrun"), "-np", "2", "-H", "localhost:2"]
    command = [*launcher, sys.executable, *python, *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)


def test_horovod_processes_accumulating_two_batches_of_5_train_as_one_of_20_with_one_run_and_one_report(
    tmp_path, one_process
):
    """Lightning accumulates two backwards (each averaged over the processes at once) before a step: 2 processes x 2
    batches of 5 take, step for step, what one process of 20 does. (Without accumulation: under plain mpirun, in
    tests/test_azure_world.py.)"""
    outputs = tmp_path / "outputs"
    args = ["--trainer.devices", "2", "--data.init_args.batch_size", "5", "--trainer.accumulate_grad_batches", "2"]
    result = horovodrun(*penguin_fit(outputs, *HOROVOD, *args))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert len(re.findall(r"test_acc: ", result.stdout)) == 1  # rank 0 alone prints
    assert_same_training(one_process, last_checkpoint(outputs))
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "penguins"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == list(range(DDP_EPOCHS))


def test_horovod_built_for_cpus_refuses_gpus_in_one_line():
    needs_horovod()
    # In a process of its own: hvd.init() starts Horovod's background thread and MPI.
    code = (
        "import torch\n"
        "from strategies.horovod import HorovodStrategy\n"
        "HorovodStrategy(parallel_devices=[torch.device('cuda', 0)]).setup_environment()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert (
        "LaunchError: this Horovod is built for CPUs (no CUDA, no NCCL) but the Trainer runs on GPUs: "
        "give --trainer.accelerator cpu, or use DDP (configs/trainer/ddp.yaml) on GPUs"
    ) in result.stderr


def test_horovod_reduces_as_lightning_asks_mean_sum_max_min(tmp_path):
    """self.log(..., sync_dist=True, reduce_fx=...) and the callbacks' decisions come through strategy.reduce; a
    broadcast of what only the source has (`x if is_global_zero else None`, as Lightning's own code does) arrives."""
    code = (
        "import torch\n"
        "from strategies.horovod import HorovodStrategy\n"
        "strategy = HorovodStrategy()\n"
        "value = torch.tensor([strategy.global_rank + 1.0])  # 1 and 2\n"
        "ops = ['mean', 'sum', 'max', 'min', torch.distributed.ReduceOp.SUM]\n"
        "print(f'reduced {[strategy.reduce(value, reduce_op=op).item() for op in ops]}')\n"  # one write: see below
        "print(f'broadcast {strategy.broadcast(\"outputs/1/run\" if strategy.global_rank == 0 else None)}')\n"
    )
    result = horovodrun(python=("-c", code), timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    # mpirun tags each write of a rank ("[1,0]<stdout>:"); unbuffered (PYTHONUNBUFFERED, set on CI machines), print's
    # pieces are writes of their own, and tags of both ranks could split the line: so one string, one write, and
    # patterns that end where the string does.
    assert re.findall(r"broadcast (outputs/1/run|None)", result.stdout) == ["outputs/1/run"] * 2
    assert re.findall(r"reduced \[[^\]]*\]", result.stdout) == ["reduced [1.5, 3.0, 2.0, 1.0, 3.0]"] * 2


def test_horovod_with_other_devices_than_processes_is_one_line(tmp_path):
    result = horovodrun(*penguin_fit(tmp_path, *HOROVOD, "--trainer.devices", "1"))
    assert result.returncode != 0
    assert (
        "error: horovod started 2 processes, 2 on this node, but the Trainer has devices 1: give --trainer.devices 2"
        in (result.stdout + result.stderr)
    )


def test_processes_horovod_does_not_join_are_refused_not_trained_apart(tmp_path):
    """HOROVOD_CONTROLLER=gloo under plain mpirun: Horovod's gloo finds no rendezvous and makes each process a world
    of one, which with --trainer.devices 1 would train alone, two fits into one outputs folder."""
    needs_horovod()
    gloo = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
    result = mpirun(*penguin_fit(tmp_path, *HOROVOD, "--trainer.devices", "1"), forward=gloo)
    assert result.returncode != 0
    line = (
        "error: the launcher started 2 processes but Horovod joined 1: HOROVOD_CONTROLLER=gloo joins processes only "
        "under `horovodrun --gloo`, which starts gloo's rendezvous; unset it (and HOROVOD_CPU_OPERATIONS) under mpirun"
    )
    assert line in result.stderr.splitlines(), result.stderr[-3000:]  # the first to say it; mpirun stops the other
    assert "Traceback" not in result.stderr and not list(tmp_path.glob("*/*/checkpoints"))


def test_birds_dataloaders_are_sharded_under_horovod(tmp_path):
    """Horovod's ranks come from Horovod, not torch.distributed: Lightning's DistributedSampler must still shard."""
    data = bird_folders(tmp_path / "data", count=8)
    args = [
        "fit", "--config", "configs/birds.yaml", *HOROVOD, "--trainer.devices", "2", "--trainer.max_epochs", "1",
        "--trainer.default_root_dir", str(tmp_path / "outputs"), "--data.init_args.data_dir", str(data),
        "--data.init_args.batch_size", "4", "--data.init_args.num_workers", "0",
    ]  # fmt: skip
    result = horovodrun(*args)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert len(re.findall(r"test_acc: ", result.stdout)) == 1
    # 16 training images, batch 4, 2 processes: 2 steps an epoch (4 if each process read every image).
    assert last_checkpoint(tmp_path / "outputs")["global_step"] == 2


@needs_mnist
def test_horovod_trains_mnist_s_channels_last_network(tmp_path):
    """configs/mnist.yaml keeps its network channels-last; Horovod broadcasts and averages contiguous tensors only."""
    args = [
        "fit", "--config", "configs/mnist.yaml", *HOROVOD, "--trainer.devices", "2", "--trainer.max_epochs", "1",
        "--trainer.default_root_dir", str(tmp_path), "--data.init_args.data_dir", str(MNIST),
        "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
    ]  # fmt: skip
    result = horovodrun(*args)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert len(re.findall(r"test_acc: ", result.stdout)) == 1
    checkpoint = last_checkpoint(tmp_path)
    assert checkpoint["global_step"] == 4
    weights = [w for w in checkpoint["state_dict"].values() if w.dim() == 4 and w.shape[1] > 1]
    assert weights and all(w.is_contiguous(memory_format=torch.channels_last) for w in weights)  # trained as it is


def test_horovod_under_mpirun_with_a_folder_per_process_trains_as_one_tests_and_tracks_one_run(
    tmp_path, azure_tracking, one_process
):
    """Azure ML's `mpi` distribution starts Horovod with plain mpirun, no horovodrun; each process here runs in a
    folder of its own (one host, so Horovod sees one node of 2: Open MPI cannot make loopback two hosts). 2 processes
    of batch 10 take, step for step, what one process of 20 does."""
    if shutil.which("mpirun") is None or importlib.util.find_spec("horovod") is None:
        pytest.skip("needs Open MPI's mpirun and Horovod (make horovod; .ci/run installs both)")
    folders = node_checkouts(tmp_path, 2)
    run_id, tracking = job_run(azure_tracking, "horovod-folders")
    args = fit("--config", "configs/trainer/horovod.yaml", "--trainer.devices", "2")
    args += ["--data.init_args.batch_size", "10"]
    env = {key: value for key, value in os.environ.items() if not LAUNCH_VARIABLES.match(key)}
    env |= tracking | {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    command = ["mpirun", "--oversubscribe"]
    for i, folder in enumerate(folders):
        command += [*([":"] if i else []), "-np", "1", "-wdir", str(folder), sys.executable, "-m", "scripts.train"]
        command += args
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert len(re.findall(r"test_acc: ", result.stdout)) == 1
    assert checkpoints(folders[0]) == ["best.ckpt", "last.ckpt"] and checkpoints(folders[1]) == []
    assert_same_training(one_process, last_checkpoint(folders[0] / "outputs"))
    assert_one_finished_run(azure_tracking, run_id)
