"""Train, validate, test or predict any task from its YAML: the one entry point, locally or in Azure ML.

    python -m scripts.train fit --config configs/penguins.yaml
    python -m scripts.train fit --config configs/penguins.yaml --trainer.max_epochs 5 --print_config
    python -m scripts.train test --config configs/penguins.yaml --ckpt_path outputs/<exp>/<run>/checkpoints/best.ckpt
    python -m scripts.train predict --config configs/penguins.yaml --ckpt_path ... --data.predict_path new.csv

`fit` ends by testing the best checkpoint and printing `test_acc`. Runs are tracked in MLflow:
`MLFLOW_TRACKING_URI` / `MLFLOW_RUN_ID` when set (Azure ML sets both), else the sqlite store
`outputs/mlflow.db`; files of a run go to `outputs/<experiment id>/<run id>/`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

import lightning as L
import torch
from jsonargparse import ArgumentError
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from datamodules.base import ClassificationDataModule
from datamodules.errors import DataError
from lightning_modules.classifier import ClassificationModule, OptimizerError
from lightning_modules.transfer_net import WeightsError, skip_pretrained_weights
from scripts.checkpoints import add_checkpoint_arguments, keep_run_id, resume_from, saved_run_id
from scripts.export import test_inputs
from scripts.throughput import EpochThroughput
from scripts.tracking import (
    BufferedMLFlowLogger,
    TrackingError,
    check_tracking_uri,
    credentials_out_of_uri,
    register_model,
)
from strategies.checkpoint_io import CheckpointError, RankZeroCheckpointIO, check_checkpoint_file
from strategies.launch_check import check_launch, launched_rank
from strategies.mpi_environment import LaunchError

OUTPUTS = Path("outputs")  # Azure ML uploads ./outputs of every job
MLFLOW_LOGGER = "scripts.tracking.BufferedMLFlowLogger"


def run_dir(trainer: L.Trainer) -> Path:
    """outputs/<experiment id>/<run id>: where checkpoints go, so a run's files sit together."""
    logger = trainer.logger
    if logger is None:
        return Path(trainer.default_root_dir)
    return Path(trainer.default_root_dir) / str(logger.name) / str(logger.version)


