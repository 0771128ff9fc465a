"""A fit's checkpoints: Lightning's ModelCheckpoint twice, best.ckpt (the lowest val_loss: what `fit` tests) and
last.ckpt (after any stop, the last finished epoch), in outputs/<experiment id>/<run id>/checkpoints or --checkpoint_dir
(resume.py); each written whole or not at all, with the random generators a resumed fit sets back (docs/tracking.md).

    python -m scripts.train fit --config configs/penguins.yaml --checkpoint_dir outputs/penguins-long
"""

from __future__ import annotations

import io
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser

CONFIG_KEY = "fit_config"  # the fit's resolved config (YAML) in every checkpoint it writes


def run_dir(trainer: L.Trainer) -> Path:
    """outputs/<experiment id>/<run id>: where checkpoints go, so a run's files sit together."""
    logger = trainer.logger
    if logger is None:
        return Path(trainer.default_root_dir)
    return Path(trainer.default_root_dir) / str(logger.name) / str(logger.version)


def add_checkpoint_arguments(parser: LightningArgumentParser) -> None:
    parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
    parser.add_lightning_class_args(ModelCheckpoint, "last_checkpoint")
    parser.set_defaults({
        "checkpoint.monitor": "val_loss", "checkpoint.filename": "best",
        "last_checkpoint.filename": "last",  # no monitor, save_top_k 1: the newest epoch, one file
        "checkpoint.enable_version_counter": False, "last_checkpoint.enable_version_counter": False,  # no best-v1
        # At the epoch's very end, after the module's own (its metrics travel in the checkpoint: classifier.py).
        "checkpoint.save_on_train_epoch_end": True, "last_checkpoint.save_on_train_epoch_end": True,
    })  # fmt: skip
    parser.add_argument(
        "--checkpoint_dir", type=str | None, default=None,
        help="fit: write best.ckpt and last.ckpt here; if last.ckpt is already here, resume from it",
    )  # fmt: skip


def flatten(config: dict | list, prefix: str = "") -> dict[str, object]:
    """`{"a": {"b": [{"c": 1}]}}` -> `{"a.b.0.c": 1}`: a config as MLflow parameters, or as compared on a resume."""
    flat: dict[str, object] = {}
    for key, value in config.items() if isinstance(config, dict) else enumerate(config):
        if isinstance(value, dict | list) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class CheckpointError(Exception):
    """A checkpoint that is missing, unreadable or of other classes, or a --checkpoint_dir in use."""


def write_whole(path: Path, data: bytes) -> None:
    """`data` as `path`, whole or not at all; an OSError (a full disk) names `path`."""
    part = path.with_name(f".{path.name}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(data)
        os.replace(part, path)
    except OSError as error:
        part.unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror, str(path)) from None


class WholeCheckpointIO(TorchCheckpointIO):
    """Checkpoints written whole or not at all: a full disk leaves the previous one whole (Lightning's transaction
    copies from the system's temporary folder, not atomic on another disk). Several processes: several_processes.py."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if "://" in str(path):  # a remote filesystem: fsspec's own transaction
            return super().save_checkpoint(checkpoint, path, storage_options)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_whole(Path(path), buffer.getvalue())

    def load_checkpoint(
        self,
        path: str | Path,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except Exception as error:  # torch.load's: a truncated zip, not a pickle, a file of another program
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CheckpointError(
                f"{path}: not a checkpoint this can read ({reason}); give a .ckpt written by scripts.train fit"
            ) from None


class RandomStates(L.Callback):
    """The process's random generators (torch's, CUDA's, NumPy's, Python's: Lightning saves none) in every checkpoint,
    set back before a resumed fit's first batch; rank 0's in every process. Not a DataLoader worker's own."""

    def __init__(self) -> None:
        self.device: torch.device | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.device = trainer.strategy.root_device

    def state_dict(self) -> dict[str, Any]:
        # NumPy's as plain values and a tensor: checkpoints are read with torch.load(weights_only=True).
        _, key, position, has_gauss, gauss = np.random.get_state()
        numpy = {"key": torch.from_numpy(key.astype(np.int64)), "pos": position, "has_gauss": has_gauss, "gauss": gauss}
        state = {"torch": torch.get_rng_state(), "numpy": numpy, "python": random.getstate()}
        if self.device is not None and self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        numpy = state_dict["numpy"]
        key = numpy["key"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", key, numpy["pos"], numpy["has_gauss"], numpy["gauss"]))
        random.setstate(state_dict["python"])
        if "cuda" in state_dict and self.device is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state_dict["cuda"], self.device)
