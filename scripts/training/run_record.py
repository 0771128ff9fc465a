"""The run's record in MLflow besides metrics (its store and run: tracking.py): the resolved config (as config.yaml
beside the checkpoints and in MLflow, and as parameters, once, under the config's dotted names), the metrics not yet
sent in each checkpoint, and no record at all of a run that failed before measuring anything; and the line a fit
stopped by SIGTERM ends with. scripts.train's CLI uses it for every command:

    python -m scripts.train fit --config configs/penguins.yaml    # a run in outputs/mlflow.db
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

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