def flatten(config: dict | list, prefix: str = "") -> dict[str, object]:
    """`{"a": {"b": [{"c": 1}]}}` -> `{"a.b.0.c": 1}`: the config as MLflow parameters."""
    flat: dict[str, object] = {}
    items = config.items() if isinstance(config, dict) else enumerate(config)
    for key, value in items:
        if isinstance(value, dict | list) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class TrackConfig(SaveConfigCallback):
    """The run's record: the resolved config beside the checkpoints and in MLflow (file and parameters), metrics
    sent before each epoch's checkpoints, and no record at all of a run that failed before measuring anything."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "predict":  # no run to file it under: it would overwrite outputs/config.yaml
            return
        text = self.parser.dump(self.config, skip_none=False)
        path = run_dir(trainer) / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if isinstance(trainer.logger, MLFlowLogger):
            import yaml
            from mlflow.entities import Param

            params = flatten(yaml.safe_load(text))
            params.pop("config", None)  # the paths of the YAML files: the artifact says it all
            # A resumed run (--checkpoint_dir, a restarted Azure ML job) has its parameters; MLflow refuses changes
            # (a longer max_epochs, say): those are in the config.yaml logged below, which replaces the first one.
            client, run_id = trainer.logger.experiment, trainer.logger.run_id
            logged = client.get_run(run_id).data.params
            new = [Param(key, str(value)[:500]) for key, value in params.items() if key not in logged]
            for start in range(0, len(new), 100):  # MLflow's most parameters a request
                client.log_batch(run_id, params=new[start : start + 100])
            trainer.logger.experiment.log_artifact(trainer.logger.run_id, str(path))
            if stage == "fit":
                keep_run_id(trainer, self.config.get("checkpoint_dir"), trainer.logger.run_id)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Called while a checkpoint is made, before it is written: a fit resumed from it has every metric logged so
        # far. What Lightning logs after an epoch's checkpoints, the epoch's training metrics, travels in them.
        if isinstance(trainer.logger, BufferedMLFlowLogger):
            trainer.logger.flush(wait=True)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # A run that failed before measuring anything leaves no folder (its logger deletes its MLflow run).
        logger = trainer.logger
        if not (isinstance(logger, BufferedMLFlowLogger) and trainer.is_global_zero and logger.started):
            return
        folder = run_dir(trainer)
        if not logger.measured and not any(folder.glob("checkpoints/*")):
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):  # the experiment's folder, when this was its only run
                folder.parent.rmdir()


class TemplateCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        add_checkpoint_arguments(parser)
        parser.add_lightning_class_args(EpochThroughput, "throughput")
        parser.add_argument(
            "--test_after_fit", type=bool, default=True, help="fit: test the best checkpoint at the end"
        )
        parser.add_argument(
            "--register_model", type=str | None, default=None,
            help="fit: log the best checkpoint's network as the run's MLflow model, registered under this name",
        )  # fmt: skip

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        ckpt_path = subcommand and self.config[subcommand].get("ckpt_path")
        if ckpt_path and ckpt_path not in ("best", "last", "hpc", "registry") and launched_rank() == 0:
            # LightningCLI reads the checkpoint's hyperparameters next, with a bare torch.load: check the file first.
            # Rank 0 only: on other nodes it need not exist (rank 0 reads it for all: strategies/checkpoint_io.py).
            check_checkpoint_file(ckpt_path)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        if self.subcommand in ("validate", "test", "predict") and not config.get("ckpt_path"):
            raise ConfigError(
                f"{self.subcommand} needs --ckpt_path: the .ckpt a fit wrote (outputs/<exp>/<run>/checkpoints/"
                "best.ckpt; `make evaluate` and `make predict` find the newest); without it the network is untrained"
            )
        if config.get("ckpt_path") and config.model.network.get("init_args"):
            skip_pretrained_weights(config.model.network.init_args)
        if self.subcommand != "fit" and config.get("ckpt_path"):
            # LightningCLI has read the checkpoint's hyperparameters into model: its class names are the truth. A
            # datamodule that takes `classes` gets them (predict labels with them; test checks its folders have them).
            classes, data_args = config.model.get("class_names"), config.data.get("init_args") or {}
            self.checkpoint_classes = list(classes or [])
            if classes and "classes" in data_args:
                data_args["classes"] = list(classes)
        if self.subcommand == "fit" and (last := resume_from(config)):
            config.ckpt_path = str(last)
            rank_zero_print(f"resuming from {last}")
        if self.subcommand == "predict":
            # Its output is a CSV on stdout (`predict > out.csv`): no progress bar there. It records nothing: no run.
            config.trainer.enable_progress_bar, config.trainer.logger = False, False
        check_trainer(config.trainer, writes=self.subcommand != "predict")
        logger = config.trainer.logger
        if is_mlflow_logger(logger):
            args = logger.init_args
            set_up_tracking(args, Path(config.trainer.default_root_dir or OUTPUTS), self.subcommand)
            if self.subcommand == "fit" and args.run_id is None:  # a resumed fit goes on in its own run
                args.run_id = existing_run(args.tracking_uri, saved_run_id(config.checkpoint_dir))
                args.run_name = None if args.run_id else args.run_name

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except ValueError as error:  # the Trainer's own checks of its options (a strategy name that does not exist)
            raise ConfigError(f"trainer: {str(error).strip().splitlines()[0]}") from None
        check_launch(trainer.num_devices, trainer.num_nodes)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # a user's own plugin is left alone
            trainer.strategy.checkpoint_io = RankZeroCheckpointIO(trainer.strategy)
        return trainer

    def before_fit(self) -> None:
        checkpoint = self.trainer.checkpoint_callback
        if self.config.fit.register_model and not (isinstance(self.trainer.logger, MLFlowLogger) and checkpoint):
            sys.exit("error: --register_model needs the MLflow logger and checkpoints; check trainer.logger")

    def after_fit(self) -> None:
        checkpoint = self.trainer.checkpoint_callback
        if checkpoint is not None and checkpoint.best_model_path:
            rank_zero_print(f"best checkpoint: {checkpoint.best_model_path}")
        if self.config.fit.test_after_fit:
            ckpt_path = "best" if checkpoint is not None and checkpoint.best_model_path else None
            (results,) = self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)
            rank_zero_print(f"test_acc: {results['test_acc']:.4f}")  # reduced over all processes
        if self.config.fit.register_model and checkpoint.best_model_path and self.trainer.is_global_zero:
            self.register_best(self.config.fit.register_model, checkpoint)

    def register_best(self, name: str, checkpoint: ModelCheckpoint) -> None:
        logger = self.trainer.logger
        state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=False)["state_dict"]
        self.model.load_state_dict(state)
        example = test_inputs(self.datamodule, batches=1)[0]
        tracking_uri = self.config.fit.trainer.logger.init_args.tracking_uri
        from scripts.score import serving_inputs  # the preprocessing the scoring script repeats, saved with the model

        network, classes, inputs = self.model.network, self.model.class_names, serving_inputs(self.datamodule)
        version = register_model(tracking_uri, logger.run_id, network, example, classes, name, inputs)
        print(f"registered model: {name} version {version}")

    def check_classes(self) -> None:
        """The data's classes must be the checkpoint's, in its order: else every label would mean another class."""
        trained, given = self.checkpoint_classes, list(self.datamodule.class_names)
        if trained and trained != given:
            raise ConfigError(
                f"--ckpt_path {self.config[self.subcommand].ckpt_path}: trained on classes {trained}, but the data has "
                f"{given}; give the checkpoint of this task, or data of its classes"
            )

    def before_validate(self) -> None:
        self.check_classes()

    def before_test(self) -> None:
        self.check_classes()

    def before_predict(self) -> None:
        self.check_classes()
        if self.trainer.world_size > 1:  # each process would predict, and print, its own share of the rows
            sys.exit("error: predict runs in one process: give --trainer.devices 1 --trainer.num_nodes 1")

    def after_predict(self) -> None:
        rows = [row for batch in self.trainer.predict_loop.predictions for row in batch]
        print("input,class,probability")
        for name, (label, probability) in zip(self.datamodule.predict_names, rows):
            print(f"{name},{label},{probability:.4f}")


def is_mlflow_logger(logger) -> bool:
    """Whether the config's logger is Lightning's MLFlowLogger or a subclass (ours, a user's): those get the tracking
    set-up, Azure ML's run handover included."""
    class_path = getattr(logger, "class_path", None)
    if not class_path:
        return False
    module, _, name = class_path.rpartition(".")
    logger_class = getattr(importlib.import_module(module), name, None)
    return isinstance(logger_class, type) and issubclass(logger_class, MLFlowLogger)


class ConfigError(Exception):
    """Trainer options this machine cannot run; the message names the option and what to give."""


def check_trainer(trainer: dict, writes: bool) -> None:
    """Stops before anything starts when the Trainer's device, or the output folder of a run that `writes`, cannot
    work here."""
    if str(trainer.accelerator) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"--trainer.accelerator {trainer.accelerator}: torch sees no GPU on this machine; give "
            "--trainer.accelerator cpu (or leave out configs/trainer/gpu.yaml)"
        )
    if not writes:
        return
    outputs = Path(trainer.default_root_dir or OUTPUTS)
    try:
        outputs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=outputs):
            pass
    except OSError as error:
        raise ConfigError(
            f"{outputs}: cannot write there ({error.strerror or error}); give --trainer.default_root_dir a folder "
            "you can write"
        ) from None


