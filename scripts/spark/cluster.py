"""What a Spark cluster can run and see, checked on the driver before any task starts (scripts.spark fit and score):
its task slots against the barrier stage's tasks, the data of the driver's disk that the executors do not see, and
the model registry the tasks register in."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


class SparkFitError(Exception):
    """A fit on Spark that cannot start or failed; the message is the one line to print."""


# A path Spark reads through a file system of its own: dbfs:/..., file:/... (Spark's own spelling of local files),
# abfss://...; checked there, not on this disk.
URI = re.compile(r"^[A-Za-z][\w+.-]+:/")


@dataclass
class Slots:
    """The task slots of a Spark cluster, as Spark counts them for a barrier stage: executors x the tasks one executor
    runs at once (its cores / spark.task.cpus, and its GPUs / spark.task.resource.gpu.amount where tasks take GPUs)."""

    where: str  # "the master local[2]", "this cluster"
    executors: int
    cores: int  # of each executor
    task_cpus: int = 1
    gpus: int | None = None  # of each executor, where tasks take GPUs
    task_gpus: int = 0

    @property
    def count(self) -> int:
        per_executor = self.cores // self.task_cpus
        if self.gpus is not None and self.task_gpus:
            per_executor = min(per_executor, self.gpus // self.task_gpus)
        return self.executors * per_executor

    def arithmetic(self) -> str:
        executors = f"{self.executors} executor{'s' if self.executors != 1 else ''}"
        text = f"{executors} x ({self.cores} cores // spark.task.cpus {self.task_cpus})"
        if self.gpus is not None and self.task_gpus:
            text += f", GPUs: {self.gpus} // spark.task.resource.gpu.amount {self.task_gpus}"
        return text


def local_slots(master: str, task_cpus: int = 1) -> Slots | None:
    """The slots of a local master (local, local[K], local[*], local-cluster[W,C,M]); None for a cluster's."""
    where = f"the master {master}"
    if master == "local":
        return Slots(where, 1, 1, task_cpus)
    if found := re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master):
        return Slots(where, 1, (os.cpu_count() or 1) if found[1] == "*" else int(found[1]), task_cpus)
    if found := re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*(\d+)\]", master):
        return Slots(where, int(found[1]), int(found[2]), task_cpus)
    return None


def spark_context(spark):
    """The session's SparkContext; None for a Spark Connect session (sc://, a Databricks shared cluster)."""
    from pyspark.errors import PySparkException

    try:
        return spark.sparkContext
    except (PySparkException, AttributeError):
        return None


def session_slots(spark) -> Slots | None:
    """The slots of the session's master: a local one's from its URL, a cluster's from its executors."""
    task_cpus = int(spark.conf.get("spark.task.cpus", "1") or "1")
    return local_slots(spark.conf.get("spark.master", "") or "", task_cpus) or cluster_slots(spark)


def cluster_slots(spark) -> Slots | None:
    """The slots of the executors registered now; None where Spark may add executors (dynamic allocation) or the
    cores of one are not known, or under Spark Connect (no executors to count from the client)."""
    context = spark_context(spark)
    conf = context.getConf() if context is not None else None
    if conf is None or conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        return None
    # pyspark has no executor list; Scala's SparkContext.getExecutorMemoryStatus (public) has one block manager per
    # executor, and the driver's.
    executors = context._jsc.sc().getExecutorMemoryStatus().size() - 1
    cores = conf.get("spark.executor.cores")
    if cores is None and conf.get("spark.default.parallelism") is None and executors > 0:
        cores = context.defaultParallelism // executors  # the executors' cores, all told, when nothing overrides it
    if executors < 1 or not cores:
        return None
    gpus = conf.get("spark.executor.resource.gpu.amount")
    task_gpus = conf.get("spark.task.resource.gpu.amount", "0") or "0"  # a whole number: task_gpus checked it
    task_cpus = int(conf.get("spark.task.cpus", "1") or "1")
    return Slots("this cluster", executors, int(cores), task_cpus, int(gpus) if gpus else None, int(task_gpus))


def check_slots(slots: Slots | None, num_processes: int, tasks: int | None = None) -> None:
    """Refuses more Spark tasks than the cluster runs at once: Spark waits for slots a barrier stage cannot get
    (40 tries, 15 s apart), then fails the job."""
    tasks = num_processes if tasks is None else tasks
    if slots is None or slots.count >= tasks:
        return
    per_task = f" ({num_processes // tasks} processes each)" if tasks != num_processes else ""
    fix = (
        f"give --master local[{tasks * slots.task_cpus}] (or local-cluster[{tasks},{slots.task_cpus},1024])"
        if slots.where.startswith("the master local")
        else "give the cluster more executors or cores, lower spark.task.cpus, or fewer --num_processes"
    )
    raise SparkFitError(
        f"--num_processes {num_processes}: its {tasks} Spark task{'s' if tasks != 1 else ''}{per_task} run at once "
        f"(a barrier stage), and {slots.where} has {slots.count} task slot{'s' if slots.count != 1 else ''} "
        f"({slots.arithmetic()}); {fix}"
    )


