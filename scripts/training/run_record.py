"""The run's record in MLflow: which store and run a command logs to (Azure ML's run handover, MLFLOW_TRACKING_URI, a
checked server, or the sqlite store outputs/mlflow.db, made safely by processes started together), and what the run
keeps besides metrics: the resolved config (as config.yaml beside the checkpoints and in MLflow, and as parameters,
once, under the config's dotted names), the metrics not yet sent in each checkpoint, and no record at all of a run
that failed before measuring anything. scripts.train's CLI uses it for every command:

    python -m scripts.train fit --config configs/penguins.yaml    # a run in outputs/mlflow.db
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import lightning as L
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from scripts.training.checkpoints import CONFIG_KEY, flatten, keep_run_id
from scripts.training.tracking import BufferedMLFlowLogger

# Set by launchers that start the processes themselves (torchrun, Azure ML, mpirun, horovodrun, Lightning's own).
LAUNCHER_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK",
)  # fmt: skip
UNSENT_KEY = "unsent_metrics"  # a checkpoint's metrics that the local store did not have yet when it was written


def run_dir(trainer: L.Trainer) -> Path:
    """outputs/<experiment id>/<run id>: where checkpoints go, so a run's files sit together."""
    logger = trainer.logger
    if logger is None:
        return Path(trainer.default_root_dir)
    return Path(trainer.default_root_dir) / str(logger.name) / str(logger.version)


