"""Fit any task on a Spark cluster: the very same LightningCLI fit, one DDP process per Spark barrier task, started by
pyspark's TorchDistributor (Databricks, Synapse, a Spark cluster of your own, or this machine); and score data with the
registered model there (`score`: mlflow.pyfunc.spark_udf, scripts/serving/spark_score.py).

    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2
    python -m scripts.spark fit --config configs/mnist.yaml --num_processes 8 --data.init_args.data_dir /dbfs/mnist
    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2 --master "local-cluster[2,1,1024]"
    make spark TASK=penguins PROCESSES=2
    python -m scripts.spark score models:/penguins-classifier/1 new.csv --output predictions/

Every option but --num_processes and --master is scripts.train's. The Spark session is the one this process has (a
Databricks or Synapse notebook or job, spark-submit) or, run with plain python, a new one on --master (default
local[N]: N processes on this machine). The config is checked here first, so a typo costs no cluster time.

Each task runs `scripts.train fit` with the Trainer's devices x num_nodes set from N and the GPUs Spark gives a task
(1 x N on CPUs; with spark.task.resource.gpu.amount g, g processes per task: g x N/g). A node that has this checkout
at the driver's path (this machine, a Databricks Git folder) runs it from the driver's working directory; any other
node runs the code and configs the driver sends with the tasks. Data paths must be readable where the tasks run
(on a cluster the driver asks its executors first).
Rank 0 alone tracks (Databricks' MLflow there, else what scripts.train uses) and writes files. This process prints
rank 0's `test_acc`, or the error of the task that failed in one line and exits 1.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jsonargparse import Namespace

if __package__ in (None, ""):  # run as a file (a Databricks job's Python script task): the checkout is the package root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if Path.cwd() == Path(__file__).resolve().parent:  # Databricks runs a script from its own folder: code runs from
        os.chdir(Path(__file__).resolve().parents[1])  # the repository's root, as everywhere else

from scripts.training.spark_cluster import (  # noqa: E402 (the checkout is on sys.path from here)
    SparkFitError,
    check_fit_inputs,
    check_score_paths,
    check_slots,
    local_slots,
    registry_environment,
    session_slots,
)

REPOSITORY = Path(__file__).resolve().parents[1]
# What a failing task prints, one line, for this process to report; TorchDistributor streams task output here. The
# time orders failures: a rank that fails first takes the others down (their collectives lose a peer), and the log
# stream does not keep the order of lines from different tasks.
TASK_FAILED = "spark task failed on rank"
TASK_FAILED_LINE = re.compile(rf"{TASK_FAILED} (\d+) at ([\d.]+): (.*)")
LAUNCH_OPTIONS = ("--trainer.devices", "--trainer.num_nodes")  # set here from --num_processes and the GPUs
# The master URLs Spark takes (SparkContext's own forms), checked before a JVM starts: Spark's answer to another is a
# 75-line Java and Python traceback after the JVM's start.
MASTER_URL = re.compile(
    r"local|local\[(\d+|\*)(,\s*\d+)?\]|local-cluster\[\d+,\s*\d+,\s*\d+\]|yarn"
    r"|(spark|k8s|mesos)://\S+|sc://\S+"
)
# What the tasks print once one has failed: torch's and torchrun's tracebacks and reports, dozens of lines a task. They
# go to the log file alone; the console keeps the line naming the failure. `exitcode: -9` is torchrun's word for a
# process killed by a signal (the OOM killer's SIGKILL), reported for the rank its `rank:` line named.
FAILURE_STARTS = re.compile(r"\[rank\d+\]: Traceback|Traceback \(most recent call last\)|E\d{4} .* failed \(exitcode")
TORCHRUN_RANK = re.compile(r"\s*rank\s*:\s*(\d+)")
TORCHRUN_SIGNAL = re.compile(r"\s*exitcode\s*:\s*-(\d+)\b")
CODE_FOLDERS = ("configs", "datamodules", "lightning_modules", "strategies", "scripts")  # what a task needs to fit


@dataclass
class Launch:
    """How N processes map onto Spark tasks and the Trainer: `devices` processes (GPUs) per task, `num_nodes` tasks."""

    num_processes: int
    use_gpu: bool
    devices: int
    num_nodes: int
    strategy: str | None  # set when the config leaves it to Lightning ("auto")

    def trainer_args(self) -> list[str]:
        args = ["--trainer.accelerator", "gpu" if self.use_gpu else "cpu"]
        args += ["--trainer.devices", str(self.devices), "--trainer.num_nodes", str(self.num_nodes)]
        return args + (["--trainer.strategy", self.strategy] if self.strategy else [])


def split_options(argv: list[str]) -> tuple[int, str | None, list[str]]:
    """--num_processes and --master out of the command line; the rest is scripts.train's `fit` and its options."""
    values: dict[str, str] = {}
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in ("--num_processes", "--master"):
            values[name] = value if equals else next(args, "")
        else:
            rest.append(arg)
    if not rest or rest[0] != "fit":
        given = rest[0] if rest else "nothing"
        raise SparkFitError(
            f"scripts.spark runs fit or score (given: {given}); validate, test and predict a checkpoint with "
            "scripts.train"
        )
    number = values.get("--num_processes", "")
    if not number.isdigit() or int(number) < 1:
        given = number or "(missing)"
        raise SparkFitError(f"--num_processes {given}: give the number of processes to train, 1 or more")
    for arg in rest:
        if arg.split("=")[0] in LAUNCH_OPTIONS:
            raise SparkFitError(
                f"{arg.split('=')[0]}: the Spark launcher sets devices x num_nodes from --num_processes and the GPUs "
                "of a task; leave it out"
            )
    master = values.get("--master") or None
    if master is not None and not MASTER_URL.fullmatch(master):
        raise SparkFitError(
            f"--master {master}: not a Spark master URL; give local[N], local-cluster[W,C,M] (W workers of C cores "
            "and M MB), spark://HOST:PORT, yarn or k8s://HOST:PORT"
        )
    return int(number), master, rest[1:]


