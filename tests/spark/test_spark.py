"""The fit on Spark (scripts/spark/): pyspark's TorchDistributor on a `local-cluster[2,1,1024]` master, whose tasks
run in two executor processes of their own, as on a cluster. Two tasks of batch 10 train the weights one process of
batch 20 does, into one MLflow run with one report; a task that fails makes the command fail with its error in one
line. One Spark cluster serves the module (it takes ~25 s to start); the failing command starts its own.

Scoring on Spark (`scripts.spark score`): mlflow.pyfunc.spark_udf of the registered model over penguin rows read from a
CSV and over photos read with the binaryFile source answers as `scripts.train predict`, with the accuracy the Synapse
Horovod tutorial computes (MulticlassClassificationEvaluator); a row the model refuses is one line.
"""

from __future__ import annotations

import csv  # extra: serving
import os
import pickle
import re
import shutil  # extra: serving
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pandas as pd  # extra: serving
import pytest
from mlflow import MlflowClient

from tests.conftest import DDP_EPOCHS, REPO, assert_same_training, last_checkpoint, own_tmpdir, penguin_fit, run_module
from tests.serving.scored_models import scored_models  # extra: serving
from tests.serving.test_own_datamodule import check_answers, fit_fruit  # extra: serving
from tests.spark.conftest import MASTER, needs_java


class FailOnRank(L.Callback):
    """Raises in one process of a fit, at the start of an epoch: a task that fails while the others train."""

    def __init__(self, rank: int = 1, epoch: int = 1) -> None:
        self.rank, self.epoch = rank, epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank == self.rank and trainer.current_epoch == self.epoch:
            raise RuntimeError(f"rank {self.rank} lost its data in epoch {self.epoch}")


class KillOnRank(FailOnRank):
    """SIGKILLs one process of a fit at the start of an epoch, as the kernel's OOM killer does: no line of its own."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank == self.rank and trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)


class KillExecutorOnRank(FailOnRank):
    """SIGKILLs the Spark executor (the JVM) that runs one rank, at the start of an epoch: a lost node, or the OOM
    killer choosing the executor."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        import psutil

        if trainer.global_rank == self.rank and trainer.current_epoch == self.epoch:
            executor = next(p for p in psutil.Process().parents() if p.name() == "java")
            executor.kill()
            time.sleep(60)  # this process goes with its executor's task


@pytest.mark.slow
@needs_java
def test_two_spark_tasks_train_the_weights_one_process_does_into_one_run_with_one_report(
    tmp_path, spark, one_process, capsys
):
    from scripts.spark import main

    outputs = tmp_path / "outputs"
    main(["fit", "--num_processes", "2", *penguin_fit(outputs, "--data.init_args.batch_size", "10")[1:]])
    out, err = capsys.readouterr()
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in err  # the tasks' output, streamed here
    assert_same_training(one_process, last_checkpoint(outputs))
    # This process reports rank 0's results once; the tasks' own lines went to stderr.
    (test_acc,) = re.findall(r"^test_acc: (\S+)$", out, re.M)
    (run_id,) = re.findall(r"^mlflow run: (\w+)$", out, re.M)
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "penguins"]
    (run,) = client.search_runs([experiment.experiment_id])  # one run, rank 0's
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert f"{run.data.metrics['test_acc']:.4f}" == test_acc
    assert [m.step for m in client.get_metric_history(run_id, "val_loss")] == list(range(DDP_EPOCHS))
    assert (run.data.params["trainer.devices"], run.data.params["trainer.num_nodes"]) == ("1", "2")
    assert run.data.params["trainer.strategy"] == "ddp"
    (checkpoints,) = outputs.glob("*/*/checkpoints")
    assert sorted(path.name for path in checkpoints.iterdir()) == ["best.ckpt", "last.ckpt"]
    assert not (outputs / "spark-logs").exists()  # a fit that finished keeps no log of its tasks' output
    assert len(list(Path(os.environ["TMPDIR"]).glob("torchelastic_*"))) >= 2  # each task's torchrun's, not in /tmp


@pytest.mark.slow
@needs_java
def test_data_the_executors_do_not_see_is_one_line_before_the_fit(tmp_path, spark):
    """On a cluster whose executors run on other machines, a CSV of the driver's disk alone failed in every task, or
    trained on another file of that name there: the executors are asked first (a local master's run here: not asked).
    /dev/fd/N of a file this process holds open is a path of this process alone, as the driver's disk is to nodes."""
    import socket

    from scripts.spark.cluster import SparkFitError, check_fit_inputs
    from scripts.spark.launch import resolve_trainer

    rows = tmp_path / "penguins.csv"
    rows.write_text("species,island\nAdelie,Torgersen\n")  # 32 bytes
    args = ["--config", "configs/penguins.yaml", "--data.init_args.csv_path"]
    check_fit_inputs(spark, resolve_trainer([*args, str(rows)]))  # every executor sees it: nothing to say
    with rows.open() as held:
        private = os.dup2(held.fileno(), 987)  # a number no executor's Python has open
        try:
            config = resolve_trainer([*args, "/dev/fd/987"])
            with pytest.raises(SparkFitError) as error:
                check_fit_inputs(spark, config)
        finally:
            os.close(private)
    assert str(error.value) == (
        f"--data.init_args.csv_path /dev/fd/987: a file of 32 bytes on this machine, nothing on the executor on "
        f"{socket.gethostname()} (the tasks read their data where they run); give a path every node reads: "
        "/Volumes/... or /dbfs/... on Databricks, the pool's mounted storage (/synfs/...) on Synapse, a shared folder "
        "on a cluster of your own"
    )


@pytest.mark.slow
@needs_java
def test_a_data_error_in_the_tasks_is_one_line_naming_the_file(tmp_path, spark):
    """The driver checks the config, not the data (the data are where the tasks run): the tasks' error comes back."""
    from scripts.spark import main

    missing = tmp_path / "penguins.csv"
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--num_processes", "2", *penguin_fit(tmp_path, "--data.init_args.csv_path", str(missing))[1:]])
    # Every task meets it; whichever reports first is the one line.
    assert re.fullmatch(
        rf"error: rank [01] of the Spark fit: {re.escape(str(missing))}: no such file; give data.init_args.csv_path "
        rf"an existing CSV \(the tasks' whole output: {re.escape(str(tmp_path))}/spark-logs/fit-[\d-]+\.log\)",
        stop.value.code,
    ), stop.value.code
    assert not list(tmp_path.glob("*/*/checkpoints"))


