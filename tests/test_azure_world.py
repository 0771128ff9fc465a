"""Jobs run as Azure ML runs them (tests/azure_world.py): nodes that share no disk, exactly Azure ML's launch
variables for the `pytorch` and `mpi` distributions, DDP (Horovod: tests/horovod/), and tracking that lacks what
Azure ML's lacks. Each job must exit 0 in every process, print `test_acc` once and leave one FINISHED MLflow run: the
job's own."""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from tests.azure_world import node_checkouts, run_job, start_job, wait_job
from tests.preemption import signal_pids, wait_all, wait_for_epoch

pytestmark = pytest.mark.slow

EPOCHS = 3
PRESETS = {"pytorch": "configs/trainer/ddp.yaml", "mpi": "configs/trainer/ddp_mpi.yaml"}


def fit(*args: str) -> list[str]:
    """Split seed 6: 240 training rows, which 2 processes of batch 10 take step for step as one of batch 20 does
    (tests/conftest.py penguin_fit)."""
    return ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", str(EPOCHS), "--data.init_args.seed",
            "6", *args]  # fmt: skip


def job_run(azure_tracking, experiment: str) -> tuple[str, dict]:
    """The run Azure ML creates for a job before it starts, and the variables that hand it to every process."""
    client = MlflowClient(azure_tracking.url)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run = client.create_run(experiment_id)
    variables = {
        "MLFLOW_TRACKING_URI": azure_tracking.url, "MLFLOW_RUN_ID": run.info.run_id,
        "MLFLOW_EXPERIMENT_ID": experiment_id, "MLFLOW_EXPERIMENT_NAME": experiment,
    }  # fmt: skip
    return run.info.run_id, variables


def checkpoints(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob("outputs/*/*/checkpoints/*.ckpt"))


def assert_one_finished_run(azure_tracking, run_id: str) -> None:
    client = MlflowClient(azure_tracking.url)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "val_loss")] == list(range(EPOCHS))
    assert "test_acc" in run.data.metrics
    experiment_runs = client.search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in experiment_runs] == [run_id]  # the job's run, no other