def resolve_trainer(args: list[str]) -> Namespace:
    """The `fit` config as scripts.train parses it (a bad option is one line here, before Spark runs anything); nothing
    is built, no data read."""
    import logging
    import warnings

    from jsonargparse import ArgumentError

    from scripts.training.cli import USER_ERRORS, TemplateCLI, cli_main
    from scripts.training.cli_errors import config_error_line

    class Parsed(Exception):
        def __init__(self, config) -> None:
            self.config = config

    class ParseOnly(TemplateCLI):
        def before_instantiate_classes(self) -> None:
            raise Parsed(self.config[self.subcommand])

    warnings.filterwarnings("ignore", "LightningCLI's args parameter")  # sys.argv is scripts.spark's, args its part
    seed_log = logging.getLogger("lightning.fabric.utilities.seed")  # the tasks seed; here it would be noise
    level = seed_log.level
    seed_log.setLevel(logging.WARNING)
    try:
        cli_main(["fit", *args], cli_class=ParseOnly)
    except Parsed as parsed:
        return parsed.config
    except ArgumentError as error:
        raise SparkFitError(config_error_line(error, args)) from None
    except USER_ERRORS as error:  # a --ckpt_path that is not a checkpoint, say
        raise SparkFitError(str(error).strip()) from None
    finally:
        seed_log.setLevel(level)
    raise SparkFitError("the config did not parse")  # --help and --print_config exit before this


def strategy_name(trainer) -> str:
    """The Trainer's strategy as given: a name ("auto", "ddp") or a class path."""
    return trainer.strategy if isinstance(trainer.strategy, str) else str((trainer.strategy or {}).get("class_path"))


def check_launcher(trainer) -> None:
    """Refuses what Spark's torch.distributed processes cannot run: Horovod, mpirun's environment, other devices."""
    if "horovod" in strategy_name(trainer).lower():
        raise SparkFitError(
            "configs/trainer/horovod.yaml: TorchDistributor starts torch.distributed processes; Horovod needs "
            "horovodrun or mpirun: leave the Horovod preset out (DDP trains the same weights)"
        )
    if "MPIEnvironment" in str(trainer.plugins):
        raise SparkFitError(
            "configs/trainer/ddp_mpi.yaml: Spark starts the processes with torch.distributed's variables, not mpirun; "
            "leave the preset out"
        )
    if str(trainer.accelerator) not in ("auto", "cpu", "gpu", "cuda"):
        raise SparkFitError(f"--trainer.accelerator {trainer.accelerator}: Spark tasks train on cpu or gpu")