@pytest.mark.slow
@needs_java
def test_a_killed_process_is_reported_as_killed_not_as_the_survivors_lost_peer(tmp_path, spark, capsys):
    """The kernel's OOM killer leaves no line of its own: torchrun reports the signal, and the surviving rank fails
    for its lost peer a moment later; the report names the rank that was killed."""
    from scripts.spark import main

    killing = '{"class_path": "tests.spark.test_spark.KillOnRank", "init_args": {"rank": 1, "epoch": 1}}'
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--num_processes", "2", *penguin_fit(tmp_path, "--trainer.callbacks+", killing)[1:]])
    found = re.fullmatch(
        r"error: rank 1 of the Spark fit was killed by signal 9 \(SIGKILL: out of memory, or stopped from outside\); "
        r"the other ranks stopped for its loss \(the tasks' whole output: (\S+)\)",
        stop.value.code,
    )
    assert found, stop.value.code
    assert "Traceback" not in capsys.readouterr().err
    assert "exitcode  : -9" in Path(found[1]).read_text()


@pytest.mark.slow
@needs_java
def test_a_task_that_fails_fails_the_command_with_its_error_in_one_line(tmp_path):
    """The tasks' tracebacks (torch's, torchrun's, Spark's Java ones: 89-115 lines) go to a log file the line names;
    the console keeps the fit's progress and that line."""
    failing = '{"class_path": "tests.spark.test_spark.FailOnRank", "init_args": {"rank": 1, "epoch": 1}}'
    args = penguin_fit(tmp_path / "outputs", "--trainer.callbacks+", failing)
    command = ["fit", "--num_processes", "2", "--master", MASTER, *args[1:]]
    result = run_module("scripts.spark", *command, env=own_tmpdir(tmp_path))
    assert result.returncode == 1
    found = re.fullmatch(
        r"error: rank 1 of the Spark fit: RuntimeError: rank 1 lost its data in epoch 1 \(the tasks' whole output: "
        r"(\S+)\)",
        result.stderr.strip().splitlines()[-1],
    )
    assert found, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "\tat " not in result.stderr, result.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in result.stderr  # the progress before it
    log = Path(found[1])
    assert log.parent == tmp_path / "outputs" / "spark-logs"
    assert 'raise RuntimeError(f"rank {self.rank} lost its data' in log.read_text()  # the whole traceback is there
    assert "test_acc" not in result.stdout


@pytest.mark.slow
@needs_java
def test_a_killed_rank_0_executor_ends_its_run_as_killed_and_its_stack_lines_stay_in_the_log(tmp_path):
    """The executor of rank 0 killed (a lost node): its run stayed RUNNING (no process of it was left to end it) and
    the survivor's C++ stack (c10d's `frame #N`) and the driver JVM's Java trace reached the console. The driver ends
    the run as KILLED; the console keeps the progress and the one line."""
    killing = '{"class_path": "tests.spark.test_spark.KillExecutorOnRank", "init_args": {"rank": 0, "epoch": 1}}'
    outputs = tmp_path / "outputs"
    command = [
        "fit",
        "--num_processes",
        "2",
        "--master",
        MASTER,
        *penguin_fit(outputs, "--trainer.callbacks+", killing)[1:],
    ]
    env = {key: value for key, value in own_tmpdir(tmp_path).items() if key != "MLFLOW_TRACKING_URI"}
    result = run_module("scripts.spark", *command, env=env)
    assert result.returncode == 1
    found = re.fullmatch(
        r"error: the Spark fit lost an executor \(.*\): out of memory, or stopped from outside \(the tasks' whole "
        r"output: (\S+)\)",
        result.stderr.strip().splitlines()[-1],
    )
    assert found, result.stderr[-3000:]
    for stack in ("frame #", "Exception raised from", "\tat ", "Exception:", "Traceback"):
        assert stack not in result.stderr, result.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in result.stderr  # the progress before it
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "KILLED"
    assert f"MLflow run {run.info.run_id} ended as KILLED by the driver" in Path(found[1]).read_text()


@pytest.mark.slow
def test_a_bad_option_is_one_line_before_spark_starts(tmp_path):
    args = penguin_fit(tmp_path, "--trainer.max_epochs", "abc")[1:]
    result = run_module("scripts.spark", "fit", "--num_processes", "2", *args, env={**os.environ, "JAVA_HOME": "/none"})
    assert result.returncode == 1  # the JVM would not start with that JAVA_HOME: Spark was never asked
    assert result.stderr.strip().splitlines()[-1] == ("error: trainer.max_epochs: 'abc' is not a valid value; give int")


@pytest.mark.slow
def test_run_as_a_file_from_its_own_folder_it_runs_from_the_repository_root():
    """A Databricks job's Python script task runs scripts/spark/__main__.py by its path, from that file's folder: the
    config's relative path is found from the repository's root, and the option's mistake is the line, as with -m."""
    args = ["fit", "--num_processes", "1", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "abc"]
    env = {**os.environ, "JAVA_HOME": "/none", "PYTHONPATH": ""}  # Spark is never asked
    result = subprocess.run([sys.executable, "__main__.py", *args], cwd=REPO / "scripts" / "spark", capture_output=True,
                            text=True, timeout=300, env=env)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: trainer.max_epochs: 'abc' is not a valid value; give int"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["fit", "--config", "configs/penguins.yaml"], "--num_processes (missing): give the number of processes"),
        (["fit", "--num_processes", "0"], "--num_processes 0: give the number of processes to train, 1 or more"),
        (["test", "--num_processes", "2"], "scripts.spark runs fit or score (given: test); validate, test and"),
        (["fit", "--num_processes=2", "--trainer.devices", "2"], "--trainer.devices: the Spark launcher sets devices"),
        (["fit", "--num_processes", "2", "--trainer.num_nodes=2"], "--trainer.num_nodes: the Spark launcher sets"),
        (["fit", "--num_processes", "2", "--master", "local[two]"], "--master local[two]: not a Spark master URL"),
        (["fit", "--num_processes", "2", "--master=127.0.0.1:7077"], "--master 127.0.0.1:7077: not a Spark master"),
        (["fit", "--num_processes", "2", "--master", "local-cluster[2,1]"], "--master local-cluster[2,1]: not a"),
    ],
)
def test_launcher_options_given_wrong_are_one_line(argv, line):
    from scripts.spark.launch import SparkFitError, split_options

    with pytest.raises(SparkFitError) as error:
        split_options(argv)
    assert str(error.value).startswith(line)


