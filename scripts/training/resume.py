"""A fit with `--checkpoint_dir DIR`: its checkpoints go there, and a fit started again with a DIR that holds
last.ckpt resumes from it, in the MLflow run it started (its id in DIR/mlflow_run_id), after checking that the config
given now trains what the checkpoint was trained on, and sending the metrics the checkpoint carried that the run does
not have (docs/tracking.md, "Resumed runs"). Loaded only with --checkpoint_dir or --ckpt_path to fit, for a run handed
over (Azure ML's), and by the line a fit stopped by SIGTERM ends with.

    python -m scripts.train fit --config configs/mnist.yaml --checkpoint_dir outputs/mnist-long   # again to resume
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch
import yaml

from scripts.training.checkpoints import CONFIG_KEY, CheckpointError, check_checkpoint_file, flatten, write_whole

RUN_ID_FILE = "mlflow_run_id"
FIT_LOCK = "fit.lock"  # in DIR while a fit writes there
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
    "data.init_args.memory_budget_mb",
)  # fmt: skip


def resume_from(config) -> Path | None:
    """Points both checkpoints at DIR; returns the last.ckpt to resume from, if there is one."""
    folder = config.checkpoint_dir
    config.checkpoint.dirpath = config.last_checkpoint.dirpath = folder
    last = Path(folder) / "last.ckpt"
    return last if last.is_file() and not config.get("ckpt_path") else None


def ours_only(folder: str) -> bool:
    """Whether DIR holds nothing but what fits write there (Lightning's warning that it is not empty is no news)."""
    if not Path(folder).is_dir():
        return True
    return {path.name for path in Path(folder).iterdir()} <= {"best.ckpt", "last.ckpt", RUN_ID_FILE, FIT_LOCK}


def check_resume(last: Path, dumped: str) -> None:
    """Raises CheckpointError when `dumped` (the CLI's config as YAML) trains otherwise than `last` was trained (an
    option of TRAINING that both configs have, with another value), or asks for fewer epochs or steps than it has
    trained: the fit would go on under options that do not describe its weights, or fail half-started."""
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


class CheckData(L.Callback):
    """A resumed fit's data compared with its checkpoint's before the weights are restored (after, a table without a
    column would be refused for its network's width): rows changed said, other columns refused in one line
    (datamodules/split_check.py)."""

    def __init__(self, ckpt_path: str) -> None:
        self.ckpt_path = ckpt_path

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        datamodule = trainer.datamodule
        if stage != "fit" or not hasattr(datamodule, "resplit") or not getattr(datamodule, "identity", None):
            return
        if trainer.world_size > 1:  # the file may be on rank 0's disk alone: every rank compares as the state loads
            return
        checkpoint = torch.load(self.ckpt_path, map_location="cpu", weights_only=False, mmap=True)
        from datamodules.split_check import check_trained

        check_trained(datamodule, (checkpoint.get(type(datamodule).__qualname__) or {}).get("identity"))


def as_option(value: object) -> str:
    """`value` as one types it after an option on the command line (None as null, lists as YAML)."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def hold(folder: Path) -> None:
    """Keeps other fits out of DIR while this one runs (two would write one MLflow run and one last.ckpt): an
    exclusive lock on FIT_LOCK there, which the system releases when this process ends, however it ends. A folder
    this made that holds nothing else at exit is removed."""
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


def saved_run(tracking_uri: str, folder: str) -> str | None:
    """The MLflow run a fit with this DIR logged into, if it is in the store at `tracking_uri` (DIR may have come
    from another store)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    path = Path(folder) / RUN_ID_FILE
    run_id = path.read_text().strip() if path.is_file() else ""
    try:
        active = bool(run_id) and MlflowClient(tracking_uri).get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:
        active = False
    return run_id if active else None


def keep_run_id(trainer: L.Trainer, folder: str, run_id: str) -> None:
    """Writes DIR/mlflow_run_id whole or not at all: an empty one (a full disk) would start a new run at the resume."""
    if trainer.is_global_zero:
        write_whole(Path(folder) / RUN_ID_FILE, run_id.encode())


def recorded_steps(client, run_id: str) -> dict[str, int]:
    """The last step of each metric `run_id` has (a resumed fit's, or Azure ML's job run restarted)."""
    metrics = client.get_run(run_id).data.metrics
    return {key: max(m.step for m in client.get_metric_history(run_id, key)) for key in metrics}


def resend(logger, carried: dict) -> None:
    """BufferedMLFlowLogger.resend: the metrics a checkpoint of its run carried (`unsent`), not sent before the fit
    stopped, queued before any new one; those the run has already (`_recorded`) are not logged twice. A checkpoint of
    another run (a fit started from someone else's last.ckpt) brings none."""
    from mlflow.entities import Metric

    if not carried.get("metrics") or carried.get("run_id") != logger.run_id:  # run_id starts the run: _recorded set
        return
    metrics = carried["metrics"]
    if isinstance(metrics, str):  # else a list, as checkpoints of earlier versions of the logger carry them
        metrics = json.loads(metrics)
    back = [Metric(key, value, timestamp, step) for key, value, timestamp, step in metrics]
    logger._pending[:0] = [m for m in back if m.step > logger._recorded.get(m.key, -1)]
    logger.measured = logger.measured or bool(logger._pending)


def resume_line(trainer: L.Trainer, checkpoint_dir: str | None) -> str:
    """What a fit stopped by SIGTERM says: where its last finished epoch is, and the command that goes on from it."""
    # last.ckpt's callback first: it holds the newest epoch.
    newest = sorted(trainer.checkpoint_callbacks, key=lambda callback: getattr(callback, "filename", None) != "last")
    last = next((c.best_model_path for c in newest if getattr(c, "best_model_path", "")), "")
    if not last:
        return f"stopped by SIGTERM at epoch {trainer.current_epoch}, before any epoch finished: nothing to resume from"
    again = f"--checkpoint_dir {checkpoint_dir} (the same MLflow run)" if checkpoint_dir else f"--ckpt_path {last}"
    return (
        f"stopped by SIGTERM at epoch {trainer.current_epoch}: {last} holds the last finished epoch; the same command "
        f"with {again} goes on from it"
    )
