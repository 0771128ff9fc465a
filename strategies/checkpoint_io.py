"""Checkpoints read once, by global rank 0, and sent to every process: nodes share no disk.

Lightning reads a checkpoint in every process (`trainer.test(ckpt_path="best")` after fit, `--ckpt_path` to resume),
but only global rank 0 writes checkpoints, to its own node's disk: on an Azure ML cluster every other node then stops
with "Checkpoint file not found". Here rank 0 reads the file and the strategy broadcasts it (torch.distributed or
Horovod); an error reading it is raised in every process, as a CheckpointError naming the file. scripts.train
installs it for every Trainer:

    python -m scripts.train test --config configs/penguins.yaml --config configs/trainer/ddp.yaml --ckpt_path best.ckpt
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.strategies import Strategy


class CheckpointError(Exception):
    """A checkpoint that is missing or unreadable; the message names it and what to give."""


def check_checkpoint_file(path: str | Path) -> None:
    """Raises CheckpointError unless `path` is a file in torch.save's format (a zip archive)."""
    if not Path(path).is_file():
        raise CheckpointError(
            f"{path}: no such checkpoint; give --ckpt_path a .ckpt that fit wrote (outputs/<exp>/<run>/checkpoints/)"
        )
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path}: not a checkpoint this can read (not torch.save's zip format, or cut short); give a .ckpt "
            "written by scripts.train fit"
        )


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


def read(io: TorchCheckpointIO, path: str | Path, map_location: Any, weights_only: bool | None) -> dict[str, Any]:
    check_checkpoint_file(path)
    try:
        return TorchCheckpointIO.load_checkpoint(io, path, map_location=map_location, weights_only=weights_only)
    except Exception as error:  # torch.load's: a truncated zip, not a pickle, a file of another program
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"{path}: not a checkpoint this can read ({reason}); give a .ckpt written by scripts.train fit"
        ) from None


class RankZeroCheckpointIO(TorchCheckpointIO):
    def __init__(self, strategy: Strategy) -> None:
        super().__init__()
        self.strategy = strategy

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        """Writes a local checkpoint to a temporary name beside it, then renames it: a full disk leaves the previous
        checkpoint whole, not an empty or cut-short one. (Lightning's transaction writes to the system's temporary
        folder and then copies, which on another disk is not atomic, and names the temporary file in its error.)"""
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
        if self.strategy.world_size == 1:
            return read(self, path, map_location, weights_only)
        loaded: tuple[dict | None, BaseException | None] = (None, None)
        if self.strategy.is_global_zero:
            try:  # on the CPU: the broadcast pickles it, and Lightning moves the state to each process's device
                loaded = (read(self, path, "cpu", weights_only), None)
            except Exception as error:
                loaded = (None, error)
        checkpoint, error = self.strategy.broadcast(loaded, src=0)
        if error is not None:
            raise error
        return checkpoint