def plan_launch(trainer, num_processes: int, task_gpus: int) -> Launch:
    """Devices x num_nodes, accelerator and strategy for N processes on tasks that Spark gives `task_gpus` GPUs each."""
    check_launcher(trainer)
    accelerator = str(trainer.accelerator)
    use_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and task_gpus >= 1)
    if use_gpu and task_gpus < 1:
        raise SparkFitError(
            f"--trainer.accelerator {accelerator}: this Spark cluster gives its tasks no GPU; set "
            "spark.task.resource.gpu.amount 1 in its Spark config (a GPU cluster), or give --trainer.accelerator cpu"
        )
    if use_gpu and num_processes % task_gpus:
        raise SparkFitError(
            f"--num_processes {num_processes}: each Spark task gets {task_gpus} GPUs (spark.task.resource.gpu.amount); "
            f"give a multiple of {task_gpus}"
        )
    per_task = task_gpus if use_gpu else 1
    strategy = "ddp" if strategy_name(trainer) == "auto" else None
    return Launch(num_processes, use_gpu, per_task, num_processes // per_task, strategy)


def task_gpus(spark) -> int:
    """GPUs Spark gives each task (spark.task.resource.gpu.amount); TorchDistributor reads it as a whole number."""
    amount = spark.conf.get("spark.task.resource.gpu.amount", "0") or "0"
    if not amount.isdigit():  # a fraction (several tasks per GPU) is TorchDistributor's ValueError
        raise SparkFitError(
            f"spark.task.resource.gpu.amount {amount}: TorchDistributor runs whole GPUs per task; set 1 (one process "
            "per GPU) in the Spark config of the cluster that trains"
        )
    return int(amount)


class LocalSpark:
    """A Spark session this process starts itself (not on Databricks, Synapse or under spark-submit), on loopback.

    local-cluster masters (separate executor processes, as on a real cluster) need a Spark home: the executors' work
    folders go there, so it is a temporary folder of links to pyspark's own, not pyspark's package folder.
    """

    def __init__(self, master: str) -> None:
        import pyspark

        self.home: str | None = None
        if master.startswith("local-cluster") and "SPARK_HOME" not in os.environ:
            package = Path(pyspark.__file__).parent
            self.home = tempfile.mkdtemp(prefix="spark-home-")
            for name in ("bin", "jars", "python", "sbin"):
                os.symlink(package / name, Path(self.home) / name)
            os.environ["SPARK_HOME"] = self.home
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this environment's Python
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # master, workers and executors on loopback
        from pyspark.sql import SparkSession

        try:
            self.session = self._start(SparkSession, master)
        except Exception as error:  # no Java, a master that does not answer: Spark's answer is a Java trace
            self.stop()
            text = str(error)
            reason = re.search(r"^: (?:[\w.]+Exception: )?(.*)$", text, re.M)
            line = reason[1] if reason else (text.strip().splitlines() or [type(error).__name__])[0]
            raise SparkFitError(
                f"Spark did not start on {master} ({line.strip().rstrip('.')}); check --master, and Java 17 (`java "
                "-version`, JAVA_HOME)"
            ) from None
        # Its executors log a failed task's Java and Python traces at ERROR, here on this console; the task's own line
        # and Spark's exception (kept in the fit's log file) say what failed.
        self.session.sparkContext.setLogLevel("OFF")

    @staticmethod
    def _start(SparkSession, master: str):  # noqa: N803 (the class, imported where pyspark is needed)
        return (
            SparkSession.builder.master(master)
            .appName("lightning-template")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            # Start the job once every executor has registered: the barrier stage needs all N slots at once.
            .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
            .config("spark.log.level", "OFF")  # from the start: a failed start's own ERROR lines and Java trace
            .getOrCreate()
        )

    def stop(self) -> None:
        if getattr(self, "session", None) is not None:
            self.session.stop()
        if self.home:
            shutil.rmtree(self.home, ignore_errors=True)
            os.environ.pop("SPARK_HOME", None)


def session(spark, master: str | None, default_master: str, processes: int | None = None):
    """(the session, the LocalSpark this process started or None): `spark` if given, else the one this process has
    (a notebook, spark-submit, the pyspark shell), else a new one on `master` (default: `default_master`), whose
    slots are checked against `processes` before the JVM starts."""
    from pyspark.sql import SparkSession

    spark = spark or SparkSession.getActiveSession()
    if spark is None and "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit or the pyspark shell: theirs
        spark = SparkSession.builder.getOrCreate()
    if spark is not None and master:
        raise SparkFitError(f"--master {master}: this process already has a Spark session; leave --master out")
    if spark is not None:
        return spark, None
    if processes:  # spark.task.cpus is the JVM's to read: 1 until it runs
        check_slots(local_slots(master or default_master), processes)
    local = LocalSpark(master or default_master)  # plain python: a session on this machine, or on --master
    return local.session, local


def tracking_environment(logger) -> dict[str, str]:
    """The MLflow variables this process has, for the tasks (executors do not share the driver's environment); on
    Databricks, its own tracking and the credentials executors need to reach it."""
    environment = {key: value for key, value in os.environ.items() if key.startswith("MLFLOW_")}
    if "DATABRICKS_RUNTIME_VERSION" not in os.environ or "MLFlowLogger" not in str(getattr(logger, "class_path", "")):
        return environment
    init_args = logger.init_args or {}
    tracking_uri = init_args.get("tracking_uri") or environment.get("MLFLOW_TRACKING_URI") or "databricks"
    if tracking_uri.split(":")[0] != "databricks":
        return environment
    experiment = str(init_args.get("experiment_name") or "")
    if not experiment.startswith("/"):
        raise SparkFitError(
            f"experiment_name {experiment!r}: Databricks keeps experiments at workspace paths; give "
            f"--trainer.logger.init_args.experiment_name /Users/<you>/{experiment or 'penguins'}"
        )
    from mlflow.utils.databricks_utils import get_databricks_host_creds

    credentials = get_databricks_host_creds(tracking_uri)  # the notebook's or job's own; executors have none
    environment["MLFLOW_TRACKING_URI"] = tracking_uri
    environment |= {"DATABRICKS_HOST": credentials.host, "DATABRICKS_TOKEN": credentials.token or ""}
    return environment


class TaskErrors:
    """This process's stderr while the tasks run. TorchDistributor writes the lines its tasks print there; all of them
    go to `log` (a file), and to the console until a task fails: what follows a failure is tracebacks. The lines that
    say a task failed (TASK_FAILED) are kept, as (time, rank, message), and the ranks torchrun reports killed by a
    signal, as (time, rank, signal), to report the failure that came first in one line."""

    def __init__(self, stream, log=None) -> None:
        self.stream, self.log = stream, log
        self.failures: list[tuple[float, int, str]] = []
        self.killed: list[tuple[float, int, int]] = []
        self.muted = False
        self._partial = ""
        self._rank: int | None = None

    def write(self, text: str) -> int:
        if self.log is not None:
            self.log.write(text)
            self.log.flush()
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            failed = TASK_FAILED_LINE.search(line)
            if failed:
                self.failures.append((float(failed[2]), int(failed[1]), failed[3]))
            if rank := TORCHRUN_RANK.match(line):
                self._rank = int(rank[1])
            elif (killed := TORCHRUN_SIGNAL.match(line)) and self._rank is not None:
                self.killed.append((time.time(), self._rank, int(killed[1])))
            self.muted = self.muted or bool(failed or FAILURE_STARTS.match(line))
            if not self.muted:
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def failure_line(error: Exception, failures: list[tuple[float, int, str]], killed=()) -> str:
    """One line for a Spark job that failed: a rank killed by SIGKILL (the others then fail for the lost peer), else
    an executor Spark lost, else the task error or kill that came first, else Spark's reason (no Java trace)."""
    text = str(error)
    sigkilled = [kill for kill in killed if kill[2] == signal.SIGKILL]
    lost = re.search(r"ExecutorLostFailure \(([^)]*)\)", text)
    events = sorted(
        [
            *((at, rank, message) for at, rank, message in failures),
            *((at, rank, f"killed by signal {number} ({signal_name(number)})") for at, rank, number in killed),
        ]
    )
    if sigkilled:
        _, rank, number = min(sigkilled)
        return (
            f"rank {rank} of the Spark fit was killed by signal {number} ({signal_name(number)}: out of memory, or "
            "stopped from outside); the other ranks stopped for its loss"
        )
    if lost:
        return f"the Spark fit lost an executor ({lost[1]}): out of memory, or stopped from outside"
    if events:
        _, rank, message = events[0]
        return f"rank {rank} of the Spark fit: {message}"
    reason = re.search(r"Job aborted due to stage failure: ([^\n]*)", text)
    line = reason[1] if reason else next((line for line in text.splitlines() if line.strip()), type(error).__name__)
    return f"the Spark fit failed: {line.strip()} (see the executors' logs)"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def task_log(default_root_dir: str | None) -> Path:
    """A new file for the tasks' whole output, under the fit's root folder (outputs/spark-logs/)."""
    folder = Path(default_root_dir or "outputs") / "spark-logs"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # the fit's own check names an unwritable root; the log goes to the temporary folder
        folder = Path(tempfile.gettempdir())
    return folder / f"fit-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


def pack_code(repository: Path = REPOSITORY) -> bytes:
    """This checkout's code and configs, zipped (~100 KB), for nodes that have no checkout at the driver's path."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for folder in CODE_FOLDERS:
            for path in sorted((repository / folder).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, path.relative_to(repository).as_posix())
    return buffer.getvalue()


def relative_outputs(config, environment: dict[str, str]) -> list[str]:
    """The `fit` config's outputs given as relative paths (the default `outputs` folder, a relative sqlite tracking
    URI, --model_dir, --metrics_file): on a node that runs the code the driver sent, they would land in the task's
    folder, which Spark removes with the application."""
    trainer = config.trainer
    found = [f"--{option} {config[option]}" for option in ("model_dir", "metrics_file")
             if config.get(option) and not Path(str(config[option])).is_absolute()]  # fmt: skip
    if not Path(str(trainer.default_root_dir or "outputs")).is_absolute():
        found.insert(0, f"--trainer.default_root_dir {trainer.default_root_dir or 'outputs'}")
    given = str((getattr(trainer.logger, "init_args", None) or {}).get("tracking_uri") or "")
    tracking = given or environment.get("MLFLOW_TRACKING_URI", "")
    if tracking.startswith("sqlite:///") and not tracking.startswith("sqlite:////"):
        found.append(f"{'--trainer.logger.init_args.tracking_uri' if given else 'MLFLOW_TRACKING_URI'} {tracking}")
    return found


def start_in_task(
    repository: str,
    workdir: str,
    code: bytes,
    args: list[str],
    environment: dict[str, str],
    relative: list[str] | None = None,
):
    """What TorchDistributor runs in every process of every task. Pickled by value: the executor's Python knows no
    module of this checkout until its folder is on the path.

    The checkout at the driver's path when this node has it (this machine, a Databricks Git folder); else the `code`
    the driver sent (a Synapse pool, YARN, Kubernetes), unpacked once per node into the task's folder, which Spark
    removes with the application. The working directory is the driver's, or its place in the unpacked checkout; there
    the fit's `relative` outputs (relative_outputs) would go with the folder: the task refuses them before training.
    """
    import hashlib
    import io
    import os
    import shutil
    import sys
    import tempfile
    import zipfile

    refusal = None
    if not os.path.isfile(os.path.join(repository, "scripts", "spark.py")):
        unpacked = os.path.abspath(f"lightning-template-code-{hashlib.sha256(code).hexdigest()[:16]}")
        if not os.path.isdir(unpacked):
            staging = tempfile.mkdtemp(dir=os.path.dirname(unpacked))
            zipfile.ZipFile(io.BytesIO(code)).extractall(staging)
            try:
                os.rename(staging, unpacked)
            except OSError:  # another process of this task unpacked it first
                shutil.rmtree(staging, ignore_errors=True)
        inside = os.path.relpath(workdir, repository)
        if not os.path.isdir(workdir):
            workdir = os.path.join(unpacked, inside if not inside.startswith("..") else ".")
            if relative:
                refusal = (
                    f"{relative[0]}: a relative path, and this node runs the code the driver sent from the task's "
                    "folder, which Spark removes with the application (checkpoints and MLflow run with it); give an "
                    "absolute path on storage that outlives the cluster (the pool's mounted storage, /dbfs, /Volumes)"
                )
        repository = unpacked
    sys.path.insert(0, repository)
    from scripts.spark import fit_in_task

    return fit_in_task(workdir, args, environment, refusal)


def fit_in_task(workdir: str, args: list[str], environment: dict[str, str], refusal: str | None = None) -> dict | None:
    """scripts.train's fit in this task's process, from `workdir`; global rank 0 returns its results. A `refusal`
    fails the task with it, as the fit's own errors do."""
    os.environ.update(environment)
    rank = int(os.environ.get("RANK", "0"))
    try:
        if refusal:
            sys.exit(refusal)
        os.chdir(workdir)
        from scripts.train import main

        cli = main(["fit", *args])
    except SystemExit as stop:
        if stop.code in (None, 0):
            return None
        message = stop.code if isinstance(stop.code, str) else f"stopped with exit status {stop.code}"
        print(
            f"{TASK_FAILED} {rank} at {time.time():.3f}: {message.removeprefix('error: ')}", file=sys.stderr, flush=True
        )
        raise SystemExit(1) from None
    except BaseException as error:
        first = (str(error).strip().splitlines() or [""])[0]
        print(
            f"{TASK_FAILED} {rank} at {time.time():.3f}: {type(error).__name__}: {first}", file=sys.stderr, flush=True
        )
        raise
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        # The processes of one task share the file TorchDistributor returns: only local rank 0 may write it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if rank != 0:
        return None
    trainer = cli.trainer
    checkpoint = trainer.checkpoint_callback
    test_acc = trainer.callback_metrics.get("test_acc") if cli.config.fit.test_after_fit else None
    return {
        "test_acc": None if test_acc is None else float(test_acc),
        "best_checkpoint": checkpoint.best_model_path if checkpoint else "",
        "run_id": getattr(trainer.logger, "run_id", None),
    }


