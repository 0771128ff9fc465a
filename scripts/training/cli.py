"""The template's LightningCLI: one classification module, any ClassificationDataModule, the MLflow logger set up
(Azure ML's run handover, a checked tracking URI, the sqlite store), checkpoints that resume, the run's record, and
after `fit` the best checkpoint tested and, with --register_model, registered. scripts.train runs it; the sweeps,
Spark and the benches build it too.

    python -m scripts.train fit --config configs/penguins.yaml --print_config
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from datamodules.base import ClassificationDataModule
from datamodules.errors import DataError
from lightning_modules.classifier import ClassificationModule, DivergedError, OptimizerError
from lightning_modules.transfer_net import WeightsError, skip_pretrained_weights
from scripts.serving.mlflow_model import (
    ExportError,
    RegistryError,
    register_later,
    register_model,
    save_model,
    serving_inputs,
    test_inputs,
)
from scripts.training import hook_calls
from scripts.training.checkpoints import (
    CONFIG_KEY,
    RUN_ID_FILE,
    add_checkpoint_arguments,
    check_resume,
    flatten,
    keep_run_id,
    resume_from,
    saved_run_id,
)
from scripts.training.early_stops import watch
from scripts.training.progress_bar import ThrottledProgressBar
from scripts.training.random_states import RandomStates
from scripts.training.same_start import SameStart
from scripts.training.sigterm import StopTogether, sigterm_received
from scripts.training.throughput import EpochThroughput
from scripts.training.tracking import (
    HTTP_LIMITS,
    BufferedMLFlowLogger,
    TrackingError,
    check_tracking_uri,
    credentials_out_of_uri,
    open_sqlite_store,
)
from strategies.checkpoint_io import CheckpointError, RankZeroCheckpointIO, check_checkpoint_file
from strategies.launch_check import check_launch, launched_first, launched_processes
from strategies.mpi_environment import LaunchError

OUTPUTS = Path("outputs")  # Azure ML uploads ./outputs of every job
MLFLOW_LOGGER = "scripts.training.tracking.BufferedMLFlowLogger"
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
        # Checked when parsed: checking it again would cost ~50 ms, a sweep trial's fifth of its CLI time.
        text = self.parser.dump(self.config, skip_unset=False, skip_validation=True)
        self.config_text = text
        path = run_dir(trainer) / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if isinstance(trainer.logger, MLFlowLogger):
            import yaml
            from mlflow.entities import Param

            params = flatten(yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))  # libyaml: ~10x
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


class TestDataFirst(L.Callback):
    """Sets the test split up right after the training data, before the first step: a fit that ends by testing finds a
    broken or missing test file (MNIST's t10k files, birds' test/ folder) at once, not after every epoch."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.datamodule is not None:
            trainer.datamodule.setup("test")