def set_up_tracking(args, outputs: Path, subcommand: str) -> None:
    """The MLflow logger's store, run and name: what Azure ML hands over (MLFLOW_TRACKING_URI, MLFLOW_RUN_ID), the
    user's server, or outputs/mlflow.db; checked before the run starts."""
    from_environment = os.environ.get("MLFLOW_TRACKING_URI")
    if args.tracking_uri is None:  # Lightning's logger defaults to MLFLOW_TRACKING_URI as it was at import
        args.tracking_uri = from_environment
    given = args.tracking_uri == from_environment
    source = "MLFLOW_TRACKING_URI" if given else "--trainer.logger.init_args.tracking_uri"
    if args.tracking_uri is not None:
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
    if args.run_id is None and args.run_name is None:
        # MLflow draws names from `random`, which the seed fixes: every run of a config would be named alike.
        args.run_name = f"{subcommand}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
    scheme = urlparse(args.tracking_uri).scheme
    if scheme == "sqlite":
        open_sqlite_store(args.tracking_uri)
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


def open_sqlite_store(tracking_uri: str) -> None:
    """Opens (and, if new, creates) the sqlite MLflow store before anything else does, one process at a time.

    Processes started together (torchrun, mpirun, horovodrun) each build the logger, whose MLflow client creates the
    tables of a new store; two at once collide ("duplicate column name"). MLflow keeps the store open per URI,
    so the logger's client then finds it ready.
    """
    from filelock import FileLock
    from mlflow import MlflowClient

    with FileLock(f"{tracking_uri.removeprefix('sqlite:///')}.lock"):
        MlflowClient(tracking_uri)