@pytest.mark.parametrize(
    "master", ["local", "local[4]", "local[*]", "local[2,3]", "local-cluster[2, 1, 1024]", "spark://h1:7077,h2:7077",
               "yarn", "k8s://https://10.0.0.1:6443", "sc://localhost:15002"],
)  # fmt: skip
def test_spark_s_master_urls_are_taken(master):
    from scripts.spark.launch import split_options

    assert split_options(["fit", "--num_processes", "1", "--master", master])[1] == master


def trainer(accelerator="auto", strategy="auto", plugins=None) -> SimpleNamespace:
    return SimpleNamespace(accelerator=accelerator, strategy=strategy, plugins=plugins)


@pytest.mark.parametrize(
    ("config", "processes", "task_gpus", "launch"),
    [
        (trainer(), 4, 0, ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "4"]),
        (trainer(accelerator="cpu"), 2, 1, ["--trainer.accelerator", "cpu", "--trainer.devices", "1"]),
        (trainer(), 8, 1, ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.num_nodes", "8"]),
        (trainer(accelerator="gpu"), 8, 4, ["--trainer.accelerator", "gpu", "--trainer.devices", "4"]),
        (trainer(strategy="ddp_find_unused_parameters_true"), 2, 0, ["--trainer.num_nodes", "2"]),
    ],
)
def test_devices_and_nodes_follow_the_processes_and_the_gpus_of_a_task(config, processes, task_gpus, launch):
    from scripts.spark.launch import plan_launch

    args = plan_launch(config, processes, task_gpus).trainer_args()
    assert " ".join(launch) in " ".join(args)
    assert ("--trainer.strategy" in args) == (config.strategy == "auto")  # a strategy of the user's is kept
    gpus = task_gpus if "gpu" in args else 1
    assert args[args.index("--trainer.num_nodes") + 1] == str(processes // gpus)


@pytest.mark.parametrize(
    ("config", "processes", "task_gpus", "line"),
    [
        (trainer(accelerator="gpu"), 2, 0, "--trainer.accelerator gpu: this Spark cluster gives its tasks no GPU"),
        (trainer(), 6, 4, "--num_processes 6: each Spark task gets 4 GPUs (spark.task.resource.gpu.amount)"),
        (trainer(strategy={"class_path": "strategies.horovod.HorovodStrategy"}), 2, 0, "configs/trainer/horovod.yaml"),
        (trainer(plugins=[{"class_path": "strategies.mpi_environment.MPIEnvironment"}]), 2, 0, "configs/trainer/ddp_"),
        (trainer(accelerator="mps"), 2, 0, "--trainer.accelerator mps: Spark tasks train on cpu or gpu"),
    ],
)
def test_launches_spark_cannot_run_are_one_line(config, processes, task_gpus, line):
    from scripts.spark.launch import SparkFitError, plan_launch

    with pytest.raises(SparkFitError) as error:
        plan_launch(config, processes, task_gpus)
    assert str(error.value).startswith(line)


@pytest.mark.parametrize(
    ("slots", "processes", "tasks", "line"),
    [
        (("local[4]", 2), 3, 3, "its 3 Spark tasks run at once (a barrier stage), and the master local[4] has 2 task "
                                "slots (1 executor x (4 cores // spark.task.cpus 2)); give --master local[6] (or "
                                "local-cluster[3,2,1024])"),
        ((2, 2, 2), 4, 4, "its 4 Spark tasks run at once (a barrier stage), and this cluster has 2 task slots (2 "
                          "executors x (2 cores // spark.task.cpus 2)); give the cluster more executors or cores"),
        ((2, 16, 1, 1, 2), 8, 4, "its 4 Spark tasks (2 processes each) run at once (a barrier stage), and this cluster "
                                 "has 0 task slots (2 executors x (16 cores // spark.task.cpus 1), GPUs: 1 // "
                                 "spark.task.resource.gpu.amount 2)"),
        ((2, 4, 2), 4, 4, None),
        (("local-cluster[2, 1, 1024]", 1), 2, 2, None),
    ],
)  # fmt: skip
def test_more_tasks_than_the_cluster_s_slots_are_one_line_with_spark_s_count(slots, processes, tasks, line):
    """Spark counts a barrier stage's slots as executors x (cores // spark.task.cpus) (and GPUs // the task's): with
    more tasks than that it retries 40 times, 15 s apart, then fails the job."""
    from scripts.spark.cluster import Slots, SparkFitError, check_slots, local_slots

    given = local_slots(*slots) if isinstance(slots[0], str) else Slots("this cluster", *slots)
    if line is None:
        check_slots(given, processes, tasks)
        return
    with pytest.raises(SparkFitError) as error:
        check_slots(given, processes, tasks)
    assert str(error.value).startswith(f"--num_processes {processes}: {line}"), str(error.value)


@pytest.mark.slow
@needs_java
def test_a_cluster_s_slots_are_its_registered_executors_cores(spark):
    """The count a cluster's master gets (spark://, yarn, k8s, Databricks): the executors registered with the driver
    (through Scala's SparkContext.getExecutorMemoryStatus: this is its canary) and their cores."""
    from scripts.spark.cluster import Slots, cluster_slots, session_slots

    assert spark.range(2).count() == 2  # a job starts once every executor has registered (LocalSpark's config)
    assert cluster_slots(spark) == Slots("this cluster", executors=2, cores=1, task_cpus=1)
    assert session_slots(spark) == Slots(f"the master {MASTER}", executors=2, cores=1, task_cpus=1)


# Two sessions of one process, one after the other, as two calls of fit_on_spark or score_on_spark without a session.
TWO_SESSIONS = """
from scripts.spark.session import LocalSpark
for _ in range(2):
    local = LocalSpark("local-cluster[2,1,1024]")
    print(local.session.range(4).count(), flush=True)
    local.stop()
"""


@pytest.mark.slow
@needs_java
def test_a_second_local_cluster_session_of_the_process_gets_executors(tmp_path):
    """pyspark keeps its JVM for the next session: the Spark home it started with must outlive the first session."""
    env = own_tmpdir(tmp_path) | {"PYTHONPATH": str(REPO)}
    env.pop("SPARK_HOME", None)
    result = subprocess.run([sys.executable, "-c", TWO_SESSIONS], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["4", "4"], result.stdout


@pytest.mark.slow
def test_a_node_without_the_checkout_runs_the_code_the_driver_sent(tmp_path):
    """TorchDistributor pickles the task's entry on the driver and runs it in a Python that cannot import this
    checkout. On a node without the checkout at the driver's path (a Synapse pool, YARN), the entry unpacks the code
    the driver sent into the task's folder and runs the fit from there (here: up to --print_config)."""
    import subprocess

    from pyspark import cloudpickle

    from scripts.spark import task as spark_task
    from scripts.spark.launch import resolve_trainer

    cloudpickle.register_pickle_by_value(spark_task)
    try:
        entry = cloudpickle.dumps(spark_task.start_in_task)
    finally:
        cloudpickle.unregister_pickle_by_value(spark_task)
    code = spark_task.pack_code()
    call = (entry, "/nowhere/checkout", "/nowhere/checkout", code, ["--config", "configs/penguins.yaml"])
    program = (
        "import pickle, sys\n"
        "entry, repository, workdir, code, args = pickle.loads(sys.stdin.buffer.read())\n"
        "entry = pickle.loads(entry)\n"
        "print(entry(repository, workdir, code, [*args, '--print_config'], {'MLFLOW_TRACKING_URI': 'sqlite:///x.db'}))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", program], input=pickle.dumps(call), capture_output=True, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert "class_path: datamodules.penguins.PenguinDataModule" in result.stdout.decode()
    assert result.stdout.decode().strip().endswith("None")  # --print_config stops before any fit: no results
    (unpacked,) = tmp_path.glob("lightning-template-code-*")
    assert (unpacked / "scripts" / "train.py").is_file() and (unpacked / "configs" / "penguins.yaml").is_file()

    # There a relative root folder would be the task's, which Spark removes with the application: refused, not trained.
    args = ["--config", "configs/penguins.yaml", "--trainer.max_epochs", "1"]
    relative = spark_task.relative_outputs(resolve_trainer(args), {})
    assert relative == ["--trainer.default_root_dir outputs"]
    program = program.replace("'--print_config'], {", f"], relative={relative!r}, environment={{")
    result = subprocess.run(
        [sys.executable, "-c", program], input=pickle.dumps((entry, *call[1:4], args)), capture_output=True,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 1
    assert re.search(
        r"spark task failed on rank 0 at [\d.]+: --trainer.default_root_dir outputs: a relative path, and this node "
        r"runs the code the driver sent from the task's folder, which Spark removes with the application",
        result.stderr.decode(),
    ), result.stderr.decode()[-3000:]
    assert not (unpacked / "outputs").exists()
    absolute = ["--trainer.default_root_dir", str(tmp_path / "kept"), "--trainer.logger.init_args.tracking_uri"]
    assert spark_task.relative_outputs(resolve_trainer([*args, *absolute, "sqlite:///x.db"]),
                                          {}) == ["--trainer.logger.init_args.tracking_uri sqlite:///x.db"]  # fmt: skip
    # The files rank 0 writes beside the run: the served model and the metrics.
    given = ["--model_dir", "model", "--metrics_file", str(tmp_path / "metrics.json")]
    config = resolve_trainer([*args, *absolute[:2], *given])
    assert spark_task.relative_outputs(config, {"MLFLOW_TRACKING_URI": "sqlite:///x.db"}) == [
        "--model_dir model", "MLFLOW_TRACKING_URI sqlite:///x.db"
    ]  # fmt: skip


def test_the_failure_reported_is_the_first_one_whatever_order_its_line_arrived_in():
    """The rank that fails first takes the others down (their collectives lose a peer); lines from different tasks
    reach the driver in any order, so the time each task stamps on its failure decides."""
    import io

    from scripts.spark.task_output import TaskErrors, failure_line

    stream = io.StringIO()
    errors = TaskErrors(stream)
    errors.write("epoch 1\nspark task failed on rank 0 at 1700000000.900: RuntimeError: Connection closed by peer\nspa")
    errors.write("rk task failed on rank 1 at 1700000000.200: RuntimeError: rank 1 lost its data in epoch 1\n")
    assert stream.getvalue().startswith("epoch 1\n")  # everything still reaches the real stderr
    assert failure_line(RuntimeError("job aborted"), errors.failures) == (
        "rank 1 of the Spark fit: RuntimeError: rank 1 lost its data in epoch 1"
    )


def test_a_spark_failure_without_a_task_line_is_spark_s_reason_in_one_line():
    from scripts.spark.task_output import failure_line

    java = (
        "An error occurred while calling o67.collectToPython.\n: org.apache.spark.SparkException: Job aborted due to "
        "stage failure: Could not recover from a failed barrier ResultStage. Most recent failure reason: "
        "ExecutorLostFailure (executor 1 exited)\n\tat org.apache.spark.scheduler.DAGScheduler.abortStage(...)\n" * 3
    )
    assert failure_line(RuntimeError(java.replace("ExecutorLostFailure", "TaskKilled")), []) == (
        "the Spark fit failed: Could not recover from a failed barrier ResultStage. Most recent failure reason: "
        "TaskKilled (executor 1 exited) (see the executors' logs)"
    )
    # An executor lost (its JVM killed): that, not the surviving rank's lost connection.
    survivor = [(1700000000.9, 0, "RuntimeError: Connection closed by peer")]
    assert failure_line(RuntimeError(java), survivor) == (
        "the Spark fit lost an executor (executor 1 exited): out of memory, or stopped from outside"
    )


def test_after_a_failure_the_tasks_tracebacks_go_to_the_log_alone_and_a_kill_is_named():
    """What torchrun prints for a rank killed by SIGKILL, then the survivor's failure and traceback (as in a real run):
    the console keeps what came before the first failure; the log keeps everything."""
    import io

    from scripts.spark.task_output import TaskErrors, failure_line

    console, log = io.StringIO(), io.StringIO()
    errors = TaskErrors(console, log)
    output = (
        "Experiment with name penguins not found. Creating it.\n"
        "E1125 12:44:20.394000 21147 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
        "local_rank: 0 (pid: 21345) of binary: python\n"
        'Traceback (most recent call last):\n  File "torchrun", line 8, in <module>\n'
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-25_12:44:20\n  host      : localhost\n"
        "  rank      : 1 (local_rank: 0)\n  exitcode  : -9 (pid: 21345)  (SIGKILL)\n"
        "spark task failed on rank 0 at 1.0: RuntimeError: Connection reset by peer\n"
        "[rank0]: Traceback (most recent call last):\n[rank0]: RuntimeError: Connection reset by peer\n"
    )
    for part in (output[:100], output[100:]):
        errors.write(part)
    assert console.getvalue() == "Experiment with name penguins not found. Creating it.\n"
    assert log.getvalue() == output
    assert errors.failures == [(1.0, 0, "RuntimeError: Connection reset by peer")]
    assert [(rank, number) for _, rank, number in errors.killed] == [(1, 9)]
    assert failure_line(RuntimeError("Job aborted"), errors.failures, errors.killed) == (
        "rank 1 of the Spark fit was killed by signal 9 (SIGKILL: out of memory, or stopped from outside); the other "
        "ranks stopped for its loss"
    )


def test_on_databricks_the_tasks_track_to_its_mlflow_with_the_driver_s_credentials(monkeypatch):
    """Executors have no notebook context: the driver hands them the workspace URL and token (as Databricks'
    TorchDistributor examples do), and Databricks keeps experiments at workspace paths."""
    from jsonargparse import Namespace
    from mlflow.utils import databricks_utils
    from mlflow.utils.credentials import MlflowHostCreds

    from scripts.spark.task import SparkFitError, tracking_environment
    from scripts.training.tracking_server import check_tracking_uri

    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "18.0")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    creds = MlflowHostCreds("https://adb-1.azuredatabricks.net", token="dapi-token")
    monkeypatch.setattr(databricks_utils, "get_databricks_host_creds", lambda uri=None: creds)

    def logger(experiment: str) -> Namespace:
        init_args = Namespace(experiment_name=experiment, tracking_uri=None)
        return Namespace(class_path="scripts.training.tracking.BufferedMLFlowLogger", init_args=init_args)

    environment = tracking_environment(logger("/Users/me@example.com/penguins"))
    assert environment["MLFLOW_TRACKING_URI"] == "databricks"
    assert (environment["DATABRICKS_HOST"], environment["DATABRICKS_TOKEN"]) == (creds.host, creds.token)
    check_tracking_uri("databricks", "MLFLOW_TRACKING_URI")  # scripts.train in the task takes it
    with pytest.raises(SparkFitError) as error:
        tracking_environment(logger("penguins"))
    assert str(error.value) == (
        "experiment_name 'penguins': Databricks keeps experiments at workspace paths; give "
        "--trainer.logger.init_args.experiment_name /Users/<you>/penguins"
    )
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    environment = tracking_environment(logger("penguins"))  # elsewhere: the driver's MLflow variables, nothing more
    assert environment["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000" and "DATABRICKS_TOKEN" not in environment


@pytest.mark.slow
@needs_java
def test_a_unity_catalog_registry_takes_three_part_names_from_the_tasks(spark):
    """On Databricks MLflow registers in Unity Catalog (its default for the `databricks` tracking URI, or
    set_registry_uri("databricks-uc")), whose models are catalog.schema.model. MLflow completes a shorter name from
    the Spark session's catalog and schema; the tasks have none, and the registry refused it after the whole fit."""
    from jsonargparse import Namespace

    from scripts.spark.cluster import SparkFitError, registry_environment

    def config(name: str) -> Namespace:
        logger = Namespace(class_path="scripts.training.tracking.BufferedMLFlowLogger", init_args=Namespace())
        return Namespace(register_model=name, trainer=Namespace(logger=logger))

    for environment, name, line in [
        ({"MLFLOW_TRACKING_URI": "databricks"}, "penguins", "(MLflow's default registry for databricks), which names "
         "models catalog.schema.model, and have no Spark session to complete a shorter name from; give "
         "--register_model main.default.penguins"),
        ({"MLFLOW_REGISTRY_URI": "databricks-uc"}, "ml.penguins", "(MLFLOW_REGISTRY_URI databricks-uc), which names "
         "models catalog.schema.model, and have no Spark session to complete a shorter name from; give "
         "--register_model main.ml.penguins"),
    ]:  # fmt: skip
        with pytest.raises(SparkFitError) as error:
            registry_environment(config(name), environment, spark)
        assert str(error.value) == f"--register_model {name}: the tasks register in Unity Catalog {line}"
    given = {"MLFLOW_TRACKING_URI": "databricks"}
    assert registry_environment(config("main.default.penguins"), given, spark) == given
    assert registry_environment(config("penguins"), {"MLFLOW_TRACKING_URI": "sqlite:///x.db"}, spark)  # any name
    spark.conf.set("spark.mlflow.modelRegistryUri", "databricks-uc")  # a Databricks cluster's own setting
    try:
        with pytest.raises(SparkFitError, match="Unity Catalog .MLFLOW_REGISTRY_URI databricks-uc"):
            registry_environment(config("penguins"), {}, spark)
        environment = registry_environment(config("main.default.penguins"), {}, spark)
    finally:
        spark.conf.unset("spark.mlflow.modelRegistryUri")
    assert environment == {"MLFLOW_REGISTRY_URI": "databricks-uc"}  # handed to the tasks, which have no session


def test_a_local_master_past_this_machine_s_cores_or_memory_is_one_line_before_spark_starts(monkeypatch):
    """--num_processes 1000000 made a local[1000000] master: a Python process per task slot on this machine."""
    from pyspark.sql import SparkSession

    from scripts.spark import main

    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("JAVA_HOME", "/none")  # the JVM would not start: Spark is never asked
    # As a process without a session of its own (an earlier test of this worker may have left one).
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    fit = ["fit", "--config", "configs/penguins.yaml"]
    for args, line in (
        (["--num_processes", "1000000"], f"--num_processes 1000000: 1000000 task processes on this machine's {cores} "
                                         f"cores; give at most {4 * cores} (4 a core), or --master of a cluster"),
        (["--num_processes", "2", "--master", "local[5000]"], "--master local[5000]: 5000 task processes on this"),
        (["--num_processes", "2", "--master", "local-cluster[2,1,100000000]"],
         "--master local-cluster[2,1,100000000]: 2 workers of 100000000 MB, more than this machine's"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            main([*fit, *args])
        assert stop.value.code.startswith(f"error: {line}"), stop.value.code


# extra: serving
# ---- scoring with the registered model: mlflow.pyfunc.spark_udf ----


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return scored_models(tmp_path_factory)


def written(folder) -> pd.DataFrame:
    """Spark's CSV output folder (part files in partition order) as one DataFrame."""
    return pd.concat([pd.read_csv(part) for part in sorted(folder.glob("part-*.csv"))], ignore_index=True)


def assert_as_predict(answers, expected: dict[str, tuple[str, float]]) -> None:
    assert list(answers["class"]) == [label for label, _ in expected.values()]
    difference = max(abs(a - p) for a, (_, p) in zip(answers["probability"], expected.values()))
    assert difference <= 1e-5, difference


@pytest.mark.slow
@needs_java
def test_spark_udf_scores_penguin_rows_as_predict_with_the_synapse_accuracy(tmp_path, spark, models, capsys):
    from scripts.spark import main

    penguins = models["penguins"]
    # A column the model does not take travels to the output as it was read: quotes doubled inside a quoted value, as
    # pandas and Excel write them (Spark's default, which expects a backslash, kept the quotes and cut at the comma).
    noted = pd.read_csv(penguins.inputs)
    noted["note"] = [f'bird "{i}", seen at dawn' for i in range(len(noted))]
    noted.to_csv(tmp_path / "noted.csv", index=False, na_rep="NA")
    main(["score", str(penguins.model), str(tmp_path / "noted.csv"), "--output", str(tmp_path / "out"),
          "--label", "species"])  # fmt: skip
    answers = written(tmp_path / "out")
    notes = []
    for part in sorted((tmp_path / "out").glob("part-*.csv")):
        with part.open(newline="", encoding="utf-8") as file:
            notes += [row["note"] for row in csv.DictReader(file)]
    assert notes == list(noted["note"])
    assert list(answers.columns[-5:]) == ["class", "probability", "probability_Adelie", "probability_Gentoo",
                                          "probability_Chinstrap"]  # fmt: skip
    assert list(answers["species"]) == list(pd.read_csv(penguins.inputs)["species"])  # each row beside its answer
    assert_as_predict(answers, penguins.expected)
    species = list(pd.read_csv(penguins.inputs)["species"])
    right = sum(label == given for (label, _), given in zip(penguins.expected.values(), species))
    out = capsys.readouterr().out
    assert f"scored {len(species)} inputs" in out
    assert f"accuracy: {right / len(species):.4f}" in out  # the evaluator's, as predict's answers make it


@pytest.mark.slow
@needs_java
def test_spark_udf_scores_photos_read_as_binary_files_as_predict(tmp_path, spark, models, capsys):
    from scripts.spark import main

    birds = models["birds"]
    photos = tmp_path / "photos"
    shutil.copytree(birds.inputs, photos)
    (min(photos.iterdir()) / "desktop.ini").write_text("[.ShellClassInfo]\n")  # Windows Explorer's: no one's data
    (photos / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0 a thumbnail cache")
    (photos / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    # Names a careless folder holds: Spark's own CSV writer backslashed the quote, which the csv module and pandas
    # read back as another name; the line breaks and the comma must survive inside their quotes.
    odd = {}
    names = ['say "cheese", 1.jpg', "two\nlines\r.jpg"]
    for folder, name in zip(sorted(p for p in photos.iterdir() if p.is_dir()), names):
        first = min(folder.glob("*.jpg"))
        odd[str(first.rename(folder / name))] = str(first).replace(str(photos), str(birds.inputs))
    main(["score", str(birds.model), str(photos), "--output", str(tmp_path / "out")])
    rows = []
    for part in sorted((tmp_path / "out").glob("part-*.csv")):
        with part.open(newline="", encoding="utf-8") as file:
            rows += list(csv.DictReader(file))
    named = [row["path"].removeprefix("file:") for row in rows]
    paths = [odd.get(path, path.replace(str(photos), str(birds.inputs))) for path in named]
    assert sorted(paths) == sorted(birds.expected)  # every image, each once, and nothing else
    answers = pd.DataFrame(rows).astype({"probability": float}).set_index(pd.Index(paths)).loc[list(birds.expected)]
    assert_as_predict(answers, birds.expected)
    assert set(odd) <= set(named)
    right = sum(label == name.split("/")[-2] for name, (label, _) in birds.expected.items())  # folders name classes
    assert f"accuracy: {right / len(birds.expected):.4f}" in capsys.readouterr().out


@pytest.mark.slow
@needs_java
def test_a_row_the_model_refuses_on_spark_is_one_line_naming_it(tmp_path, spark, models):
    from scripts.spark import main

    rows = pd.read_csv(models["penguins"].inputs).iloc[:4].copy()
    rows.iloc[2, rows.columns.get_loc("island")] = "Atlantis"
    rows.to_csv(tmp_path / "new.csv", index=False)
    with pytest.raises(SystemExit) as stop:
        main(["score", str(models["penguins"].model), str(tmp_path / "new.csv"), "--output", str(tmp_path / "out")])
    assert stop.value.code.startswith(
        "error: the model refused an input: request: unknown island 'Atlantis' in column island on row 3"
    ), stop.value.code
    assert not (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.slow
@needs_java
@pytest.mark.parametrize(
    ("task", "rows", "label", "line"),
    [
        ("penguins", "penguins", "speces", r"--label speces: \S+ has no such column \(its columns: species, island, "),
        ("penguins", "penguins", "island", r"--label island: none of its values is a class of the model \(Adelie, "),
        ("birds", None, "species", r"--label species: images are labelled by the folders they are in; leave --label"),
    ],
)
def test_a_label_the_inputs_cannot_give_is_one_line_not_a_missing_accuracy(tmp_path, spark, models, task, rows, label,
                                                                           line):  # fmt: skip
    from scripts.spark import main

    inputs = models[task].inputs
    if rows:  # a few rows: the line comes from the data, whatever their number
        inputs = tmp_path / "new.csv"
        pd.read_csv(models[rows].inputs).iloc[:6].to_csv(inputs, index=False)
    with pytest.raises(SystemExit) as stop:
        main(["score", str(models[task].model), str(inputs), "--output", str(tmp_path / "out"), "--label", label])
    assert re.match(f"error: {line}", stop.value.code), stop.value.code
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@needs_java
@pytest.mark.parametrize(
    ("task", "inputs", "line"),
    [
        ("birds", "penguins", r"\S+/penguins.csv: the model \S+/birds takes images; give a folder of images$"),
        ("penguins", "birds", r"\S+/val: the model \S+/penguins takes rows; give a CSV of them \(.csv\)$"),
    ],
)
def test_inputs_of_another_kind_than_the_model_takes_are_one_line(tmp_path, spark, models, task, inputs, line):
    """Spark's answers were a pandas repr cut at its first line, or pyarrow's 'Cannot convert
    pyarrow.lib.ChunkedArray to pyarrow.lib.Array'."""
    from scripts.spark import main

    with pytest.raises(SystemExit) as stop:
        main(["score", str(models[task].model), str(models[inputs].inputs), "--output", str(tmp_path / "out")])
    assert re.match(f"error: {line}", stop.value.code), stop.value.code
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@needs_java
def test_inputs_with_nothing_to_score_are_one_line_not_scored_0_inputs(tmp_path, spark, models):
    """A CSV of a header and no rows, a folder of no image (its Thumbs.db left out): "scored 0 inputs", exit 0 and an
    empty output, where predict, the endpoint and scripts.score refuse them."""
    from scripts.spark import main

    header = tmp_path / "header.csv"
    header.write_text(models["penguins"].inputs.read_text().splitlines()[0] + "\n")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0 a thumbnail cache")
    cases = [("penguins", header, "a CSV header and no rows; put one row to score a line below it"),
             ("birds", tmp_path / "photos", "no files in it; give a folder of images")]  # fmt: skip
    for task, inputs, line in cases:
        with pytest.raises(SystemExit) as stop:
            main(["score", str(models[task].model), str(inputs), "--output", str(tmp_path / task)])
        assert stop.value.code == f"error: {inputs}: {line}"
        assert not (tmp_path / task).exists()


@pytest.mark.slow
@needs_java
@pytest.mark.parametrize("column", ["class", "Probability"])
def test_an_input_column_named_as_an_answer_column_is_one_line(tmp_path, spark, models, column):
    """A CSV of earlier predictions, or one whose label column is `class`: Spark's answer was AMBIGUOUS_REFERENCE,
    after a JSON log of its Java trace on the console (column names ignore case in Spark)."""
    from scripts.spark import main

    rows = pd.read_csv(models["penguins"].inputs).iloc[:6].rename(columns={"species": column})
    rows.to_csv(tmp_path / "new.csv", index=False)
    with pytest.raises(SystemExit) as stop:
        main(["score", str(models["penguins"].model), str(tmp_path / "new.csv"), "--output", str(tmp_path / "out")])
    assert stop.value.code == (
        f"error: {tmp_path / 'new.csv'}: its column {column} is also a column of the model's answer (class, "
        "probability, probability_Adelie, probability_Gentoo, probability_Chinstrap); rename it"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@needs_java
def test_a_header_typed_with_spaces_scores_and_one_of_other_separators_is_one_line(tmp_path, spark, models):
    """A header typed "island, bill_length_mm, ...": Spark's columns are " bill_length_mm" and so on, which the model
    reads as its own (as scripts.score does); Spark sent all of them under those names, and the answer was pyarrow's
    'Cannot convert pyarrow.lib.ChunkedArray to pyarrow.lib.Array'. So was it for a header of no column the model takes
    (semicolons)."""
    from scripts.spark import main

    penguins = models["penguins"]
    rows = pd.read_csv(penguins.inputs).iloc[:6]
    header, *lines = rows.to_csv(index=False).splitlines()
    (tmp_path / "spaced.csv").write_text("\n".join([header.replace(",", ", "), *lines]) + "\n")
    main(["score", str(penguins.model), str(tmp_path / "spaced.csv"), "--output", str(tmp_path / "out")])
    assert_as_predict(written(tmp_path / "out"), dict(list(penguins.expected.items())[:6]))
    rows.to_csv(tmp_path / "semicolons.csv", index=False, sep=";")
    with pytest.raises(SystemExit) as stop:
        main(["score", str(penguins.model), str(tmp_path / "semicolons.csv")])
    assert stop.value.code == (
        f"error: {tmp_path / 'semicolons.csv'}: none of its columns ({';'.join(rows.columns)}) is one the model takes "
        "(island, bill_length_mm, bill_depth_mm, flipper_length_mm, body_mass_g, Island, CulmenLength, CulmenDepth, "
        "FlipperLength, BodyMass); give a header of the model's column names, separated by commas"
    )


@pytest.mark.slow
@needs_java
def test_a_scoring_input_or_output_the_executors_do_not_see_is_one_line(tmp_path, spark):
    """Spark reads the input and writes --output where its tasks run: on other machines a CSV of the driver's disk
    failed in the tasks with a Java traceback, and the part files stayed on the executors' disks. The executors are
    asked first (the output's folder, or the nearest of it that is there, by a file put there a moment); /dev/fd/N as
    in the fit's test."""
    import socket

    from scripts.spark.cluster import SparkFitError
    from scripts.spark.score import check_score_paths

    rows = tmp_path / "new.csv"
    rows.write_text("island\nDream\n")  # 13 bytes
    check_score_paths(spark, str(rows), str(tmp_path / "out"))  # every executor sees both
    check_score_paths(spark, f"file:{rows}", f"file://{tmp_path / 'out'}")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["new.csv"]  # the marker file gone
    held = [os.open(rows, os.O_RDONLY), os.open(tmp_path, os.O_RDONLY)]
    private = [os.dup2(fd, number) for fd, number in zip(held, (987, 986))]  # numbers no executor's Python has open
    try:
        with pytest.raises(SparkFitError) as error:
            check_score_paths(spark, "/dev/fd/987", None)
        assert str(error.value) == (
            f"/dev/fd/987: a file of 13 bytes on this machine, nothing on the executor on {socket.gethostname()} "
            "(Spark reads it where its tasks run); give a URI Spark reads (dbfs:/..., abfss://...) or a path every "
            "node reads (/Volumes/... on Databricks)"
        )
        with pytest.raises(SparkFitError) as error:
            check_score_paths(spark, str(rows), "/dev/fd/986/out")
        assert str(error.value) == (
            f"--output /dev/fd/986/out: the executor on {socket.gethostname()} does not see this machine's folder "
            "/dev/fd/986 (Spark writes the predictions where its tasks run); give a URI Spark writes (dbfs:/..., "
            "abfss://...) or a folder every node sees (/Volumes/... on Databricks)"
        )
        with pytest.raises(SparkFitError, match="does not see this machine's folder /dev/fd/986 "):
            check_score_paths(spark, str(rows), "/dev/fd/986/new/deeper/out")  # folders Spark would make
    finally:
        for fd in [*private, *held]:
            os.close(fd)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["new.csv"]


@pytest.mark.slow
@needs_java
def test_inputs_and_outputs_given_as_spark_uris_are_spark_s_to_read(tmp_path, spark, models):
    """dbfs:/Volumes/..., file:/tmp/... (the way Spark itself writes paths): a file system of Spark's, not a path on
    this disk; they were refused as 'no such file or folder'. One that is not there is Spark's to say: one line."""
    from scripts.spark import main

    penguins = models["penguins"]
    pd.read_csv(penguins.inputs).iloc[:6].to_csv(tmp_path / "new.csv", index=False)
    main(["score", str(penguins.model), f"file:{tmp_path / 'new.csv'}", "--output", f"file:{tmp_path / 'out'}"])
    assert_as_predict(written(tmp_path / "out"), dict(list(penguins.expected.items())[:6]))
    with pytest.raises(SystemExit) as stop:  # was Spark's PATH_NOT_FOUND AnalysisException, a traceback
        main(["score", str(penguins.model), f"file:{tmp_path / 'old.csv'}"])
    assert stop.value.code == (
        f"error: file:{tmp_path / 'old.csv'}: no such file or folder where Spark reads it; give a CSV of rows or a "
        "folder of images"
    )


@pytest.mark.slow
@needs_java
def test_labels_written_as_float_indexes_or_with_spaces_give_the_accuracy(tmp_path, spark, models, capsys):
    """The course's Species index as pandas writes a column with a gap (1.0), and names with a space (" Gentoo"):
    what the datamodules read as the class, the accuracy counts as it."""
    from scripts.spark import main

    penguins = models["penguins"]
    rows = pd.read_csv(penguins.inputs).iloc[::12]  # of the three species
    species = ["Adelie", "Gentoo", "Chinstrap"]
    rows["by_index"] = [f"{species.index(name)}.0" for name in rows["species"]]
    rows["spaced"] = [f" {name}" for name in rows["species"]]
    rows.to_csv(tmp_path / "new.csv", index=False)
    answers = list(penguins.expected.values())[::12]
    assert set(rows["species"]) == set(species)
    right = sum(label == given for (label, _), given in zip(answers, rows["species"]))
    for label in ("by_index", "spaced"):
        main(["score", str(penguins.model), str(tmp_path / "new.csv"), "--label", label])
        assert f"accuracy: {right / len(rows):.4f}" in capsys.readouterr().out, label


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["score", "m"], "score takes a model and an input: score MODEL CSV_OR_FOLDER"),
        (["score", "m", "no/such.csv"], "no/such.csv: no such file or folder; give a CSV of rows or a folder"),
        (["score", "m", "README.md"], "README.md: give a CSV of rows (.csv) or a folder of images"),
        (["score", "m", "configs", "--output", "configs"], "--output configs: already exists; give a new folder"),
        (["score", "m", "configs", "--limit", "3"], "--limit: score takes --output, --label, --master"),
        (["score", "no-model", "configs"], "model 'no-model': give an MLflow model: models:/NAME/VERSION"),
    ],
)
def test_score_mistakes_are_one_line_before_spark_starts(argv, line, monkeypatch):
    from scripts.spark import main

    monkeypatch.setenv("JAVA_HOME", "/none")  # the JVM would not start: Spark is never asked
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code.startswith(f"error: {line}"), stop.value.code


def test_score_finds_a_registered_model_where_serve_finds_it_and_a_missing_one_before_spark(tmp_path, monkeypatch):
    """With MLFLOW_TRACKING_URI unset, models:/ resolved against ./mlflow.db (MLflow's default, made empty) after 80 s
    of Spark, where scripts.serve finds the model in outputs/mlflow.db: both look there, and say so in one line."""
    import mlflow

    from scripts.serving.model_registry import use_store
    from scripts.spark import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("JAVA_HOME", "/none")  # the JVM would not start: Spark is never asked
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.csv").write_text("island,bill_length_mm\nBiscoe,50.4\n")
    with pytest.raises(SystemExit) as stop:
        main(["score", "models:/penguins-classifier/1", "rows.csv"])
    assert stop.value.code == (
        "error: no MLflow store: outputs/mlflow.db is not here and MLFLOW_TRACKING_URI is not set; train with "
        "--register_model first, or give a model folder or checkpoint"
    )
    assert not list(tmp_path.rglob("*.db"))  # no empty store made

    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input):
            return model_input

    store = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    (tmp_path / "outputs").mkdir()
    try:
        mlflow.set_tracking_uri(store)
        with mlflow.start_run():
            mlflow.pyfunc.log_model(name="model", python_model=Echo(), registered_model_name="echo",
                                    pip_requirements=[])  # fmt: skip
        mlflow.set_tracking_uri(None)
        with pytest.raises(SystemExit) as stop:
            main(["score", "models:/penguins-classifier/1", "rows.csv"])
        assert stop.value.code.startswith(f"error: models:/penguins-classifier/1: not in the registry at {store} (")
        assert "\n" not in stop.value.code
        assert use_store("models:/echo/1") == store == os.environ["MLFLOW_TRACKING_URI"]
    finally:
        mlflow.set_tracking_uri(None)
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
@needs_java
def test_spark_udf_scores_an_own_datamodules_rows_as_predict(tmp_path, spark):
    """A datamodule written as "Add your own dataset" says (tests/serving/test_own_datamodule.py): its model on Spark
    too."""
    from scripts.serve import from_checkpoint
    from scripts.spark import main

    _, checkpoint, rows, answers = fit_fruit(tmp_path / "fruit")
    main(["score", str(from_checkpoint(checkpoint, tmp_path / "model")), str(rows), "--output", str(tmp_path / "out")])
    check_answers(written(tmp_path / "out").to_dict("records"), answers)


# end extra: serving