@pytest.mark.parametrize(
    ("distribution", "preset"), [("pytorch", "configs/trainer/ddp.yaml"), ("mpi", "configs/trainer/ddp_mpi.yaml")]
)
def test_two_nodes_that_share_no_disk_fit_test_and_track_one_run(tmp_path, azure_tracking, distribution, preset):
    folders = node_checkouts(tmp_path, 2)
    run_id, tracking = job_run(azure_tracking, f"two-nodes-{distribution}")
    args = fit("--config", preset, "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "2")
    processes = run_job(folders, distribution, 1, args, tracking)
    for process in processes:
        assert process.returncode == 0, f"node {process.node}: {process.stderr[-3000:]}"
    assert re.findall(r"^test_acc: ", "".join(p.stdout for p in processes), re.M) == ["test_acc: "]
    assert checkpoints(folders[0]) == ["best.ckpt", "last.ckpt"]  # global rank 0 writes, on its own disk
    assert checkpoints(folders[1]) == []
    assert_one_finished_run(azure_tracking, run_id)


def test_two_processes_on_each_of_two_nodes_take_their_ranks_from_azure_variables(tmp_path, azure_tracking):
    folders = node_checkouts(tmp_path, 2)
    run_id, tracking = job_run(azure_tracking, "two-by-two")
    args = fit("--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", "2",
               "--trainer.num_nodes", "2", "--data.init_args.batch_size", "5")  # fmt: skip
    processes = run_job(folders, "pytorch", 2, args, tracking)
    for process in processes:
        assert process.returncode == 0, f"node {process.node}: {process.stderr[-3000:]}"
    stderr = "".join(p.stderr for p in processes)
    for rank in range(4):
        assert f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/4" in stderr
    assert checkpoints(folders[1]) == []
    last = torch.load(next(folders[0].glob("outputs/*/*/checkpoints/last.ckpt")), weights_only=False)
    assert last["global_step"] == 12 * EPOCHS  # 235 rows, 4 processes of batch 5 (59 each): 12 steps an epoch
    assert_one_finished_run(azure_tracking, run_id)


def test_devices_that_disagree_with_the_processes_azure_started_is_one_line(tmp_path):
    folders = node_checkouts(tmp_path, 1)
    args = fit("--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", "1")
    processes = run_job(folders, "pytorch", 2, args)
    for process in processes:
        assert process.returncode == 1
        assert process.stderr.strip().splitlines()[-1] == (
            "error: the launcher started 2 processes (WORLD_SIZE), but the Trainer has devices 1 x num_nodes 1: "
            "give --trainer.devices 2 --trainer.num_nodes 1 (devices: processes per node)"
        )
        assert "Traceback" not in process.stderr


# extra: serving
def test_a_model_dir_that_rank_0_refuses_stops_every_process_in_one_line(tmp_path):
    """Rank 0 alone saves the model, so it alone checks --model_dir; the job's other processes must stop with it, not
    wait for it until torch.distributed's timeout (30 minutes). Nothing of the user's is touched."""
    (folder,) = node_checkouts(tmp_path, 1)
    (folder / "mine").mkdir()
    (folder / "mine" / "notes.txt").write_text("mine")
    args = fit("--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", "2",
               "--model_dir", "mine")  # fmt: skip
    for process in wait_job(start_job([folder], "pytorch", 2, args), timeout_s=300):
        assert process.returncode == 1, f"rank {process.local_rank}: {process.stderr[-3000:]}"
        assert process.stderr.strip().splitlines()[-1] == (
            "error: --model_dir mine: neither empty nor an MLflow model's folder; give a new or empty one (nothing in "
            "it is replaced)"
        )
    assert [path.name for path in (folder / "mine").iterdir()] == ["notes.txt"]
    assert not list(folder.glob("outputs/*/*/config.yaml"))


# end extra: serving


# extra: serving
def test_register_model_against_azure_like_tracking_loads_back_and_predicts_as_the_checkpoint(tmp_path, azure_tracking):
    import mlflow
    import numpy as np
    import pandas as pd

    from datamodules.penguins import PenguinDataModule
    from datamodules.preprocessing.penguins import ISLANDS
    from lightning_modules.classifier import ClassificationModule

    (job_folder,) = node_checkouts(tmp_path, 1)
    run_id, tracking = job_run(azure_tracking, "register")
    name = f"penguins-azure-{run_id[:8]}"
    refused_before = len(azure_tracking.refused)
    (process,) = run_job([job_folder], "pytorch", 1, fit("--register_model", name), tracking)
    assert process.returncode == 0, process.stderr[-3000:]
    assert f"registered model: {name} version 1" in process.stdout
    assert "Traceback" not in process.stderr
    assert azure_tracking.refused[refused_before:] == []  # nothing asked of what Azure ML lacks
    assert_one_finished_run(azure_tracking, run_id)

    client = MlflowClient(azure_tracking.url)
    (version,) = client.search_model_versions(f"name = '{name}'")
    assert version.run_id == run_id
    mlflow.set_tracking_uri(azure_tracking.url)
    (loaded := tmp_path / "loaded").mkdir()  # without dst_path MLflow downloads into a /tmp folder it never removes
    try:
        registered = mlflow.pyfunc.load_model(f"models:/{name}/1", dst_path=str(loaded))
        folder = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/1", dst_path=str(tmp_path / "model")))
    finally:
        mlflow.set_tracking_uri(None)
    assert registered.metadata.metadata["class_names"] == PenguinDataModule.class_names
    data = PenguinDataModule()
    data.setup("test")
    inputs, raw = data.splits["test"][0][:13], data.raw["test"][0][:13]
    (best,) = job_folder.glob("outputs/*/*/checkpoints/best.ckpt")
    network = ClassificationModule.load_from_checkpoint(best, map_location="cpu").network.eval()
    program = torch.export.load(folder / "artifacts" / "model.pt2").module()  # the torch program beside the ONNX
    with torch.no_grad():
        logits = network(inputs)
        assert torch.allclose(program(inputs), logits, atol=1e-6)
    rows = pd.DataFrame(raw.numpy()[:, 1:], columns=["bill_length_mm", "bill_depth_mm", "flipper_length_mm",
                                                     "body_mass_g"])  # fmt: skip
    rows.insert(0, "island", [ISLANDS[int(i)] for i in raw[:, 0]])
    answers = registered.predict(rows)  # raw rows in, as a deployment gets them
    assert answers["class"].tolist() == [PenguinDataModule.class_names[i] for i in logits.argmax(1).tolist()]
    assert np.allclose(answers["probability"], torch.softmax(logits, 1).max(1).values.numpy(), atol=1e-5)


# end extra: serving


def test_two_nodes_resume_from_a_checkpoint_only_the_first_node_has(tmp_path):
    """A job started again (preempted, or a longer run) with the last.ckpt of global rank 0's disk: node 1 never had
    it, yet every process must start from it. Found by --checkpoint_dir, a folder of each node's own disk, only rank 0
    would resume and the job hang: one line in every process instead, naming --ckpt_path, which works. A --ckpt_path
    that no node has, or model options other than its own (which only rank 0 can read), is one line in every process
    too."""
    folders = node_checkouts(tmp_path, 2)
    ddp = ["--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", "1"]
    ddp += ["--trainer.num_nodes", "2", "--test_after_fit", "false", "--checkpoint_dir", "ckpt"]
    first = run_job(folders, "pytorch", 1, fit(*ddp, "--trainer.max_epochs", "2"))
    assert [p.returncode for p in first] == [0, 0], first[1].stderr[-3000:]
    last = folders[0] / "ckpt" / "last.ckpt"
    assert not (folders[1] / "ckpt" / "last.ckpt").exists()
    found_by_one = wait_job(start_job(folders, "pytorch", 1, fit(*ddp)), timeout_s=300)
    for process in found_by_one:
        assert process.returncode == 1, f"node {process.node}: {process.stderr[-3000:]}"
        assert process.stderr.strip().splitlines()[-1] == (
            "error: --checkpoint_dir ckpt: the processes of rank(s) 0 find ckpt/last.ckpt to resume from, those of "
            "rank(s) 1 do not (nodes that share no disk); give a --checkpoint_dir that every node sees (on Azure ML, "
            "scripts.submit's checkpoints output), or resume with --ckpt_path ckpt/last.ckpt, which rank 0 reads for "
            "every process"
        )
    assert torch.load(last, weights_only=False)["global_step"] == 6 * 2  # untouched
    runs = sorted(folders[0].glob("outputs/*/*"))
    # A --ckpt_path that is not there: rank 0 alone can tell, and the others must not wait for it in vain.
    mistyped = wait_job(start_job(folders, "pytorch", 1, fit(*ddp, "--ckpt_path", "ckpt/lats.ckpt")), timeout_s=300)
    for process in mistyped:
        assert process.returncode == 1, f"node {process.node}: {process.stderr[-3000:]}"
        assert process.stderr.strip().splitlines()[-1] == (
            "error: ckpt/lats.ckpt: no such checkpoint; give --ckpt_path a .ckpt that fit wrote "
            "(outputs/<exp>/<run>/checkpoints/)"
        )
    assert sorted(folders[0].glob("outputs/*/*")) == runs  # no record of a run that never started
    # An outputs folder that one node alone cannot write stops its process before the processes meet: the other one
    # waited for it in torch.distributed's rendezvous for 30 minutes. Node 1's, then node 0's (whose address the
    # rendezvous is at).
    refused = "--trainer.default_root_dir out: a file, not a folder; give a folder, or a path that does not exist yet"
    for node in (1, 0):
        (folders[node] / "out").write_text("mine")
        started = time.monotonic()
        processes = wait_job(start_job(folders, "pytorch", 1, fit(*ddp, "--trainer.default_root_dir", "out")), 120)
        assert time.monotonic() - started < 60
        for process in processes:
            assert process.returncode == 1, f"node {process.node}: {process.stderr[-3000:]}"
            assert "Traceback" not in process.stderr, process.stderr[-3000:]
        lines = [process.stderr.strip().splitlines()[-1] for process in processes]
        told = f"error: rank {node}: {refused} (this process stopped with it: the processes train together)"
        assert lines == ([told, f"error: {refused}"] if node else [f"error: {refused}", told])
        assert (folders[node] / "out").read_text() == "mine"
        assert not list(folders[1 - node].glob("out/*/*"))  # no run: the other process stopped before it started
        shutil.rmtree(folders[1 - node] / "out", ignore_errors=True)
        (folders[node] / "out").unlink()
    # A crash, not a mistake of the user's, on node 1 alone before the processes meet: its traceback, and node 0 ends
    # with its last line, not after 30 minutes. (A callback that node 1's copy of the code alone cannot build.)
    (folders[0] / "crash.py").write_text("import lightning as L\n\n\nclass Crash(L.Callback):\n    pass\n")
    (folders[1] / "crash.py").write_text(
        "import lightning as L\n\n\nclass Crash(L.Callback):\n    def __init__(self):\n"
        "        raise RuntimeError('this node has no GPU driver')\n"
    )
    crashed = wait_job(start_job(folders, "pytorch", 1, fit(*ddp, "--trainer.callbacks+", "crash.Crash")), 120)
    assert [process.returncode for process in crashed] == [1, 1], crashed[0].stderr[-3000:]
    assert "Traceback" in crashed[1].stderr and "Traceback" not in crashed[0].stderr, crashed[0].stderr[-3000:]
    assert crashed[0].stderr.strip().splitlines()[-1] == (
        "error: rank 1: RuntimeError: this node has no GPU driver (this process stopped with it: the processes train "
        "together)"
    )
    # LightningCLI gives the model the hyperparameters of the checkpoint where it can read it: rank 0 alone. Rank 1
    # with another warmup would drift from it, silently.
    warmer = wait_job(start_job(folders, "pytorch", 1, fit(*ddp, "--ckpt_path", "ckpt/last.ckpt",
                                                           "--model.warmup_steps", "5")), timeout_s=300)  # fmt: skip
    assert [process.returncode for process in warmer] == [1, 1], warmer[0].stderr[-3000:]
    assert warmer[1].stderr.strip().splitlines()[-1] == (
        "error: --model.warmup_steps 5: rank 0 takes 0 from the hyperparameters of --ckpt_path ckpt/last.ckpt "
        "(LightningCLI gives the model a checkpoint's own), which rank 1 cannot read (nodes that share no disk); give "
        "--model.warmup_steps 0, as it was trained"
    )
    assert warmer[0].stderr.strip().splitlines()[-1].startswith("error: another process builds the model or the data")
    assert torch.load(last, weights_only=False)["global_step"] == 6 * 2  # untouched
    again = run_job(folders, "pytorch", 1, fit(*ddp, "--ckpt_path", "ckpt/last.ckpt"))
    for process in again:
        assert process.returncode == 0, f"node {process.node}: {process.stderr[-3000:]}"
    # 235 rows over 2 processes of batch 20 (118 each): 6 steps an epoch; 2 epochs read back, 1 more trained
    assert torch.load(last, weights_only=False)["global_step"] == 6 * EPOCHS
    assert not (folders[1] / "ckpt" / "last.ckpt").exists()


def preempt(started: list, last: Path, signalled: list[int]) -> int:
    """SIGTERM to the processes of global ranks `signalled` once a third epoch is saved in `last`: every process of
    the job must then end, with 143, within GRACE_S, and last.ckpt be an epoch's end. Returns its epoch."""
    processes = [popen for *_, popen in started]
    wait_for_epoch(last, 2, processes)
    sent = signal_pids([processes[rank].pid for rank in signalled])
    statuses = wait_all(processes, sent)
    assert statuses == [128 + signal.SIGTERM] * len(processes), [p.stderr[-3000:] for p in wait_job(started)]
    stopped = torch.load(last, weights_only=False)
    assert stopped["global_step"] == (stopped["epoch"] + 1) * 30  # an epoch's end: 118 rows a rank, batch 4
    return stopped["epoch"]


PREEMPTIBLE = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "2",
               "--data.init_args.batch_size", "4", "--trainer.callbacks", "[]"]  # fmt: skip


