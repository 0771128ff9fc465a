"""Where a fit's checkpoints go, and how a stopped fit takes up again: Lightning's own ModelCheckpoint, twice.

- `checkpoint`: best.ckpt, the lowest val_loss so far (what `fit` tests at its end, what `--register_model` takes).
- `last_checkpoint`: last.ckpt, no monitor, rewritten at every epoch's end: after any stop (Ctrl-C, the SIGTERM of
  a preempted node, SIGKILL, a lost machine) the newest checkpoint is the end of the last finished epoch.

Both go to outputs/<experiment id>/<run id>/checkpoints, or to `--checkpoint_dir DIR`. A fit started with a DIR that
already holds last.ckpt resumes from it, bit for bit as if it had not stopped (the epoch in progress is trained
again; its random numbers too, but for DataLoader workers' own: scripts/training/random_states.py), and goes on
logging into the MLflow run it started (its id is kept in DIR/mlflow_run_id). That is how a job on Azure ML's
low-priority nodes survives preemption: scripts.submit makes DIR a job output mounted read-write, which outlives the
node, and the restarted job runs the same command.

    python -m scripts.train fit --config configs/mnist.yaml --checkpoint_dir outputs/mnist-long   # again to resume

A resume goes on as the fit began: every checkpoint holds the fit's config (`fit_config`), and before anything is
touched (`check_resume`) the config given now must match it but for RESUMABLE, what may change on a resume.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser

from strategies.checkpoint_io import write_whole

RUN_ID_FILE = "mlflow_run_id"
CONFIG_KEY = "fit_config"  # the fit's resolved config (YAML) in every checkpoint it writes
# What may differ from the checkpoint's config on a resume (an option, or a prefix of options): how long to train,
# where it runs and what is recorded, where the data is found; not what is trained, nor how (docs/tracking.md).
RESUMABLE = (
    "trainer.max_epochs", "trainer.max_steps", "trainer.max_time", "trainer.accelerator", "trainer.devices",
    "trainer.num_nodes", "trainer.strategy", "trainer.logger", "trainer.default_root_dir",
    "trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.callbacks", "data.init_args.data_dir",
    "data.init_args.csv_path", "data.init_args.archive", "data.init_args.mirrors", "data.init_args.predict_path",
    "data.init_args.num_workers", "data.init_args.verify_images", "ckpt_path", "checkpoint_dir", "config",
    "test_after_fit", "register_model", "throughput", "model.class_names", "checkpoint.dirpath",
    "last_checkpoint.dirpath",
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


def check_resume(last: Path, config: dict[str, object]) -> None:
    """Raises CheckpointError when `config` (the fit's, flattened: `flatten`) differs from the config `last` was
    trained with other than in RESUMABLE, or asks for fewer epochs or steps than it has trained: the fit would go on
    with the checkpoint's weights and optimizer under options that do not describe them, or fail half-started."""
    import torch
    import yaml

    from strategies.checkpoint_io import CheckpointError, check_checkpoint_file

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
        key for key in dict.fromkeys([*then, *config])
        if not key.startswith(RESUMABLE) and str(then.get(key)) != str(config.get(key))
    ]  # fmt: skip
    if changed:
        first = ("data.class_path", "model.network.class_path")  # another task, or another network, first
        key = min(changed, key=lambda key: (key not in first, first.index(key) if key in first else 0))
        more = f" (and {len(changed) - 1} more option(s))" if len(changed) > 1 else ""
        raise CheckpointError(
            f"--{key} {config.get(key)}: {last} was trained with {then.get(key)}{more}, and a resume goes on as it "
            f"began; give {then.get(key)}, {fix}"
        )


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


def saved_run_id(folder: str | None) -> str | None:
    """The MLflow run a fit with this --checkpoint_dir logged into, if one did."""
    path = Path(folder or "") / RUN_ID_FILE
    return path.read_text().strip() or None if folder and path.is_file() else None


def keep_run_id(trainer: L.Trainer, folder: str | None, run_id: str) -> None:
    """Writes DIR/mlflow_run_id whole or not at all: an empty one (a full disk) would start a new run at the resume."""
    if folder and trainer.is_global_zero:
        write_whole(Path(folder) / RUN_ID_FILE, run_id.encode())
