"""Where a fit's checkpoints go, and how a stopped fit takes up again: Lightning's own ModelCheckpoint, twice.

- `checkpoint`: best.ckpt, the lowest val_loss so far (what `fit` tests at its end, what `--register_model` takes).
- `last_checkpoint`: last.ckpt, no monitor, rewritten at every epoch's end: after any stop (Ctrl-C, the SIGTERM of
  a preempted node, SIGKILL, a lost machine) the newest checkpoint is the end of the last finished epoch.

Both go to outputs/<experiment id>/<run id>/checkpoints, or to `--checkpoint_dir DIR`. A fit started with a DIR that
already holds last.ckpt resumes from it, bit for bit as if it had not stopped (the epoch in progress is trained
again; its random numbers too, but for DataLoader workers' own: RandomStates below), and goes on
logging into the MLflow run it started (its id is kept in DIR/mlflow_run_id). That is how a job on Azure ML's
low-priority nodes survives preemption: scripts.submit makes DIR a job output mounted read-write, which outlives the
node, and the restarted job runs the same command.

    python -m scripts.train fit --config configs/mnist.yaml --checkpoint_dir outputs/mnist-long   # again to resume

A resume goes on as the fit began: every checkpoint holds the fit's config (`fit_config`), and before anything is
touched (`check_resume`) what it trains and how must match the config given now (TRAINING: the model, the data's
preprocessing, the seed, the Trainer options that change the numbers); anything else may change.

While a fit writes to a --checkpoint_dir it holds a lock there (`hold`): a second fit on that folder is refused.
Checkpoints are written whole or not at all and read once, by global rank 0, for every process
(`RankZeroCheckpointIO`): nodes share no disk, and a full disk must leave the previous checkpoint whole. Each holds
the process's random generators (`RandomStates`), so a resumed fit draws the numbers the uninterrupted one would have.
"""

from __future__ import annotations

import io
import os
import random
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.strategies import Strategy

RUN_ID_FILE = "mlflow_run_id"
FIT_LOCK = "fit.lock"  # in a --checkpoint_dir while a fit writes there
CONFIG_KEY = "fit_config"  # the fit's resolved config (YAML) in every checkpoint it writes
# What a resume compares with the checkpoint's config: what is trained and how. Everything else (how long, where it
# runs, what is recorded, where the data is found, options a newer release added) may change (docs/tracking.md).
TRAINING = (
    "model.", "data.", "seed_everything", "trainer.precision", "trainer.accumulate_grad_batches",
    "trainer.gradient_clip_val", "trainer.gradient_clip_algorithm", "trainer.limit_train_batches",
    "trainer.deterministic",
)  # fmt: skip
# Options under data. that say where the data is found or how fast it is read, not what it is.
DATA_LOCATION = (
    "data.init_args.data_dir", "data.init_args.csv_path", "data.init_args.archive", "data.init_args.mirrors",
    "data.init_args.predict_path", "data.init_args.num_workers", "data.init_args.verify_images", "model.class_names",
)  # fmt: skip


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


def check_resume(last: Path, dumped: str) -> None:
    """Raises CheckpointError when `dumped` (the CLI's config as YAML) trains otherwise than the config `last` was
    trained with (an option of TRAINING that both have, with another value), or asks for fewer epochs or steps
    than it has trained: the fit would go on with the checkpoint's weights and optimizer under options that do not
    describe them, or fail half-started. An option the checkpoint's config lacks (added since) is not compared."""
    import yaml

    config = flatten(yaml.safe_load(dumped)["fit"])
    check_checkpoint_file(last)
    try:  # mmap: the weights stay on disk, only the small entries are read
        checkpoint = torch.load(last, map_location="cpu", weights_only=False, mmap=True)
    except Exception as error:
        raise CheckpointError(
            f"{last}: not a checkpoint this can read ({type(error).__name__}); remove it to train anew there, or give "
            "a new --checkpoint_dir"
        ) from None
    if CONFIG_KEY in checkpoint:
        then = flatten(yaml.safe_load(checkpoint[CONFIG_KEY]))
    else:  # written before checkpoints held their config: the module's and the datamodule's arguments
        model = {k: v for k, v in (checkpoint.get("hyper_parameters") or {}).items() if not k.startswith("_")}
        then = flatten({"model": model, "data": {"init_args": checkpoint.get("datamodule_hyper_parameters") or {}}})
        config = {key: value for key, value in config.items() if key.startswith(("model.", "data.init_args."))}
    fix = "or a new --checkpoint_dir to train anew"
    done = {"max_epochs": checkpoint.get("epoch", -1) + 1, "max_steps": checkpoint.get("global_step", 0)}
    for option, trained in done.items():
        wanted = config.get(f"trainer.{option}")
        if isinstance(wanted, int) and 0 <= wanted < trained:
            raise CheckpointError(
                f"--trainer.{option} {wanted}: {last} has trained {trained} {option.removeprefix('max_')} already "
                f"(its config: {then.get(f'trainer.{option}')}); give {trained} or more, {fix}"
            )
    changed = [
        key for key in then
        if key.startswith(TRAINING) and not key.startswith(DATA_LOCATION) and str(then[key]) != str(config.get(key))
    ]  # fmt: skip
    if changed:
        first = ("data.class_path", "model.network.class_path")  # another task, or another network, first
        key = min(changed, key=lambda key: (key not in first, first.index(key) if key in first else 0))
        more = f" (and {len(changed) - 1} more option(s))" if len(changed) > 1 else ""
        raise CheckpointError(
            f"--{key} {as_option(config.get(key))}: {last} was trained with {as_option(then.get(key))}{more}, and a "
            f"resume goes on as it began; give --{key} {as_option(then.get(key))}, {fix}"
        )


