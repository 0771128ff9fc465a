"""What runs inside each Spark task of `python -m scripts.spark fit`: TorchDistributor's entry (pickled by value on the
driver), which finds or unpacks this checkout on the executor's node and runs scripts.train's fit there, and what the
driver gives it: the code zipped, the MLflow variables, the fit's relative output paths.

    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2
"""

from __future__ import annotations

import gc
import io
import os
import sys
import time
import zipfile
from pathlib import Path

from scripts.spark.cluster import SparkFitError

REPOSITORY = Path(__file__).resolve().parents[2]
# What a failing task prints, one line, for this process to report; TorchDistributor streams task output here. The
# time orders failures: a rank that fails first takes the others down (their collectives lose a peer), and the log
# stream does not keep the order of lines from different tasks.
TASK_FAILED = "spark task failed on rank"
CODE_FOLDERS = ("configs", "datamodules", "lightning_modules", "strategies", "scripts")  # what a task needs to fit


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


def pack_code(repository: Path = REPOSITORY) -> bytes:
    """This checkout's code and configs, zipped, for nodes that have no checkout at the driver's path."""
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
    if not os.path.isfile(os.path.join(repository, "scripts", "spark", "task.py")):
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
    from scripts.spark.task import fit_in_task

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
    finally:
        # The process ends with its fit: Python's last collections at exit walked every object torch, Lightning and
        # MLflow made, seconds a task that its barrier stage waited on (docs/measured.md). Frozen, they are skipped.
        gc.freeze()
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
