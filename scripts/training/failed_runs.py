"""What a run that failed or was stopped leaves behind (docs/tracking.md, "Which runs the store keeps"): no record at
all of a run that failed before measuring anything (its MLflow run and folder deleted), a run stopped by Ctrl-C ended
KILLED, one that trained no step FAILED, and the line a fit stopped by SIGTERM ends with. Loaded only then.

    python -m scripts.train fit --config configs/penguins.yaml --trainer.max_epochs 100   # Ctrl-C: KILLED, exit 130
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import lightning as L

from scripts.training.checkpoints import run_dir


def after_exception(trainer: L.Trainer, exception: BaseException, checkpoint_dir: str | None, logger) -> None:
    """TrackConfig.on_exception, before Lightning finalizes the run as failed; `logger`: the trainer's
    BufferedMLFlowLogger (tracking.py), None for another."""
    if type(exception).__name__ == "SIGTERMException" and trainer.is_global_zero:
        from scripts.training.resume import resume_line

        print(resume_line(trainer, checkpoint_dir), file=sys.stderr)
    if logger is not None and isinstance(exception, KeyboardInterrupt):
        logger.interrupted = True  # the run ends KILLED, not FAILED
    if logger is None or not trainer.is_global_zero or not logger.started:
        return
    if logger.handed_over:  # a resumed run's folder holds its earlier epochs' record
        return
    folder = run_dir(trainer)
    if not logger.measured and not any(folder.glob("checkpoints/*")):  # its logger deletes its MLflow run
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # the experiment's folder, when this was its only run
            folder.parent.rmdir()


def delete_record(logger) -> None:
    """The run's artifacts and the run itself, out of every view (`mlflow gc` removes it from a server's store)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    artifact_uri = logger.experiment.get_run(logger.run_id).info.artifact_uri
    get_artifact_repository(artifact_uri).delete_artifacts()
    if artifact_uri.startswith("file:"):  # the run's own folder in a local artifact store
        with contextlib.suppress(OSError):
            Path(urlsplit(artifact_uri).path).parent.rmdir()
    logger.experiment.delete_run(logger.run_id)


def end_failed(trainer: L.Trainer) -> None:
    """Ends the run FAILED after Lightning ended it FINISHED (its fit loop skips the hooks a stop there would go
    through): a fit that trained no step did not succeed. A run held until that step (tracking.py) has none to end."""
    logger = trainer.logger
    if not trainer.is_global_zero or not getattr(logger, "started", False):  # a BufferedMLFlowLogger's run, started
        return
    logger.send(partial(logger.experiment.set_terminated, logger.run_id, "FAILED"), "the run's end (failed)")
    if logger.sender is not None:
        logger.sender.wait(2.0, through_outage=True)