class TemplateCLI(LightningCLI):
    def __init__(self, *positional, args=None, **kwargs) -> None:
        self.requested = requested_subcommand(sys.argv[1:] if args is None else args)
        self.same_start = SameStart()
        super().__init__(*positional, args=args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        # Only the subcommand being run gets a parser: building one (jsonargparse reading the Trainer's, the module's
        # and the datamodules' signatures) is ~0.1 s of every command's start. No subcommand, or an unknown one:
        # all four, for the help and the error that list them.
        every = LightningCLI.subcommands()
        return {self.requested: every[self.requested]} if self.requested in every else every

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
        parser.add_argument(
            "--model_dir", type=str | None, default=None,
            help="fit: also save the best checkpoint's network as an MLflow model in this folder (new or empty): what "
            "--register_model registers; an Azure ML pipeline's mlflow_model output",
        )  # fmt: skip
        parser.add_argument(
            "--metrics_file", type=str | None, default=None,
            help="fit, test: write the metrics at the end (the last validation's and the test's) to this JSON file",
        )  # fmt: skip

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        ckpt_path = subcommand and self.config[subcommand].get("ckpt_path")
        # LightningCLI reads the checkpoint's hyperparameters next, with a bare torch.load: check the file first.
        # Rank 0 only: on other nodes it need not exist (rank 0 reads it for all: strategies/checkpoint_io.py). A
        # missing one (LightningCLI skips it), when a launcher started other processes too: not here, where they would
        # wait for this one until torch.distributed's timeout (30 minutes); rank 0's read of it at the run's start
        # stops every process together.
        named = ckpt_path and ckpt_path not in ("best", "last", "hpc", "registry")
        if named and launched_first() and (Path(ckpt_path).exists() or launched_processes() == 1):
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
        if self.subcommand != "fit":
            # The checkpoint's ModelCheckpoint state names its fit's folder, not this command's: nothing to act on.
            warnings.filterwarnings("ignore", r"The dirpath has changed from")
        if self.subcommand == "fit":
            check_trains(config.trainer)
            if config.get("checkpoint_dir"):
                self.same_start.check_on_rank_zero(check_writable, Path(config.checkpoint_dir), "--checkpoint_dir")
            if config.get("model_dir"):
                self.same_start.check_on_rank_zero(check_model_dir, Path(config.model_dir), "--model_dir")
            if ours_only(config.get("checkpoint_dir")):  # Lightning warns of it at every start, resumes included
                warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty")
        if self.subcommand == "fit" and (last := resume_from(config)):
            import yaml

            # Before the run is touched.
            dumped = yaml.safe_load(self.parser.dump(self.config, skip_unset=False, skip_validation=True))
            check_resume(last, flatten(dumped[self.subcommand]))
            config.ckpt_path = str(last)
            self.same_start.resumes = True
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
        # The config's own callbacks, before the Trainer adds its default progress bar to the same list.
        named = list(self.config_init[self.subcommand].trainer.callbacks or []) if self.subcommand else []
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except ValueError as error:  # the Trainer's own checks of its options (a strategy name that does not exist)
            raise ConfigError(f"trainer: {str(error).strip().splitlines()[0]}") from None
        check_launch(trainer.num_devices, trainer.num_nodes)
        # First: before anything is restored, or the run's record touched.
        self.same_start.ckpt_path = self.config[self.subcommand].get("ckpt_path")
        self.same_start.checkpoint_dir = self.config[self.subcommand].get("checkpoint_dir")
        trainer.callbacks.insert(0, self.same_start)
        trainer.callbacks.append(StopTogether())  # not in trainer.callbacks' option: a config's list would drop it
        trainer.callbacks.append(RandomStates())
        bar = trainer.progress_bar_callback
        if type(bar) is TQDMProgressBar and not any(callback is bar for callback in named):  # the Trainer's default
            trainer.callbacks[trainer.callbacks.index(bar)] = ThrottledProgressBar()
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # a user's own plugin is left alone
            trainer.strategy.checkpoint_io = RankZeroCheckpointIO(trainer.strategy)
        watch()  # until the processes meet: one that stops before ends this one too
        return trainer

    def before_fit(self) -> None:
        checkpoint = self.trainer.checkpoint_callback
        if self.config.fit.register_model and not (isinstance(self.trainer.logger, MLFlowLogger) and checkpoint):
            sys.exit("error: --register_model needs the MLflow logger and checkpoints; check trainer.logger")
        if self.config.fit.register_model:  # refused before the fit, not by the registry after it
            from scripts.azure_ml.names import name_problem

            if problem := name_problem(self.config.fit.register_model, "--register_model"):
                sys.exit(f"error: {problem}")
        if self.config.fit.register_model and type(self.datamodule).serving_kind is None:
            sys.exit(
                f"error: --register_model: {type(self.datamodule).__name__} has no serving_kind; give it serving_kind, "
                "serving_state and serving_preprocess (the README's Add your own dataset), or train without it"
            )
        if self.config.fit.test_after_fit:
            self.trainer.callbacks.append(TestDataFirst())

    def after_fit(self) -> None:
        checkpoint = self.trainer.checkpoint_callback
        if checkpoint is not None and checkpoint.best_model_path:
            rank_zero_print(f"best checkpoint: {checkpoint.best_model_path}")
        if self.trainer.global_step == 0:  # nothing trained, in this fit or the one it resumed
            # Lightning ended the run FINISHED (its fit loop skips the hooks a stop there would go through); a fit
            # that trained nothing did not succeed.
            if isinstance(self.trainer.logger, BufferedMLFlowLogger) and self.trainer.is_global_zero:
                self.trainer.logger.end_failed()
            raise ConfigError(
                "the fit trained no step (check trainer.max_epochs, max_steps, limit_train_batches and the training "
                "data): its network is untrained, so it is not tested; give options that train at least one step"
            )
        metrics = dict(self.trainer.callback_metrics)  # the last validation's: testing replaces them
        if self.config.fit.test_after_fit:
            ckpt_path = "best" if checkpoint is not None and checkpoint.best_model_path else None
            (results,) = self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)
            rank_zero_print(f"test_acc: {results['test_acc']:.4f}")  # reduced over all processes
            metrics.update(results)
        if self.config.fit.metrics_file and self.trainer.is_global_zero:
            write_metrics(metrics, Path(self.config.fit.metrics_file))
        if self.trainer.is_global_zero and checkpoint is not None and checkpoint.best_model_path:
            if self.config.fit.register_model:
                self.register_best(self.config.fit.register_model, checkpoint)
            if self.config.fit.model_dir:
                folder = Path(self.config.fit.model_dir)
                try:
                    save_model_in(folder, *self.best_network(checkpoint), serving_inputs(self.datamodule))
                except ExportError as error:
                    raise ConfigError(f"--model_dir {folder}: {error}") from None
                print(f"saved model: {self.config.fit.model_dir}")

    def best_network(self, checkpoint: ModelCheckpoint) -> tuple[torch.nn.Module, torch.Tensor, list[str]]:
        """The best checkpoint's network, a batch of its test inputs and its class names."""
        state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=False)["state_dict"]
        self.model.load_state_dict(state)
        example = test_inputs(self.datamodule, batches=1)[0]
        return self.model.network, example, self.model.class_names

    def register_best(self, name: str, checkpoint: ModelCheckpoint) -> None:
        logger = self.trainer.logger
        network, example, classes = self.best_network(checkpoint)
        tracking_uri = self.config.fit.trainer.logger.init_args.tracking_uri
        try:
            inputs = serving_inputs(self.datamodule)
            version = register_model(tracking_uri, logger.run_id, network, example, classes, name, inputs)
        except RegistryError as error:  # after the whole fit: what is kept, and how to register it without another
            later = register_later(tracking_uri, logger.run_id, name)
            raise ConfigError(
                f"--register_model {name}: the MLflow registry refused it ({error}); the fit, its MLflow run and its "
                f"checkpoints are kept (best: {checkpoint.best_model_path}), the model is logged to the run as "
                f"runs:/{logger.run_id}/model: register it later with {later}"
            ) from None
        except ExportError as error:
            raise ConfigError(f"--register_model {name}: {error}") from None
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

    def after_test(self) -> None:
        if self.config.test.metrics_file and self.trainer.is_global_zero:
            write_metrics(dict(self.trainer.callback_metrics), Path(self.config.test.metrics_file))

    def before_predict(self) -> None:
        self.check_classes()
        if self.trainer.world_size > 1:  # each process would predict, and print, its own share of the rows
            sys.exit("error: predict runs in one process: give --trainer.devices 1 --trainer.num_nodes 1")

    def after_predict(self) -> None:
        rows = [row for batch in self.trainer.predict_loop.predictions for row in batch]
        out = csv.writer(sys.stdout, lineterminator="\n")  # quotes a name holding a comma: `turkey, wild.jpg`
        out.writerow(["input", "class", "probability"])
        for name, (label, probability) in zip(self.datamodule.predict_names, rows):
            out.writerow([name, label, f"{probability:.4f}"])
        sys.stdout.flush()  # here, where scripts.train ends a closed pipe (`| head -1`) quietly; not at exit


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
    if writes:
        check_writable(Path(trainer.default_root_dir or OUTPUTS), "--trainer.default_root_dir")