# The datamodule arguments that name data on disk (as scripts/azure_ml/components.py's DATA_OPTIONS, and birds'
# archive), read by every task.
DATA_PATHS = ("data_dir", "csv_path", "archive")
SHARED_PATHS = (
    "/Volumes/... or /dbfs/... on Databricks, the pool's mounted storage (/synfs/...) on Synapse, a shared folder on a "
    "cluster of your own"
)


def fit_inputs(config) -> dict[str, str]:
    """The files and folders of this disk that every task of the fit reads ({option: path}): the datamodule's data
    paths and --ckpt_path, those that exist here (a missing one is the tasks' to fetch, or to name in their error)."""
    data = (config.get("data") or {}).get("init_args") or {}
    given = {f"--data.init_args.{name}": data.get(name) for name in DATA_PATHS}
    given["--ckpt_path"] = config.get("ckpt_path")
    return {option: str(path) for option, path in given.items()
            if path and not URI.match(str(path)) and os.path.exists(path)}  # fmt: skip


def unseen_paths(spark, paths: dict[str, str]) -> tuple[str, str, str, str] | None:
    """(key, host, what this process has at the path, what an executor there has) for the first of `paths` ({key:
    path of this disk}) that an executor does not see as this process does: nothing there, or a file of another size;
    None when every executor sees them all (or under Spark Connect, unasked). One small Spark job, a task per core of
    the cluster."""
    wanted = {key: os.path.abspath(path) for key, path in paths.items()}

    def look(_):  # runs in the executors: pickled by value, it needs nothing of this checkout
        import os
        import socket

        def what(path: str) -> str:
            if os.path.isfile(path):
                return f"a file of {os.path.getsize(path)} bytes"
            return "a folder" if os.path.isdir(path) else "nothing"

        yield socket.gethostname(), {key: what(path) for key, path in wanted.items()}

    _, here = next(look(None))
    context = spark_context(spark)
    if context is None:  # Spark Connect: no RDD job to ask the executors with
        return None
    tasks = max(context.defaultParallelism, 1)
    for host, seen in context.parallelize(range(tasks), tasks).mapPartitions(look).collect():
        for key in wanted:
            if seen[key] != here[key]:
                return key, host, here[key], seen[key]
    return None


def check_fit_inputs(spark, config) -> None:
    """Refuses data of this disk that the executors do not see: the tasks would fail on it late, or read another file
    of the same name."""
    inputs = fit_inputs(config)
    if inputs and (unseen := unseen_paths(spark, inputs)):
        option, host, here, there = unseen
        raise SparkFitError(
            f"{option} {inputs[option]}: {here} on this machine, {there} on the executor on {host} (the tasks read "
            f"their data where they run); give a path every node reads: {SHARED_PATHS}"
        )


def registry_environment(config, environment: dict[str, str], spark) -> dict[str, str]:
    """`environment` with the registry that --register_model registers in, as this process would: set by
    mlflow.set_registry_uri (MLFLOW_REGISTRY_URI, already there) or Databricks' spark.mlflow.modelRegistryUri (the
    tasks have no session to read it from), else MLflow's default for the tracking URI (Unity Catalog, databricks-uc,
    for Databricks'). Unity Catalog names a model catalog.schema.model; MLflow completes a shorter name from the
    session's catalog and schema, which the tasks lack: the registry would refuse it after the whole fit."""
    name = str(config.get("register_model") or "")
    if not name:
        return environment
    registry = environment.get("MLFLOW_REGISTRY_URI") or spark.conf.get("spark.mlflow.modelRegistryUri", None) or ""
    if registry:
        environment = {**environment, "MLFLOW_REGISTRY_URI": registry}
    logger = config.trainer.logger
    tracking = str((getattr(logger, "init_args", None) or {}).get("tracking_uri") or "")
    tracking = tracking or environment.get("MLFLOW_TRACKING_URI", "")
    unity = registry.startswith("databricks-uc") or (not registry and tracking.startswith("databricks"))
    if unity and len(parts := name.split(".")) < 3:
        catalog, schema = spark.catalog.currentCatalog(), spark.catalog.currentDatabase()
        if catalog in ("spark_catalog", "hive_metastore"):  # no Unity Catalog catalog in use: its usual ones
            catalog, schema = "main", "default"
        why = f"MLFLOW_REGISTRY_URI {registry}" if registry else f"MLflow's default registry for {tracking}"
        raise SparkFitError(
            f"--register_model {name}: the tasks register in Unity Catalog ({why}), which names models "
            "catalog.schema.model, and have no Spark session to complete a shorter name from; give --register_model "
            f"{'.'.join([catalog, schema][: 3 - len(parts)] + parts)}"
        )
    return environment