@pytest.mark.parametrize(
    ("distribution", "signalled"), [("pytorch", [0]), ("pytorch", [1]), ("mpi", [0, 1]), ("mpi", [0])]
)
def test_sigterm_to_any_processes_of_a_job_ends_every_process_with_143_at_an_epoch_end(
    tmp_path, distribution, signalled
):
    """Lightning 2.6.6 alone hung here for good: its SIGTERM handler broadcasts from rank 0 wherever the signal lands
    (scripts/training/sigterm.py). Azure ML signals every process; a process can also be signalled alone."""
    folders = node_checkouts(tmp_path, 2)
    mount = tmp_path / "mnt" / "azureml" / "checkpoints"
    args = fit("--config", PRESETS[distribution], *PREEMPTIBLE, "--checkpoint_dir", str(mount), "--test_after_fit",
               "false", "--trainer.enable_progress_bar", "false")  # fmt: skip
    args[args.index("--trainer.max_epochs") + 1] = str(EPOCHS * 4)
    assert 2 <= preempt(start_job(folders, distribution, 1, args), mount / "last.ckpt", signalled) < EPOCHS * 4 - 1


def test_a_preempted_job_started_again_resumes_from_its_rw_mount_output_in_its_run(tmp_path, azure_tracking):
    """Low-priority nodes: Azure ML sends every process SIGTERM, then runs the same job again, with the same run and
    the same `checkpoints` output (mounted read-write on every node, an absolute path, outliving the nodes)."""
    folders = node_checkouts(tmp_path, 2)
    mount = tmp_path / "mnt" / "azureml" / "checkpoints"
    run_id, tracking = job_run(azure_tracking, "preempted")
    args = fit("--config", "configs/trainer/ddp.yaml", *PREEMPTIBLE, "--checkpoint_dir", str(mount))
    args[args.index("--trainer.max_epochs") + 1] = str(EPOCHS * 4)
    stopped_at = preempt(start_job(folders, "pytorch", 1, args, tracking), mount / "last.ckpt", [0, 1])
    assert stopped_at < EPOCHS * 4 - 1

    again = run_job(folders, "pytorch", 1, args, tracking)
    for process in again:
        assert process.returncode == 0, f"node {process.node}: {process.stderr[-3000:]}"
    assert f"resuming from {mount / 'last.ckpt'}" in again[0].stdout
    assert re.findall(r"^test_acc: ", "".join(p.stdout for p in again), re.M) == ["test_acc: "]
    final = torch.load(mount / "last.ckpt", weights_only=False)
    assert (final["epoch"], final["global_step"]) == (EPOCHS * 4 - 1, EPOCHS * 4 * 30)  # 118 rows a rank, batch 4
    client = MlflowClient(azure_tracking.url)
    assert client.get_run(run_id).info.status == "FINISHED"
    steps = {m.step for m in client.get_metric_history(run_id, "val_loss")}
    assert sorted(steps) == list(range(EPOCHS * 4))  # one run, its metrics continued