def fit_on_spark(argv: list[str], spark=None) -> dict:
    """Runs the fit of `argv` (scripts.spark's command line) on `spark` or the session this process has or starts;
    returns rank 0's results (test_acc, best_checkpoint, run_id). Raises SparkFitError with the line to print."""
    num_processes, master, args = split_options(argv)
    config = resolve_trainer(args)
    check_launcher(config.trainer)  # before any Spark start; the GPUs of a task are known once a session is there
    from pyspark import cloudpickle

    spark, local = session(spark, master, f"local[{num_processes}]", processes=num_processes)
    try:
        launch = plan_launch(config.trainer, num_processes, task_gpus(spark))
        check_slots(session_slots(spark), num_processes, launch.num_nodes)
        if local_slots(spark.conf.get("spark.master", "") or "") is None:  # executors elsewhere, not on this disk
            check_fit_inputs(spark, config)
        environment = registry_environment(config, tracking_environment(config.trainer.logger), spark)
        from pyspark.ml.torch.distributor import TorchDistributor

        distributor = TorchDistributor(num_processes=num_processes, local_mode=False, use_gpu=launch.use_gpu)
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        task_args = [*args, *launch.trainer_args()]
        log_path = task_log(config.trainer.default_root_dir)
        with log_path.open("w") as log:
            errors = TaskErrors(sys.stderr, log)
            sys.stderr = errors
            try:
                code = pack_code()
                relative = relative_outputs(config, environment)
                result = distributor.run(
                    start_in_task, str(REPOSITORY), os.getcwd(), code, task_args, environment, relative
                )
            except Exception as error:
                log.write(f"\n{type(error).__name__}: {error}\n")  # Spark's own report, its Java trace with it
                line = failure_line(error, errors.failures, errors.killed)
                raise SparkFitError(f"{line} (the tasks' whole output: {log_path})") from None
            finally:
                sys.stderr = errors.stream
        if result is None:
            raise SparkFitError(f"rank 0 of the Spark fit returned no result (the tasks' whole output: {log_path})")
        if errors.muted:  # a traceback that did not stop the fit: what followed it is in the log alone
            print(f"a task printed a traceback; the tasks' whole output: {log_path}", file=sys.stderr)
        else:
            log_path.unlink()  # a fit that finished: its output was on the console
            with contextlib.suppress(OSError):  # spark-logs/ goes too when it holds no other fit's
                log_path.parent.rmdir()
        return result
    finally:
        if local:
            local.stop()