def as_option(value: object) -> str:
    """`value` as one types it after an option on the command line (None as null, lists as YAML)."""
    if isinstance(value, str):
        return value
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def flatten(config: dict | list, prefix: str = "") -> dict[str, object]:
    """`{"a": {"b": [{"c": 1}]}}` -> `{"a.b.0.c": 1}`: a config as MLflow parameters, or as compared on a resume."""
    flat: dict[str, object] = {}
    items = config.items() if isinstance(config, dict) else enumerate(config)
    for key, value in items:
        if isinstance(value, dict | list) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def hold(folder: Path) -> None:
    """Keeps other fits out of --checkpoint_dir `folder` while this one runs (two would write one MLflow run and one
    last.ckpt): an exclusive lock on FIT_LOCK there, which the system releases when this process ends, however it
    ends. A folder this made that holds nothing else at exit is removed."""
    import atexit
    import fcntl

    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock = (folder / FIT_LOCK).open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise CheckpointError(
            f"--checkpoint_dir {folder}: another fit is writing there (it holds {folder / FIT_LOCK}); wait for it "
            "to end, or give another folder"
        ) from None

    def release() -> None:
        lock.close()
        if made and {path.name for path in folder.iterdir()} == {FIT_LOCK}:
            (folder / FIT_LOCK).unlink()
            folder.rmdir()

    atexit.register(release)


def ours_only(folder: str | None) -> bool:
    """Whether --checkpoint_dir `folder` holds nothing but what fits write there (so Lightning's warning that it is
    not empty tells the user nothing)."""
    if not folder or not Path(folder).is_dir():
        return bool(folder)
    return {path.name for path in Path(folder).iterdir()} <= {"best.ckpt", "last.ckpt", RUN_ID_FILE, FIT_LOCK}


def saved_run_id(folder: str | None) -> str | None:
    """The MLflow run a fit with this --checkpoint_dir logged into, if one did."""
    path = Path(folder or "") / RUN_ID_FILE
    return path.read_text().strip() or None if folder and path.is_file() else None


def keep_run_id(trainer: L.Trainer, folder: str | None, run_id: str) -> None:
    """Writes DIR/mlflow_run_id whole or not at all: an empty one (a full disk) would start a new run at the resume."""
    if folder and trainer.is_global_zero:
        write_whole(Path(folder) / RUN_ID_FILE, run_id.encode())


class CheckpointError(Exception):
    """A checkpoint that is missing or unreadable, or a --checkpoint_dir in use; the message names it and what to
    give."""


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


def check_ckpt_path(ckpt_path: str | None, launched: bool) -> None:
    """Raises CheckpointError for a --ckpt_path file that is not a checkpoint, before LightningCLI reads its
    hyperparameters with a bare torch.load. Under a launcher in rank 0 only, which reads it for all (nodes share no
    disk), and a missing one only alone: the others would wait for this one; rank 0's read at the run's start stops
    every process together."""
    if not ckpt_path or ckpt_path in ("best", "last", "hpc", "registry"):
        return
    if not launched:
        check_checkpoint_file(ckpt_path)
        return
    from strategies.launch_check import launched_first, launched_processes

    if launched_first() and (Path(ckpt_path).exists() or launched_processes() == 1):
        check_checkpoint_file(ckpt_path)


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


class RandomStates(L.Callback):
    """The process's random generators (torch's, this device's CUDA one, NumPy's, Python's) in every checkpoint, as they
    were when it was written at an epoch's end, set back before a resumed fit's first epoch: dropout masks, a
    DataLoader's shuffled order and its random crops and flips in the main process then go on as they would have.
    Lightning's Trainer saves none of them (Fabric's own checkpoints can). Restored when Lightning restores the
    callbacks, before the sanity check and the first training batch. Each process restores rank 0's generators, the
    checkpoint's: those are every rank's where seed_everything seeded each process alike. Not restored: a DataLoader
    worker's own generator, and a module's or datamodule's own torch.Generator (MNIST seeds its warps anew every epoch
    instead)."""

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