def check_writable(folder: Path, option: str) -> None:
    """Stops before anything starts when `folder`, given by `option`, cannot be made or written."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{option} {folder}: a file, not a folder; give a folder, or a path that does not exist yet")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ConfigError(
            f"{folder}: cannot write there ({error.strerror or error}); give {option} a folder you can write"
        ) from None


def check_model_dir(folder: Path, option: str) -> None:
    """Stops before anything starts when `folder` holds anything but an MLflow model saved there before (which a
    restarted job's fit replaces): a model is saved only into a new, empty or earlier model's folder."""
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not (folder / "MLmodel").is_file())):
        raise ConfigError(
            f"{option} {folder}: neither empty nor an MLflow model's folder; give a new or empty one (nothing in it "
            "is replaced)"
        )
    check_writable(folder, option)


def save_model_in(folder: Path, network, example, class_names: list[str], inputs: dict | None) -> None:
    """save_model into `folder`, an earlier model there replaced (the folder itself stays: it may be a mount)."""
    if (folder / "MLmodel").is_file():
        for path in folder.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    save_model(network, example, class_names, folder, inputs)


def write_metrics(metrics: dict, path: Path) -> None:
    """The metrics as a JSON object of numbers, written to a temporary name beside `path` and renamed."""
    import json

    values = {name: float(value) for name, value in sorted(metrics.items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(values, indent=1) + "\n")
    part.replace(path)
    rank_zero_print(f"wrote metrics: {path}")


def ours_only(folder: str | None) -> bool:
    """Whether --checkpoint_dir `folder` holds nothing but what fits write there (so Lightning's warning that it is
    not empty tells the user nothing)."""
    if not folder or not Path(folder).is_dir():
        return bool(folder)
    return {path.name for path in Path(folder).iterdir()} <= {"best.ckpt", "last.ckpt", RUN_ID_FILE}


def check_trains(trainer: dict) -> None:
    """A fit that trains no step would end by testing, and registering, an untrained network as if it were the model."""
    for option in ("max_epochs", "max_steps"):
        if trainer.get(option) == 0:
            raise ConfigError(
                f"--trainer.{option} 0: a fit of no {option.removeprefix('max_')[:-1]} trains nothing (its test would "
                f"measure an untrained network); give 1 or more (-1: no limit), or `test --ckpt_path` to evaluate"
            )


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
    named = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if named and named != args.experiment_name:
        # MLflow's own variable, set for this command: it wins over the experiment a shared YAML names.
        if launched_first():
            print(f"experiment {named!r} (MLFLOW_EXPERIMENT_NAME), not the config's {args.experiment_name!r}",
                  file=sys.stderr)  # fmt: skip
        args.experiment_name = named
    if args.run_id is None and args.run_name is None:
        # MLflow draws names from `random`, which the seed fixes: every run of a config would be named alike.
        args.run_name = f"{subcommand}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
    scheme = urlparse(args.tracking_uri).scheme
    if scheme == "sqlite":
        open_sqlite_store(args.tracking_uri)
    if scheme != "sqlite":
        for name, value in HTTP_LIMITS.items():  # also in the processes started from this one
            os.environ.setdefault(name, value)
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


@rank_zero_only
def rank_zero_print(line: str) -> None:
    print(line)


class NoAdvertisements(logging.Filter):
    """Drops Lightning's tips to install its cloud services (litlogger, litmodels), printed on every run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def requested_subcommand(args) -> str | None:
    """The subcommand in a command line (its first word that is not an option or the path after -c/--config)."""
    if not isinstance(args, list | tuple):
        return None
    words = iter(args)
    for word in words:
        if word in ("-c", "--config"):
            next(words, None)
        elif not str(word).startswith("-"):
            return str(word)
    return None


def no_gpu_lookups_without_gpus() -> None:
    """Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 when imported, so that asking torch for a GPU cannot start CUDA
    before a process forks. Torch's Adam asks at every step: with the variable set, on a host without NVIDIA's
    driver (CPU machines, CI, CPU clusters), each ask looks for libnvidia-ml.so.1 again and fails, ~0.2 ms a step
    (a penguin step is ~1.3 ms). Where no GPU is visible there is no CUDA to start: it is unset then."""
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1" and torch.cuda.device_count() == 0:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]


def cli_main(args: list[str] | None = None, cli_class: type[TemplateCLI] = TemplateCLI) -> TemplateCLI:
    no_gpu_lookups_without_gpus()
    hook_calls.install()
    # Lightning's rank-zero messages go to this logger (lightning/pytorch/utilities/rank_zero.py).
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, NoAdvertisements) for f in rank_zero_logger.filters):
        rank_zero_logger.addFilter(NoAdvertisements())
    # TransferNet keeps a frozen backbone's BatchNorm in eval mode on purpose; Lightning warns of it.
    warnings.filterwarnings("ignore", r"Found \d+ module\(s\) in eval mode")
    # Lightning 2.6.6 on torch 2.14: a deprecation inside Lightning, printed on every run; nothing to do for users.
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # MLflow logs each failed write to its sqlite store with a traceback, then raises it: the CLI reports it, once. (A
    # filter: MLflow resets its loggers' levels when it is first imported.)
    store_log = logging.getLogger("mlflow.store.db.utils")
    if not store_log.filters:
        store_log.addFilter(lambda record: record.levelno > logging.ERROR)
    # ClassificationModule's epoch metrics are already reduced over all processes (torchmetrics' compute).
    warnings.filterwarnings("ignore", r"It is recommended to use `self.log\('\w+', ..., sync_dist=True\)`")
    # best.ckpt's callback comes first: `ckpt_path="best"` takes it, as Lightning says at length.
    warnings.filterwarnings("ignore", r".*configured with multiple `ModelCheckpoint`")
    # ClassificationModule logs train_loss_step every log_every_n_steps global steps, across epochs too.
    warnings.filterwarnings("ignore", r"The number of training batches .* is smaller than the logging interval")
    return make_cli(args, cli_class)


def make_cli(args: list[str] | None, cli_class: type[TemplateCLI]) -> TemplateCLI:
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


class _Parsed(Exception):
    pass


class _ParseOnly(TemplateCLI):
    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        raise _Parsed  # before LightningCLI seeds this process and makes anything


def parse_only(args: list[str]) -> None:
    """Parses `args` as cli_main would and stops before anything is made, quietly, whatever it finds: what a process
    that is going to fork such commands does first (the sweep's launcher, scripts/sweeps/launcher.py). jsonargparse
    keeps the parser it builds for each class that a command names (module, network, optimizer, datamodule, logger,
    callbacks): a forked trial finds them built, ~40 ms of each trial's start. Nothing else is kept."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        with contextlib.suppress(Exception, SystemExit):  # _Parsed, or what the command will say itself
            make_cli(args, _ParseOnly)


# What a user's config, data, checkpoint, weights, launch or tracking can cause: each says what to give instead.
USER_ERRORS = (
    DataError,
    WeightsError,
    LaunchError,
    CheckpointError,
    ConfigError,
    TrackingError,
    OptimizerError,
    DivergedError,
    MisconfigurationException,
)