def score_on_spark(argv: list[str], spark=None) -> dict:
    """Runs `score MODEL INPUT [--output DIR] [--label COLUMN] [--master MASTER]` (argv without `score`) on `spark`
    or the session this process has or starts; returns {"rows", "accuracy"}. Raises SparkFitError with the line."""
    from scripts.serving.spark_score import SparkScoreError, check_arguments, score

    model_uri, path, values = split_score_options(argv)
    try:
        check_arguments(model_uri, path, values.get("--output"))
        spark, local = session(spark, values.get("--master"), "local[*]")
        try:
            if local_slots(spark.conf.get("spark.master", "") or "") is None:  # executors elsewhere, not on this disk
                check_score_paths(spark, path, values.get("--output"))
            return score(spark, model_uri, path, values.get("--output"), values.get("--label"))
        finally:
            if local:
                local.stop()
    except SparkScoreError as error:
        raise SparkFitError(str(error)) from None


def split_score_options(argv: list[str]) -> tuple[str, str, dict[str, str]]:
    """(model, input, {option: value}) of score's command line (without `score`); nothing checked on disk."""
    from scripts.serving.spark_score import SPARK_OPTIONS

    values: dict[str, str] = {}
    positional: list[str] = []
    args = iter(argv)
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in SPARK_OPTIONS:
            values[name] = value if equals else next(args, "")
        elif arg.startswith("--"):
            raise SparkFitError(f"{name}: score takes {', '.join(SPARK_OPTIONS)} (python -m scripts.spark --help)")
        else:
            positional.append(arg)
    if len(positional) != 2:
        raise SparkFitError("score takes a model and an input: score MODEL CSV_OR_FOLDER [--output DIR]")
    return positional[0], positional[1], values