@rank_zero_only
def rank_zero_print(line: str) -> None:
    print(line)


def cli_main(args: list[str] | None = None, cli_class: type[TemplateCLI] = TemplateCLI) -> TemplateCLI:
    # TransferNet keeps a frozen backbone's BatchNorm in eval mode on purpose; Lightning warns of it.
    warnings.filterwarnings("ignore", r"Found \d+ module\(s\) in eval mode")
    # Lightning 2.6.6 on torch 2.14: a deprecation inside Lightning, printed on every run; nothing to do for users.
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # ClassificationModule's epoch metrics are already reduced over all processes (torchmetrics' compute).
    warnings.filterwarnings("ignore", r"It is recommended to use `self.log\('\w+', ..., sync_dist=True\)`")
    # best.ckpt's callback comes first: `ckpt_path="best"` takes it, as Lightning says at length.
    warnings.filterwarnings("ignore", r".*configured with multiple `ModelCheckpoint`")
    # ClassificationModule logs train_loss_step every log_every_n_steps global steps, across epochs too.
    warnings.filterwarnings("ignore", r"The number of training batches .* is smaller than the logging interval")
    return cli_class(
        ClassificationModule,
        ClassificationDataModule,
        subclass_mode_data=True,
        save_config_callback=TrackConfig,
        save_config_kwargs={"save_to_log_dir": False},
        trainer_defaults={
            "default_root_dir": str(OUTPUTS),
            "logger": {
                "class_path": MLFLOW_LOGGER,
                "init_args": {"experiment_name": "lightning-template", "log_model": True},
            },
        },
        parser_kwargs={"exit_on_error": False},
        args=args,
    )


