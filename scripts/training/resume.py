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
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from scripts.training.checkpoints import CONFIG_KEY, CheckpointError, flatten, write_whole
from scripts.training.from_checkpoint import check_checkpoint_file

RUN_ID_FILE = "mlflow_run_id"
FIT_LOCK = "fit.lock"  # in DIR while a fit writes there
# What may differ between a resume's config and its checkpoint's: how long it trains and when it stops, where it runs
# (other hardware resumes soundly), what is recorded, shown or saved, and where the data is found. Every other option
# changes what is trained or how, and is compared, nested ones and groups the checkpoint had as null included
# (docs/tracking.md, "Resumed runs").
MAY_DIFFER = (
    "config", "ckpt_path", "weights_only", "checkpoint_dir", "test_after_fit", "register_model", "model_dir",
    "metrics_file", "checkpoint", "last_checkpoint",
    "trainer.max_epochs", "trainer.max_steps", "trainer.min_epochs", "trainer.min_steps", "trainer.max_time",
    "trainer.callbacks", "trainer.accelerator", "trainer.devices", "trainer.strategy", "trainer.num_nodes",
    "trainer.benchmark", "trainer.logger", "trainer.default_root_dir", "trainer.enable_progress_bar",
    "trainer.enable_model_summary", "trainer.enable_checkpointing", "trainer.log_every_n_steps", "trainer.profiler",
    "trainer.enable_autolog_hparams", "trainer.model_registry", "trainer.num_sanity_val_steps",
    "trainer.limit_test_batches", "trainer.limit_predict_batches", "trainer.detect_anomaly",
    "data.init_args.data_dir", "data.init_args.csv_path", "data.init_args.archive", "data.init_args.mirrors",
    "data.init_args.predict_path", "data.init_args.num_workers", "data.init_args.verify_images", "model.class_names",
    "data.init_args.memory_budget_mb",
)  # fmt: skip


def prepare(cli, config) -> None:
    """The CLI's part for a fit with --checkpoint_dir, before anything is built: the checkpoints there and, where
    last.ckpt is, the resume from it once its config is checked."""
    import warnings

    if ours_only(config.checkpoint_dir):  # Lightning warns of it at every start, resumes included
        warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty")
    if last := resume_from(config):
        check_resume(last, cli.parser.dump(cli.config, skip_unset=False, skip_validation=True))
        config.ckpt_path, cli.resumes = str(last), True
        rank_zero_only(print)(f"resuming from {last}")


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
    option not in MAY_DIFFER with another value), or asks for fewer epochs or steps than it has trained: the fit would
    go on under options that do not describe its weights, or fail half-started."""
    now = yaml.safe_load(dumped)["fit"]
    config = flatten(now)
    check_checkpoint_file(last)
    try:  # mmap: the weights stay on disk, only the small entries are read
        checkpoint = torch.load(last, map_location="cpu", weights_only=False, mmap=True)
    except Exception as error:
        raise CheckpointError(
            f"{last}: not a checkpoint this can read ({type(error).__name__}); remove it to train anew there, or give "
            "a new --checkpoint_dir"
        ) from None
    if CONFIG_KEY in checkpoint:
        before = yaml.safe_load(checkpoint[CONFIG_KEY])
    else:  # written before checkpoints held their config: the module's and the datamodule's arguments
        model = {k: v for k, v in (checkpoint.get("hyper_parameters") or {}).items() if not k.startswith("_")}
        before = {"model": model, "data": {"init_args": checkpoint.get("datamodule_hyper_parameters") or {}}}
        now = {"model": now.get("model") or {}, "data": {"init_args": (now.get("data") or {}).get("init_args") or {}}}
    then = flatten(before)
    fix = "or a new --checkpoint_dir to train anew"
    done = {"max_epochs": checkpoint.get("epoch", -1) + 1, "max_steps": checkpoint.get("global_step", 0)}
    for option, trained in done.items():
        wanted = config.get(f"trainer.{option}")
        if isinstance(wanted, int) and 0 <= wanted < trained:
            raise CheckpointError(
                f"--trainer.{option} {wanted}: {last} has trained {trained} {option.removeprefix('max_')} already "
                f"(its config: {then.get(f'trainer.{option}')}); give {trained} or more, {fix}"
            )
    changed = [key for key in differences(before, now) if not may_differ(key)]
    if changed:
        # Another task, another network or another class first: the options under it differ because of it.
        key = min(changed, key=lambda key: (not key.endswith("class_path"), key.count("."), changed.index(key)))
        more = f" (and {len(changed) - 1} more option(s))" if len(changed) > 1 else ""
        was, given = as_option(value_at(before, key)), as_option(value_at(now, key))
        raise CheckpointError(
            f"--{key} {given}: {last} was trained with {was}{more}, and a resume goes on as it began; give --{key} "
            f"{was}, {fix}"
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


def differences(then: object, now: object, prefix: str = "") -> list[str]:
    """The dotted options whose values differ between two configs: a group set on one side and null on the other is
    one option (`model.lr_scheduler`); an option only `now` has, in a group both have, is one a newer release added."""
    if isinstance(then, dict) and isinstance(now, dict):
        return [key for name in then for key in differences(then[name], now.get(name), f"{prefix}{name}.")]
    if isinstance(then, list) and isinstance(now, list) and len(then) == len(now):
        return [key for index, pair in enumerate(zip(then, now)) for key in differences(*pair, f"{prefix}{index}.")]
    return [] if then == now or str(then) == str(now) else [prefix.removesuffix(".")]


def may_differ(key: str) -> bool:
    return any(key == option or key.startswith(f"{option}.") for option in MAY_DIFFER)


def value_at(config: dict, key: str) -> object:
    """The value of dotted `key` in a nested config (None where it is not)."""
    value: object = config
    for part in key.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def as_option(value: object) -> str:
    """`value` as one types it after an option on the command line (None as null, lists as YAML)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("class_path"), str):  # a class: its name, as one gives it
        return value["class_path"]
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip().removesuffix("...").strip()


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


def take_over(cli, config, tracking_args) -> None:
    """The CLI's part once the tracking is set up (`tracking_args`: the MLflow logger's, None for another logger): the
    MLflow run this DIR's fits log into, unless one is given, and DIR held for this fit alone."""
    if tracking_args is not None and tracking_args.run_id is None:
        tracking_args.run_id = saved_run(tracking_args.tracking_uri, config.checkpoint_dir)
        tracking_args.run_name = None if tracking_args.run_id else tracking_args.run_name
    cli.check_on_rank_zero(hold, Path(config.checkpoint_dir))


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
