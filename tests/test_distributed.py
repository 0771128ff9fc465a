"""Several CPU processes: DDP (gloo) started by Lightning itself, by torchrun and by mpirun (Horovod:
tests/horovod/), two torchrun "nodes" on loopback; each the same command as one process. Birds and MNIST: each rank
reads its own share. torchrun itself is forked from the tests' warm launcher (tests/warm_launcher.py), as run_module
forks it; the processes it starts, mpirun's and Lightning's are fresh interpreters.

Two processes with batch 10 each take, step for step, the rows one process takes with batch 20 (rank r gets
rows r, r+2, ... of the same seeded permutation) and average their gradients: the weights must match.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from tests import warm_launcher
from tests.conftest import (
    DDP_EPOCHS,
    MNIST,
    REPO,
    assert_same_training,
    bird_folders,
    free_port,
    last_checkpoint,
    mpirun,
    needs_mnist,
    own_tmpdir,
    penguin_fit,
    run_module,
    write_images,
)
from tests.preemption import rank_processes, signal_pids, wait_all, wait_for_epoch

pytestmark = pytest.mark.slow

DDP = ["--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", "2"]


def test_two_processes_of_batch_10_train_the_weights_one_process_of_batch_20_does(tmp_path, one_process):
    args = penguin_fit(tmp_path, *DDP, "--data.init_args.batch_size", "10", "--test_after_fit", "false")
    ddp = run_module("scripts.train", *args)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "Starting with 2 processes" in ddp.stderr
    assert_same_training(one_process, last_checkpoint(tmp_path))


def test_torchrun_starts_the_same_command_with_one_run_one_set_of_files_one_report(tmp_path):
    outputs = tmp_path / "outputs"
    args = ["--standalone", "--nproc_per_node", "2", "-m", "scripts.train", *penguin_fit(outputs, *DDP)]
    result = run_module("torch.distributed.run", *args, env=own_tmpdir(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in result.stderr
    assert list((tmp_path / "tmp").glob("torchelastic_*"))  # torchrun's log folder: the test's, not left in /tmp
    assert "is deprecated" not in result.stderr  # torch's all_gather warning, once per process (metric syncs)
    assert len(re.findall(r"^test_acc: ", result.stdout, re.M)) == 1  # printed by rank 0 alone
    assert len(re.findall(r"^best checkpoint: ", result.stdout, re.M)) == 1
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "penguins"]
    (run,) = client.search_runs([experiment.experiment_id])  # one run, not one per process
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == list(range(DDP_EPOCHS))
    assert run.data.params["trainer.strategy"] == "ddp"
    (run_dir,) = outputs.glob("*/*/checkpoints")
    assert sorted(p.name for p in run_dir.iterdir()) == ["best.ckpt", "last.ckpt"]


MPI = ["--config", "configs/trainer/ddp_mpi.yaml", "--trainer.accelerator", "cpu"]


def test_mpirun_processes_find_each_other_and_train_as_one(tmp_path, one_process):
    args = penguin_fit(tmp_path, *MPI, "--trainer.devices", "2", "--data.init_args.batch_size", "10")
    result = mpirun(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in result.stderr
    assert "is deprecated" not in result.stderr  # torch's all_gather warning, once per process (metric syncs)
    assert len(re.findall(r"^test_acc: ", result.stdout, re.M)) == 1
    assert_same_training(one_process, last_checkpoint(tmp_path))


def test_mpirun_with_other_devices_than_processes_is_one_line(tmp_path):
    result = mpirun(*penguin_fit(tmp_path, *MPI, "--trainer.devices", "1"))
    assert result.returncode != 0
    assert (
        "error: mpirun started 2 processes, 2 on this node, but the Trainer has devices 1 x num_nodes 1: "
        "give --trainer.devices 2 --trainer.num_nodes 1"
    ) in result.stderr.splitlines()
    assert "Traceback" not in result.stderr


def test_birds_dataloaders_are_sharded_by_lightning_under_ddp(tmp_path):
    """Birds read a folder through DataLoaders (Lightning gives them a DistributedSampler), not in-memory batches."""
    data = bird_folders(tmp_path / "data", count=8)
    args = [
        "fit", "--config", "configs/birds.yaml", *DDP, "--trainer.max_epochs", "1",
        "--trainer.default_root_dir", str(tmp_path / "outputs"), "--data.init_args.data_dir", str(data),
        "--data.init_args.batch_size", "4", "--data.init_args.num_workers", "0",
    ]  # fmt: skip
    result = run_module("scripts.train", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Starting with 2 processes" in result.stderr
    assert len(re.findall(r"^test_acc: ", result.stdout, re.M)) == 1
    (run_dir,) = (tmp_path / "outputs").glob("*/*/checkpoints")
    # 16 training images, batch 4, 2 processes: 2 steps an epoch (4 if each process read every image).
    assert torch.load(run_dir / "last.ckpt", weights_only=False)["global_step"] == 2
    # The evaluation report counts the whole test split (val/ stands in: 16 images) once: both shares, not rank 0's.
    rows = list(csv.DictReader((run_dir.parent / "evaluation" / "per_class.csv").read_text().splitlines()))
    assert [row["class"] for row in rows] == ["chickens", "turkeys"]
    assert sum(int(row["support"]) for row in rows) == 16
    assert (run_dir.parent / "evaluation" / "most_confident_mistakes.png").is_file()
    assert len(re.findall(r"^evaluation: ", result.stdout, re.M)) == 1


@needs_mnist
def test_mnist_in_memory_batches_are_sharded_by_rank_under_ddp(tmp_path):
    """MNIST's batches are slices of tensors (no DataLoader for Lightning to shard): each rank takes its own half."""
    args = [
        "fit", "--config", "configs/mnist.yaml", *DDP, "--trainer.max_epochs", "1",
        "--trainer.default_root_dir", str(tmp_path), "--data.init_args.data_dir", str(MNIST),
        "--trainer.limit_train_batches", "0.05", "--trainer.limit_val_batches", "0.05",
        "--trainer.limit_test_batches", "0.05",
    ]  # fmt: skip
    result = run_module("scripts.train", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(re.findall(r"^test_acc: ", result.stdout, re.M)) == 1
    # 55,000 training images, batch 128: 215 batches a rank on 2 processes (430 in one); 5% of them is 10 steps.
    assert last_checkpoint(tmp_path)["global_step"] == 10


def test_two_nodes_under_torchrun_train_as_one_and_only_the_first_node_writes(tmp_path, one_process):
    """Two torchrun "nodes" on loopback, one process each, each with its own disk (default_root_dir), as in a
    cluster: the global rank 0 writes checkpoints and the MLflow run, not every node's local rank 0."""
    port = free_port()
    nodes = []
    for node_rank in (0, 1):
        args = [
            "--nnodes", "2", "--node_rank", str(node_rank), "--nproc_per_node", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "scripts.train",
            *penguin_fit(tmp_path / f"node{node_rank}", *DDP, "--data.init_args.batch_size", "10"),
            "--trainer.devices", "1", "--trainer.num_nodes", "2",
        ]  # fmt: skip
        nodes.append(warm_launcher.start("torch.distributed.run", args, REPO, own_tmpdir(tmp_path)))
    (out0, err0), (out1, err1) = (node.communicate(timeout=600) for node in nodes)
    assert nodes[0].returncode == nodes[1].returncode == 0, (err0 + err1)[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in err1
    assert re.findall(r"^test_acc: ", out0 + out1, re.M) == ["test_acc: "]
    assert_same_training(one_process, last_checkpoint(tmp_path / "node0"))
    assert list((tmp_path / "node1").glob("*/*/checkpoints/*")) == []
    client = MlflowClient(f"sqlite:///{tmp_path / 'node0' / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "penguins"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.params["trainer.num_nodes"] == "2"
    assert not any((tmp_path / "node1").glob("*/*/config.yaml")), "node 1 wrote the run's config"
    # Every process opens the sqlite store once (under a lock: processes of one node raced to create its tables);
    # node 1's stays empty.
    idle = MlflowClient(f"sqlite:///{tmp_path / 'node1' / 'mlflow.db'}")
    assert idle.search_runs([e.experiment_id for e in idle.search_experiments()]) == []


def validation_metrics(outputs: Path) -> dict[str, float]:
    """val_loss and val_acc of the one `validate` run under `outputs`."""
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {key: run.data.metrics[key] for key in ("val_loss", "val_acc")}


@pytest.mark.parametrize("task", ["penguins", "birds"])
def test_evaluation_on_two_processes_counts_every_item_once(tmp_path, task):
    """An odd number of validation items (penguins 45 rows in memory, birds 5 images through a DataLoader) on 2
    processes: the metrics must be those of one process, not of a split padded with a repeated item."""
    options = ["--config", f"configs/{task}.yaml"]
    if task == "birds":
        data = bird_folders(tmp_path / "data", splits=("train",), count=4)
        write_images(data / "val" / "chickens", 3, channel=0, start=10)
        write_images(data / "val" / "turkeys", 2, channel=1, start=10)
        options += ["--data.init_args.data_dir", str(data), "--data.init_args.image_size", "32",
                    "--data.init_args.num_workers", "0", "--data.init_args.batch_size", "2"]  # fmt: skip
    fitted = run_module("scripts.train", "fit", *options, "--trainer.max_epochs", "2", "--test_after_fit", "false",
                        "--trainer.default_root_dir", str(tmp_path / "fit"))  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    (checkpoint,) = (tmp_path / "fit").glob("*/*/checkpoints/last.ckpt")
    metrics = {}
    for processes, extra in (("one", []), ("two", DDP)):
        outputs = tmp_path / processes
        result = run_module("scripts.train", "validate", *options, *extra, "--ckpt_path", str(checkpoint),
                            "--trainer.default_root_dir", str(outputs))  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        metrics[processes] = validation_metrics(outputs)
    assert metrics["two"] == pytest.approx(metrics["one"], abs=1e-6)


def preemptible_fit(outputs: Path, *args: str) -> list[str]:
    """A fit long enough to be signalled in its middle: 12 epochs of 30 steps a process (batch 4), last.ckpt in
    outputs/checkpoints."""
    return [
        "fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "12", "--data.init_args.batch_size", "4",
        "--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false", "--test_after_fit", "false",
        "--trainer.default_root_dir", str(outputs), "--checkpoint_dir", str(outputs / "checkpoints"), *args,
    ]  # fmt: skip


def preempt_rank_0(launcher, outputs: Path, rank_variable: str) -> int:
    """Sends SIGTERM to the process of rank 0 alone of `launcher` (a launcher of 2 processes, started) once a third
    epoch is saved; the launcher, so every process, must end within GRACE_S, last.ckpt at an epoch's end. Returns
    the launcher's status."""
    last = outputs / "checkpoints" / "last.ckpt"
    wait_for_epoch(last, 2, [launcher])
    ranks = rank_processes(launcher, rank_variable, 2)
    (status,) = wait_all([launcher], signal_pids([ranks[0]]))
    stopped = torch.load(last, weights_only=False)
    assert 2 <= stopped["epoch"] < 11 and stopped["global_step"] == (stopped["epoch"] + 1) * 30  # an epoch's end
    return status


def test_sigterm_to_one_process_under_torchrun_ends_every_process_with_143_at_an_epoch_end(tmp_path):
    """Rank 0 alone signalled: rank 1 must stop with it, at the same epoch's end, before torchrun's own SIGTERM to
    the survivors. (Every process signalled: tests/test_azure_world.py, where a job's processes have no launcher.)"""
    args = ["--standalone", "--nproc_per_node", "2", "-m", "scripts.train", *preemptible_fit(tmp_path / "o", *DDP)]
    torchrun = warm_launcher.start("torch.distributed.run", args, REPO, own_tmpdir(tmp_path))
    status = preempt_rank_0(torchrun, tmp_path / "o", "RANK")
    output = "\n".join(torchrun.communicate())
    # torchrun reports each process that failed: both, each with 143, none killed by torchrun's own SIGTERM (-15).
    assert re.findall(r"^\s+exitcode\s+: (-?\d+)", output, re.M) == ["143", "143"], output[-3000:]
    assert status == 1, output[-3000:]  # torchrun's, for failed processes


def test_sigterm_to_one_process_under_mpirun_ends_every_process_with_143_at_an_epoch_end(tmp_path):
    """Rank 0 alone signalled. (Every process and mpirun signalled, as Azure ML preempts: the test below.)"""
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun (apt-get install openmpi-bin; .ci/run installs it)")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    command = ["mpirun", "--oversubscribe", "-np", "2", sys.executable, "-m", "scripts.train"]
    command += preemptible_fit(tmp_path / "o", *MPI, "--trainer.devices", "2")
    with open(tmp_path / "launcher.log", "w") as out:  # a file, not a pipe nobody reads while it runs
        mpirun = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    status = preempt_rank_0(mpirun, tmp_path / "o", "OMPI_COMM_WORLD_RANK")
    output = (tmp_path / "launcher.log").read_text()
    # mpirun reports the first process that failed and exits with its status; it would have killed the others.
    assert re.search(r"Exit code:\s+143\b", output) and status == 143, output[-3000:]


def test_sigterm_to_mpirun_and_its_processes_ends_each_with_143_given_the_jobs_grace(tmp_path):
    """Azure ML's preemption signals the job's mpirun too: with the grace scripts.submit gives `mpi` jobs
    (scripts/azure_ml/jobs.py MPI_STOP_GRACE), mpirun's own SIGKILL comes after the processes have stopped at a batch,
    each with 143 (a shell around each process records its status: mpirun reports its own). mpirun's SIGTERM, one
    grace before its SIGKILL, finds them stopped or stopping (a second SIGTERM changes nothing); the shell outlives
    it as the process it wraps would (`trap`: else a loaded machine's slower stop, ~9 s at load 6, lost the status)."""
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun (apt-get install openmpi-bin; .ci/run installs it)")
    grace = {"OMPI_MCA_odls_base_sigkill_timeout": "10"}  # seconds between mpirun's SIGTERM and its SIGKILL
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **grace}
    outputs, statuses = tmp_path / "o", tmp_path / "statuses"
    fit = shlex.join([sys.executable, "-m", "scripts.train", *preemptible_fit(outputs, *MPI, "--trainer.devices", "2")])
    command = ["mpirun", "--oversubscribe", "-np", "2", "sh", "-c", f"trap : TERM; {fit}; echo $? >> {statuses}"]
    outputs.mkdir(parents=True)
    with open(tmp_path / "launcher.log", "w") as out:
        launcher = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    last = outputs / "checkpoints" / "last.ckpt"
    wait_for_epoch(last, 2, [launcher])
    ranks = rank_processes(launcher, "OMPI_COMM_WORLD_RANK", 2)
    sent = signal_pids([launcher.pid, *ranks.values()])
    wait_all([launcher], sent)  # mpirun waits out its grace twice (10 s each), within the 30 s
    recorded = statuses.read_text().split() if statuses.is_file() else []  # a shell killed records none
    assert recorded == ["143", "143"], (tmp_path / "launcher.log").read_text()[-3000:]
    stopped = torch.load(last, weights_only=False)
    assert stopped["global_step"] == (stopped["epoch"] + 1) * 30  # an epoch's end


@pytest.mark.parametrize("task", ["birds", pytest.param("mnist", marks=needs_mnist)])
def test_fewer_validation_items_than_processes_is_one_line_on_every_process(tmp_path, task):
    """2 validation items (birds: an image of each class read through a DataLoader; MNIST: rows of in-memory tensors)
    on 3 processes: one of them would have nothing to evaluate, and Lightning stopped each with a traceback."""
    if task == "birds":
        data = bird_folders(tmp_path / "data", splits=("train",), count=2)
        write_images(data / "val" / "chickens", 1, channel=0, start=10)
        write_images(data / "val" / "turkeys", 1, channel=1, start=10)
        options = ["--config", "configs/birds.yaml", "--data.init_args.data_dir", str(data),
                   "--data.init_args.image_size", "32", "--data.init_args.num_workers", "0"]  # fmt: skip
    else:
        options = ["--config", "configs/mnist.yaml", "--data.init_args.data_dir", str(MNIST),
                   "--data.init_args.val_size", "1"]  # fmt: skip  # ~1 of 60,000 by hash: here 1 or 2, one at least
    fit = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--test_after_fit", "false"]
    # No progress bar: rank 0's line would follow its "Sanity Checking" on the same line.
    outputs = ["--trainer.default_root_dir", str(tmp_path / "o"), "--trainer.enable_progress_bar", "false"]
    # A process of its own, not the warm launcher's, whose output is read when rank 0 ends: ranks 1 and 2, which
    # Lightning started, may write their line after that; a pipe is read until every process has closed it.
    command = [sys.executable, "-m", "scripts.train", "fit", *options, *DDP, "--trainer.devices", "3", *fit, *outputs]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    line = (
        r"error: val split: (\d) items? for 3 processes, each of which evaluates its own share \(one item at least\); "
        r"give the val split 3 items or more, or run on \1 process(es)? \(--trainer.devices, --trainer.num_nodes\)"
    )
    # Every rank's: counted in the text, not by lines, since three processes writing to one pipe may interleave a
    # line's end (sys.exit writes its message, then the newline).
    found = re.findall(line, result.stderr)
    assert len(found) == 3 and found[0][0] in "12" and len(set(found)) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_a_bad_row_on_one_node_s_disk_ends_every_process_with_that_node_s_line(tmp_path):
    """Two torchrun "nodes", each reading penguins.csv from its own disk (its working folder), node 1's with a bad
    value: node 0 failed in its next collective with gloo's "Connection closed by peer" traceback, naming no cause."""
    from palmerpenguins import load_penguins

    port = free_port()
    table = load_penguins()
    nodes = []
    for node_rank in (0, 1):
        disk = tmp_path / f"node{node_rank}"
        disk.mkdir()
        rows = table.astype({"bill_length_mm": object})
        if node_rank == 1:
            rows.loc[5, "bill_length_mm"] = "abc"  # line 7 of the file
        rows.to_csv(disk / "penguins.csv", index=False)
        args = [
            "--nnodes", "2", "--node_rank", str(node_rank), "--nproc_per_node", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "scripts.train",
            *penguin_fit(disk, "--config", str(REPO / "configs/trainer/ddp.yaml"), "--trainer.accelerator", "cpu"),
            "--trainer.devices", "1", "--trainer.num_nodes", "2", "--data.init_args.csv_path", "penguins.csv",
        ]  # fmt: skip
        args[args.index("configs/penguins.yaml")] = str(REPO / "configs/penguins.yaml")
        env = {**own_tmpdir(tmp_path), "PYTHONPATH": str(REPO)}
        nodes.append(warm_launcher.start("torch.distributed.run", args, disk, env))
    (_, err0), (_, err1) = (node.communicate(timeout=600) for node in nodes)
    assert nodes[0].returncode != 0 and nodes[1].returncode != 0
    [own] = [line for line in err1.splitlines() if line.startswith("error: ")]
    assert "penguins.csv" in own and "line 7" in own, err1[-3000:]
    lines = [line for line in err0.splitlines() if line.startswith("error: ")]
    assert lines == [
        f"error: rank 1: {own[len('error: ') :]} (this process stopped with it: the processes train together)"
    ], err0[-3000:]
    process = err0.split("failed (exitcode")[0]  # torchrun's own report of a failed process follows, traceback and all
    assert "Connection closed by peer" not in process and "Traceback" not in process