def config_error_line(error: ArgumentError, args: list[str]) -> str:
    """jsonargparse explains a bad option over many lines; this keeps the culprit, what was given and what fits."""
    text = str(error)
    if text.startswith("Problems parsing config"):  # a YAML syntax error, in one of the --config files
        return yaml_error_line(args) or text.splitlines()[0]
    if missing := re.search(r"File does not exist: '([^']+)'", text):
        return f"--config {missing[1]}: no such file; give a YAML file such as configs/penguins.yaml"
    lines = [line.strip(" -") for line in text.splitlines() if line.strip(" -")]
    keys = re.findall(r'Parser key "([^"]+)"', text)
    # A class's own option (data: a datamodule's, model.optimizer: the optimizer's) is reported by its own name.
    key = f"{keys[0]}.init_args.{'.'.join(keys[1:])}" if len(keys) > 1 else keys[0] if keys else ""
    class_path = re.search(r"class_path='([\w.]+)'|NestedArg\(key='class_path', val='([\w.]+)'\)", text)
    if key and (option := re.search(r"Option '(\w+)' is not accepted", text)):  # an argument the class does not take
        owner = re.search(r"class_path '([\w.]+)'|class_path='([\w.]+)'", text)
        of = f"{owner[1] or owner[2]} takes no such argument; " if owner else ""
        return f"unrecognized arguments: --{key}.init_args.{option[1]} ({of}check the name against --print_config)"
    unusable = re.search(
        r"has no attribute|No module named|to be a subclass of|does not correspond to a subclass", text
    )
    if key and class_path and unusable:  # a class that cannot be imported, or is not of the kind the option takes
        name = class_path[1] or class_path[2]
        if wanted := re.search(r"does not correspond to a subclass of (\w+)", text):
            return f"{key}: {name} is not a {wanted[1]}; give a class derived from it, as configs/ do"
        reason = re.search(r"callable class: (.+?)\.*(?: Got value|$)", text, re.M)
        return f"{key}: {name} cannot be used here ({reason[1] if reason else lines[-1]}); give a class as configs/ do"
    given = re.search(r"(?:Given value|Got value): (.*?)(?:\. Got value: |\n|$)", text)
    if key and given:
        expected = [name for name in re.findall(r"Expected a <class '([\w.]+)'>", text) if name != "NoneType"]
        for values in re.findall(r"Expected a typing\.Literal\[(.*)\]", text):  # choices: list them
            expected += [value.strip().strip("'") for value in values.split(",")]
        wanted = f"; give {' or '.join(dict.fromkeys(expected))}" if expected else ""
        return f"{key}: {given.group(1).strip()!r} is not a valid value{wanted}"
    if "unrecognized arguments" in text or "does not accept" in text:
        return f"{lines[0]} (check the name against --print_config)"
    return lines[0]


def yaml_error_line(args: list[str]) -> str | None:
    """The first --config file that is not valid YAML, with the line and column of the mistake."""
    import yaml

    paths = [value for option, value in zip(args, args[1:]) if option == "--config"]
    paths += [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]
    for path in paths:
        try:
            yaml.safe_load(Path(path).read_text())
        except OSError:
            continue
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            return f"{path}{where}: not valid YAML ({getattr(error, 'problem', None) or error}); fix the file there"
    return None


# What a user's config, data, checkpoint, weights, launch or tracking can cause: each says what to give instead.
USER_ERRORS = (
    DataError,
    WeightsError,
    LaunchError,
    CheckpointError,
    ConfigError,
    TrackingError,
    OptimizerError,
    MisconfigurationException,
)


def main(args: list[str] | None = None) -> TemplateCLI:
    """Mistakes in the user's config, data, weights files or launch end in one line on stderr and exit status 1.
    Returns the CLI that ran (scripts.spark reads the trainer's results from it)."""
    try:
        cli = cli_main(args)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # Before the interpreter's teardown, which otherwise destroys gloo's group while its worker threads are
            # alive: now and then a process aborts then (SIGABRT, "terminate called without an active exception",
            # pytorch/pytorch#190489) and a finished fit exits 134. Not after an error: another process may still
            # be inside a collective.
            torch.distributed.destroy_process_group()
        return cli
    except SIGTERMException:
        # Lightning stops at the next batch with this SystemExit, whose status is 0: a killed run would look
        # finished to a shell or a scheduler. 143 (128 + SIGTERM) is what dying of the signal reports.
        sys.exit(128 + signal.SIGTERM)
    except ArgumentError as error:
        sys.exit(f"error: {config_error_line(error, sys.argv[1:] if args is None else args)}")
    except Exception as error:
        # jsonargparse wraps what a class raises while it is built: look for ours in the chain.
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, USER_ERRORS):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        message = str(cause).strip()
        if "\n" in message:  # raised in a DataLoader worker: PyTorch re-raises it with the worker's traceback
            message = message.splitlines()[-1].split(": ", 1)[-1]  # "datamodules.errors.DataError: <message>"
        sys.exit(f"error: {message}")


if __name__ == "__main__":
    main()
