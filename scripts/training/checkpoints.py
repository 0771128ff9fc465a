"""Where a fit's checkpoints go, and how a stopped fit takes up again: Lightning's own ModelCheckpoint, twice.

- `checkpoint`: best.ckpt, the lowest val_loss so far (what `fit` tests at its end, what `--register_model` takes).
- `last_checkpoint`: last.ckpt, no monitor, rewritten at every epoch's end: after any stop (Ctrl-C, the SIGTERM of
  a preempted node, SIGKILL, a lost machine) the newest checkpoint is the end of the last finished epoch.

Both go to outputs/<experiment id>/<run id>/checkpoints, or to `--checkpoint_dir DIR`. A fit started with a DIR that
already holds last.ckpt resumes from it, bit for bit as if it had not stopped (the epoch in progress is trained
again), and goes on logging into the MLflow run it started (its id is kept in DIR/mlflow_run_id). That is how a job
on Azure ML's low-priority nodes survives preemption: scripts.submit makes DIR a job output mounted read-write, which
outlives the node, and the restarted job runs the same command.

    python -m scripts.train fit --config configs/mnist.yaml --checkpoint_dir outputs/mnist-long   # again to resume
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser

from strategies.checkpoint_io import write_whole

RUN_ID_FILE = "mlflow_run_id"


def add_checkpoint_arguments(parser: LightningArgumentParser) -> None:
    parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
    parser.add_lightning_class_args(ModelCheckpoint, "last_checkpoint")
    parser.set_defaults(
        {
            "checkpoint.monitor": "val_loss",
            "checkpoint.filename": "best",
            "checkpoint.enable_version_counter": False,  # a resumed fit rewrites best.ckpt, not best-v1.ckpt
            "last_checkpoint.filename": "last",  # no monitor, save_top_k 1: the newest epoch, one file
            "last_checkpoint.enable_version_counter": False,
            # At the epoch's very end whatever the validation schedule, after the module's own epoch end (its
            # training metrics then travel in the checkpoint: lightning_modules/classifier.py).
            "checkpoint.save_on_train_epoch_end": True,
            "last_checkpoint.save_on_train_epoch_end": True,
        }
    )
    parser.add_argument(
        "--checkpoint_dir", type=str | None, default=None,
        help="fit: write best.ckpt and last.ckpt here; if last.ckpt is already here, resume from it",
    )  # fmt: skip


def resume_from(config) -> Path | None:
    """Points both checkpoints at --checkpoint_dir; returns the last.ckpt to resume from, if there is one."""
    folder = config.get("checkpoint_dir")
    if not folder:
        return None
    config.checkpoint.dirpath = config.last_checkpoint.dirpath = folder
    last = Path(folder) / "last.ckpt"
    return last if last.is_file() and not config.get("ckpt_path") else None


def saved_run_id(folder: str | None) -> str | None:
    """The MLflow run a fit with this --checkpoint_dir logged into, if one did."""
    path = Path(folder or "") / RUN_ID_FILE
    return path.read_text().strip() or None if folder and path.is_file() else None


def keep_run_id(trainer: L.Trainer, folder: str | None, run_id: str) -> None:
    """Writes DIR/mlflow_run_id whole or not at all: an empty one (a full disk) would start a new run at the resume."""
    if folder and trainer.is_global_zero:
        write_whole(Path(folder) / RUN_ID_FILE, run_id.encode())