class TrackConfig(SaveConfigCallback):
    """The run's record: the resolved config beside the checkpoints and in MLflow (file and parameters), the metrics
    not sent yet in each checkpoint, and no record at all of a run that failed before measuring anything."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "predict":  # no run to file it under: it would overwrite outputs/config.yaml
            return
        # Checked when parsed: checking it again would cost a fifth of a sweep trial's CLI time (docs/measured.md).
        text = self.parser.dump(self.config, skip_unset=False, skip_validation=True)
        self.config_text = text
        path = run_dir(trainer) / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if isinstance(trainer.logger, MLFlowLogger):
            import yaml
            from mlflow.entities import Param

            params = flatten(yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))  # libyaml's: C
            params.pop("config", None)  # the paths of the YAML files: the artifact says it all
            # A resumed run (--checkpoint_dir, a restarted Azure ML job) has its parameters; MLflow refuses changes
            # (a longer max_epochs, say): those are in the config.yaml logged below, which replaces the first one.
            client, run_id = trainer.logger.experiment, trainer.logger.run_id
            logger = trainer.logger
            with logger.store_errors() if isinstance(logger, BufferedMLFlowLogger) else contextlib.nullcontext():
                logged = client.get_run(run_id).data.params
                new = [Param(key, str(value)[:500]) for key, value in params.items() if key not in logged]
                for start in range(0, len(new), 100):  # MLflow's most parameters a request
                    client.log_batch(run_id, params=new[start : start + 100])
                client.log_artifact(run_id, str(path))
            if stage == "fit":
                keep_run_id(trainer, self.config.get("checkpoint_dir"), trainer.logger.run_id)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # The fit's config travels in its checkpoints: a resume compares its own with it (checkpoints.check_resume).
        if stage_config := getattr(self, "config_text", None):
            checkpoint[CONFIG_KEY] = stage_config
        # Called while a checkpoint is made, before it is written: a fit resumed from it has every metric logged so
        # far. The metrics not yet in a local store travel in the checkpoint (a synced sqlite write each epoch would
        # cost more than a small model's epoch); a server is sent them, and waited for, instead. What Lightning logs
        # after an epoch's checkpoints, the epoch's training metrics, travels in them (lightning_modules/classifier.py).
        logger = trainer.logger
        if isinstance(logger, BufferedMLFlowLogger) and logger.sender is None:
            checkpoint[UNSENT_KEY] = logger.unsent()
        elif isinstance(logger, BufferedMLFlowLogger):
            logger.flush(wait=True, stop=lambda: sigterm_received(trainer))

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if isinstance(trainer.logger, BufferedMLFlowLogger) and UNSENT_KEY in checkpoint:
            trainer.logger.resend(checkpoint[UNSENT_KEY])

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if type(exception).__name__ == "SIGTERMException" and trainer.is_global_zero:
            print(resume_line(trainer, self.config.get("checkpoint_dir")), file=sys.stderr)
        # A run that failed before measuring anything leaves no folder (its logger deletes its MLflow run).
        logger = trainer.logger
        if isinstance(logger, BufferedMLFlowLogger) and isinstance(exception, KeyboardInterrupt):
            logger.interrupted = True  # Lightning finalizes the run as failed next
        if not (isinstance(logger, BufferedMLFlowLogger) and trainer.is_global_zero and logger.started):
            return
        if logger.handed_over:  # a resumed run's folder holds its earlier epochs' record
            return
        folder = run_dir(trainer)
        if not logger.measured and not any(folder.glob("checkpoints/*")):
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):  # the experiment's folder, when this was its only run
                folder.parent.rmdir()


def resume_line(trainer: L.Trainer, checkpoint_dir: str | None) -> str:
    """What a fit stopped by SIGTERM says: where its last finished epoch is, and the command that goes on from it."""
    # last.ckpt's callback (checkpoints.py) first: it holds the newest epoch.
    newest = sorted(trainer.checkpoint_callbacks, key=lambda callback: getattr(callback, "filename", None) != "last")
    last = next((c.best_model_path for c in newest if getattr(c, "best_model_path", "")), "")
    if not last:
        return f"stopped by SIGTERM at epoch {trainer.current_epoch}, before any epoch finished: nothing to resume from"
    again = f"--checkpoint_dir {checkpoint_dir} (the same MLflow run)" if checkpoint_dir else f"--ckpt_path {last}"
    return (
        f"stopped by SIGTERM at epoch {trainer.current_epoch}: {last} holds the last finished epoch; the same command "
        f"with {again} goes on from it"
    )


def sigterm_received(trainer: L.Trainer) -> bool:
    """Whether this process got SIGTERM during the trainer's run: Lightning's note, or under several processes
    StopTogether's, whose handler replaces Lightning's (scripts/training/sigterm.py)."""
    return trainer.received_sigterm or any(getattr(callback, "signalled", False) for callback in trainer.callbacks)


def launched() -> bool:
    """Whether a launcher (torchrun, Azure ML, mpirun, horovodrun, Lightning's own) started this process."""
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


def first_process() -> bool:
    """Whether this process is the only one, or global rank 0 as its launcher set it up."""
    if not launched():
        return True
    from strategies.launch_check import launched_first

    return launched_first()


def set_up_tracking(args, outputs: Path, subcommand: str) -> None:
    """The MLflow logger's store, run and name: what Azure ML hands over (MLFLOW_TRACKING_URI, MLFLOW_RUN_ID), the
    user's server, or outputs/mlflow.db; checked before the run starts."""
    from_environment = os.environ.get("MLFLOW_TRACKING_URI")
    if args.tracking_uri is None:  # Lightning's logger defaults to MLFLOW_TRACKING_URI as it was at import
        args.tracking_uri = from_environment
    given = args.tracking_uri == from_environment
    source = "MLFLOW_TRACKING_URI" if given else "--trainer.logger.init_args.tracking_uri"
    if args.tracking_uri is not None:
        from scripts.training.tracking_server import check_tracking_uri, credentials_out_of_uri

        args.tracking_uri = credentials_out_of_uri(args.tracking_uri)
        if "MLFLOW_TRACKING_URI" in os.environ:  # what MLflow itself and processes started from this one read
            os.environ["MLFLOW_TRACKING_URI"] = credentials_out_of_uri(os.environ["MLFLOW_TRACKING_URI"])
        check_tracking_uri(args.tracking_uri, source)
    else:
        args.tracking_uri = f"sqlite:///{outputs / 'mlflow.db'}"
        if args.artifact_location is None:  # else MLflow puts artifacts in ./mlruns
            args.artifact_location = (outputs / "mlartifacts").resolve().as_uri()
    if args.run_id is None:
        args.run_id = os.environ.get("MLFLOW_RUN_ID")
    named = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if named and named != args.experiment_name:
        # MLflow's own variable, set for this command: it wins over the experiment a shared YAML names.
        if first_process():
            print(f"experiment {named!r} (MLFLOW_EXPERIMENT_NAME), not the config's {args.experiment_name!r}",
                  file=sys.stderr)  # fmt: skip
        args.experiment_name = named
    if args.run_id is None and args.run_name is None:
        # MLflow draws names from `random`, which the seed fixes: every run of a config would be named alike.
        args.run_name = f"{subcommand}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
    scheme = urlparse(args.tracking_uri).scheme
    if scheme == "sqlite":
        open_sqlite_store(args.tracking_uri)
    if scheme != "sqlite":
        from scripts.training.tracking_server import HTTP_LIMITS

        for name, value in HTTP_LIMITS.items():  # also in the processes started from this one
            os.environ.setdefault(name, value)
    if args.synchronous is None and scheme != "sqlite":
        # A server (or Azure ML's tracking) costs a network round trip per logged batch of metrics: queue them
        # instead; ending the run drains the queue. Local sqlite stays synchronous: there the queue's threads only
        # add GIL contention.
        args.synchronous = False


def existing_run(tracking_uri: str, run_id: str | None) -> str | None:
    """`run_id` if that run is in the store at `tracking_uri` (a --checkpoint_dir may have come from another store)."""
    if run_id is None:
        return None
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return run_id if MlflowClient(tracking_uri).get_run(run_id).info.lifecycle_stage == "active" else None
    except MlflowException:
        return None


def is_mlflow_logger(logger) -> bool:
    """Whether the config's logger is Lightning's MLFlowLogger or a subclass (ours, a user's): those get the tracking
    set-up, Azure ML's run handover included."""
    class_path = getattr(logger, "class_path", None)
    if not class_path:
        return False
    module, _, name = class_path.rpartition(".")
    logger_class = getattr(importlib.import_module(module), name, None)
    return isinstance(logger_class, type) and issubclass(logger_class, MLFlowLogger)


# Memory-backed scratch space where Linux has it: a new store is built there (see create_sqlite_store).
SCRATCH = Path("/dev/shm")


def open_sqlite_store(tracking_uri: str) -> None:
    """Opens (and, if new, creates) the sqlite MLflow store before anything else does, one process at a time.

    Processes started together (torchrun, mpirun, horovodrun) each build the logger, whose MLflow client creates the
    tables of a new store; two at once collide ("duplicate column name"). MLflow keeps the store open per URI,
    so the logger's client then finds it ready.
    """
    from filelock import FileLock
    from mlflow import MlflowClient

    path = Path(tracking_uri.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        if not path.exists():
            create_sqlite_store(path)
        MlflowClient(tracking_uri)


def create_sqlite_store(path: Path) -> None:
    """A new, empty MLflow store at `path`, made by MLflow's own migrations in memory-backed scratch space and then
    copied: sqlite syncs every migration to disk, a few hundred syncs, seconds on a cloud VM's disk (docs/measured.md).
    The copy is what MLflow would have written at `path`: nothing in it names the file (the Default experiment's
    artifact location comes from the working directory). Where there is no such space, MLflow makes it in place."""
    import shutil
    import tempfile

    from mlflow import MlflowClient

    if SCRATCH.is_dir() and os.access(SCRATCH, os.W_OK):
        partial_copy = path.with_name(f".{path.name}.new")
        try:
            with tempfile.TemporaryDirectory(dir=SCRATCH, prefix="mlflow-store-") as folder:
                scratch = Path(folder) / "mlflow.db"
                MlflowClient(f"sqlite:///{scratch}").search_experiments(max_results=1)
                shutil.copyfile(scratch, partial_copy)
                os.replace(partial_copy, path)  # never a half-copied store, whatever stops this process
                return
        except OSError:  # a full disk here or there (a container's /dev/shm is 64 MB): MLflow's own way, and its error
            partial_copy.unlink(missing_ok=True)
    MlflowClient(f"sqlite:///{path}").search_experiments(max_results=1)