USAGE = """usage: python -m scripts.spark fit --num_processes N [--master MASTER] [scripts.train fit options]
       python -m scripts.spark score MODEL CSV_OR_FOLDER [--output DIR] [--label COLUMN] [--master MASTER]

fit: a task on Spark, one DDP process per Spark barrier task, started by TorchDistributor.
score: a CSV of rows or a folder of images with a registered MLflow model (models:/NAME/VERSION, runs:/ID/model, a
folder), through mlflow.pyfunc.spark_udf; writes the predictions as CSV to --output (a new folder) and prints the
accuracy when the inputs carry their answer (the CSV's --label column; images in folders named by class).

options:
  -h, --help            show this help and exit; `fit --help` adds scripts.train fit's options
  --num_processes N     processes to train (Spark barrier tasks x the GPUs of a task), 1 or more
  --master MASTER       the Spark master when this process has no session (default local[N]),
                        e.g. local-cluster[2,1,1024] or spark://host:7077
  every other option is scripts.train fit's (--config, --trainer.*, --data.*, --model.*), except
  --trainer.devices and --trainer.num_nodes, which --num_processes sets
"""


def main(argv: list[str] | None = None) -> None:
    """Prints rank 0's best checkpoint, MLflow run and test_acc; a failure is one line on stderr and exit status 1."""
    argv = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in argv):
        print(USAGE)
        if argv[:1] == ["fit"]:
            from scripts.training.cli import cli_main

            print("scripts.train fit's options:", flush=True)
            sys.argv[1:] = ["fit", "--help"]  # from sys.argv: LightningCLI warns of args given beside it
            cli_main()  # prints them and exits 0
        return
    if argv[:1] == ["score"]:
        try:
            result = score_on_spark(argv[1:])
        except SparkFitError as error:
            sys.exit(f"error: {error}")
        print(f"scored {result['rows']} inputs")
        if result["accuracy"] is not None:
            print(f"accuracy: {result['accuracy']:.4f}")
        return
    try:
        result = fit_on_spark(argv)
    except SparkFitError as error:
        sys.exit(f"error: {error}")
    if result.get("best_checkpoint"):
        print(f"best checkpoint: {result['best_checkpoint']} (on the node of rank 0)")
    if result.get("run_id"):
        print(f"mlflow run: {result['run_id']}")
    if result.get("test_acc") is not None:
        print(f"test_acc: {result['test_acc']:.4f}")


if __name__ == "__main__":
    main()
