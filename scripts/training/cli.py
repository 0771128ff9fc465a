"""The template's LightningCLI: one classification module, any ClassificationDataModule, the MLflow logger set up
(scripts/training/run_record.py), checkpoints that resume (checkpoints.py), and after `fit` the best checkpoint
tested. scripts.train runs it; the sweeps, Spark and the benches build it too.

    python -m scripts.train fit --config configs/penguins.yaml --print_config

A plain fit loads only what it uses: several processes (scripts/training/several_processes.py and the modules it
names), `--register_model` and `--model_dir` (the serving extra's model_outputs.py), a tracking server
(tracking_server.py) and the networks and datamodules of other tasks load only when the command asks for them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from datamodules.base import ClassificationDataModule
from datamodules.errors import csv_line
from lightning_modules.classifier import ClassificationModule, refuse_lightning_optimizer_options
from scripts.training import tracking
from scripts.training.checkpoints import (
    RandomStates,
    RankZeroCheckpointIO,
    add_checkpoint_arguments,
    check_ckpt_path,
    check_resume,
    hold,
    ours_only,
    resume_from,
    saved_run_id,
)
from scripts.training.run_record import TrackConfig, first_process, launched, write_metrics

PROCESSES_PER_CORE = 4  # the most CPU training processes a core: --trainer.devices' bound
OUTPUTS = Path("outputs")  # Azure ML uploads ./outputs of every job
MLFLOW_LOGGER = "scripts.training.tracking.BufferedMLFlowLogger"
# The bar's redraws, in batches: Lightning's default redraws at every batch, twice, a share of every short step, and
# into a job's log file a line each time.
PROGRESS_BAR_REFRESH = 10


class ConfigError(Exception):
    """Options this machine or this template cannot run; the message names the option and what to give."""


class TestDataFirst(L.Callback):
    """Sets the test split up right after the training data, before the first step: a fit that ends by testing finds a
    broken or missing test file (MNIST's t10k files, birds' test/ folder) at once, not after every epoch."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.datamodule is not None:
            trainer.datamodule.setup("test")


class TemplateCLI(LightningCLI):
    def __init__(self, *positional, args=None, **kwargs) -> None:
        words = sys.argv[1:] if args is None else args
        refuse_lightning_optimizer_options(words)  # the module's own are the template's
        self.same_start = None  # several processes: their one exchange at the start (several_processes.py)
        self.resumes = False
        self.checkpoint_classes: list[str] = []
        super().__init__(*positional, args=args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        add_checkpoint_arguments(parser)
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

    def several_processes(self):
        """The multi-process machinery, loaded the first time a command needs it."""
        from scripts.training import several_processes

        if self.same_start is None:
            self.same_start = several_processes.SameStart()
        return several_processes

    def check_on_rank_zero(self, check, *args) -> None:
        """`check(*args)` now; under a launcher in global rank 0 alone, its error raised in every process once they
        meet (SameStart): the others would wait for this one until torch.distributed's timeout."""
        if launched():
            self.several_processes()
            self.same_start.check_on_rank_zero(check, *args)
        else:
            check(*args)

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        # LightningCLI reads the checkpoint's hyperparameters next.
        check_ckpt_path(subcommand and self.config[subcommand].get("ckpt_path"), launched())

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        if self.subcommand in ("validate", "test", "predict") and not config.get("ckpt_path"):
            raise ConfigError(
                f"{self.subcommand} needs --ckpt_path: the .ckpt a fit wrote (outputs/<exp>/<run>/checkpoints/"
                "best.ckpt; `make evaluate` and `make predict` find the newest); without it the network is untrained"
            )
        network_args = config.model.network.get("init_args") or {}
        if config.get("ckpt_path") and "weights" in network_args:  # a TransferNet: the checkpoint has every weight
            from lightning_modules.transfer_net import skip_pretrained_weights

            skip_pretrained_weights(network_args)
        if self.subcommand != "fit" and config.get("ckpt_path"):
            # LightningCLI has read the checkpoint's hyperparameters into model: its class names are the truth. A
            # datamodule that takes `classes` gets them (predict labels with them; test checks its folders have them).
            classes, data_args = config.model.get("class_names"), config.data.get("init_args") or {}
            self.checkpoint_classes = list(classes or [])
            if classes and "classes" in data_args:
                data_args["classes"] = list(classes)
            # The checkpoint's ModelCheckpoint state names its fit's folder, not this command's: nothing to act on.
            warnings.filterwarnings("ignore", r"The dirpath has changed from")
        if self.subcommand == "fit":
            check_trains(config.trainer)
            if config.get("checkpoint_dir"):
                self.check_on_rank_zero(check_writable, Path(config.checkpoint_dir), "--checkpoint_dir")
            if config.get("model_dir"):
                from scripts.training.extras import load

                outputs = load("scripts.serving.model_outputs", "serving", "--model_dir")
                self.check_on_rank_zero(outputs.check_model_dir, Path(config.model_dir), "--model_dir")
                self.check_on_rank_zero(check_writable, Path(config.model_dir), "--model_dir")
            if ours_only(config.get("checkpoint_dir")):  # Lightning warns of it at every start, resumes included
                warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty")
        if self.subcommand == "fit" and (last := resume_from(config)):
            check_resume(last, self.parser.dump(self.config, skip_unset=False, skip_validation=True))  # before the run
            config.ckpt_path = str(last)
            self.resumes = True
            rank_zero_print(f"resuming from {last}")
        if self.subcommand == "predict":
            # Its output is a CSV on stdout (`predict > out.csv`): no progress bar there. It records nothing: no run.
            config.trainer.enable_progress_bar, config.trainer.logger = False, False
        check_trainer(config.trainer, writes=self.subcommand != "predict")
        logger = config.trainer.logger
        if tracking.is_mlflow_logger(logger):
            args = logger.init_args
            outputs = Path(config.trainer.default_root_dir or OUTPUTS)
            tracking.set_up_tracking(args, outputs, self.subcommand, first_process())
            if self.subcommand == "fit" and args.run_id is None:  # a resumed fit goes on in its own run
                args.run_id = tracking.existing_run(args.tracking_uri, saved_run_id(config.checkpoint_dir))
                args.run_name = None if args.run_id else args.run_name
        if self.subcommand == "fit" and config.get("checkpoint_dir"):  # checked; nothing of the run is written yet
            self.check_on_rank_zero(hold, Path(config.checkpoint_dir))

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        trainer_config = self.config_init[self.subcommand].trainer if self.subcommand else {}
        named = list(trainer_config.get("callbacks") or [])
        if trainer_config.get("enable_progress_bar", True) and not any(isinstance(c, ProgressBar) for c in named):
            kwargs["callbacks"] = [*named, TQDMProgressBar(refresh_rate=PROGRESS_BAR_REFRESH)]
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except ValueError as error:  # the Trainer's own checks of its options (a strategy name that does not exist)
            raise ConfigError(f"trainer: {str(error).strip().splitlines()[0]}") from None
        trainer.callbacks.append(RandomStates())
        if self.subcommand == "test" or (self.subcommand == "fit" and self.config.fit.test_after_fit):
            from scripts.training.run_record import EvaluationReport

            trainer.callbacks.append(EvaluationReport())
        if type(trainer.strategy.checkpoint_io).__name__ == "TorchCheckpointIO":  # a user's own plugin is left alone
            trainer.strategy.checkpoint_io = RankZeroCheckpointIO(trainer.strategy)
        if launched() or trainer.world_size > 1:
            several = self.several_processes()
            self.same_start.ckpt_path = self.config[self.subcommand].get("ckpt_path")
            self.same_start.checkpoint_dir = self.config[self.subcommand].get("checkpoint_dir")
            self.same_start.resumes = self.resumes
            several.install(trainer, self.same_start)
        elif self.same_start is not None and self.same_start.error is not None:
            raise self.same_start.error
        return trainer

    def before_fit(self) -> None:
        if self.config.fit.register_model:  # refused before the fit, not by the registry after it
            from scripts.training.extras import load

            outputs = load("scripts.serving.model_outputs", "serving", "--register_model")
            outputs.check_registrable(self.config.fit.register_model, self.trainer, self.datamodule)
        if self.config.fit.test_after_fit:
            self.trainer.callbacks.append(TestDataFirst())

    def after_fit(self) -> None:
        checkpoint = self.trainer.checkpoint_callback
        if checkpoint is not None and checkpoint.best_model_path:
            rank_zero_print(f"best checkpoint: {checkpoint.best_model_path}")
        if self.trainer.global_step == 0:  # nothing trained, in this fit or the one it resumed
            # Lightning ended the run FINISHED (its fit loop skips the hooks a stop there would go through); a fit
            # that trained nothing did not succeed.
            if isinstance(self.trainer.logger, tracking.BufferedMLFlowLogger) and self.trainer.is_global_zero:
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
        config = self.config.fit
        if config.metrics_file and self.trainer.is_global_zero:
            write_metrics(metrics, Path(config.metrics_file))
        if (config.register_model or config.model_dir) and self.trainer.is_global_zero:
            from scripts.training.extras import load

            load("scripts.serving.model_outputs", "serving", "--register_model").hand_on(self, checkpoint)

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
        # scripts.score's lines: a name's comma or carriage return quoted, bytes that are not UTF-8 as \xNN
        sys.stdout.write(csv_line(["input", "class", "probability"]))
        for name, (label, probability) in zip(self.datamodule.predict_names, rows):
            sys.stdout.write(csv_line([name, label, f"{probability:.4f}"]))
        sys.stdout.flush()  # here, where scripts.train ends a closed pipe (`| head -1`) quietly; not at exit


def check_trainer(trainer: dict, writes: bool) -> None:
    """Stops before anything starts when the Trainer's device, or the output folder of a run that `writes`, cannot
    work here."""
    if str(trainer.accelerator) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"--trainer.accelerator {trainer.accelerator}: torch sees no GPU on this machine; give "
            "--trainer.accelerator cpu (or leave out configs/trainer/gpu.yaml)"
        )
    check_counts(trainer)
    if writes:
        check_writable(Path(trainer.default_root_dir or OUTPUTS), "--trainer.default_root_dir")


def check_counts(trainer: dict) -> None:
    """The Trainer's counts that cannot run: Lightning divides by some (a ZeroDivisionError traceback), waits forever
    for nodes no launcher starts, and starts a process per CPU "device" however few the cores (64 on 2 cores)."""
    for option in ("accumulate_grad_batches", "check_val_every_n_epoch", "num_nodes"):
        value = trainer.get(option)
        if isinstance(value, int) and value < 1:
            raise ConfigError(f"--trainer.{option} {value}: give 1 or more")
    interval = trainer.get("val_check_interval")
    if isinstance(interval, int | float) and interval <= 0:
        raise ConfigError(f"--trainer.val_check_interval {interval}: give a share of an epoch (0 to 1) or batches")
    if (trainer.get("num_nodes") or 1) > 1 and not launched():
        raise ConfigError(
            f"--trainer.num_nodes {trainer.num_nodes}: no launcher started this process, so no other node's processes "
            "would join it (it would wait for them forever); give 1, or start every node with torchrun or mpirun "
            "(python -m scripts.submit --nodes N does)"
        )
    devices, accelerator = str(trainer.get("devices")), str(trainer.get("accelerator"))
    on_cpus = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    # The machine's cores, not this process's share: a launcher (mpirun) binds each process it starts to one core, and
    # its processes exist already (their count is the launcher's). Past a few a core, processes only wait their turn.
    most = PROCESSES_PER_CORE * (os.cpu_count() or 1)
    if on_cpus and not launched() and devices.lstrip("-").isdigit() and not 1 <= int(devices) <= most:
        raise ConfigError(
            f"--trainer.devices {devices}: on CPUs each device is a training process; give 1 to {most} "
            f"({PROCESSES_PER_CORE} a core of this machine's {os.cpu_count() or 1})"
        )


def check_writable(folder: Path, option: str) -> None:
    """Stops before anything starts when `folder`, given by `option`, cannot be made or written. Makes nothing: a
    start that fails later leaves no empty folder behind (the fit makes it when it writes there)."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{option} {folder}: a file, not a folder; give a folder, or a path that does not exist yet")
    existing = next(parent for parent in (folder, *folder.absolute().parents) if parent.exists())
    if not existing.is_dir():
        raise ConfigError(f"{folder}: cannot write there (Not a directory); give {option} a folder you can write")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ConfigError(
            f"{folder}: cannot write there ({error.strerror or error}); give {option} a folder you can write"
        ) from None


def check_trains(trainer: dict) -> None:
    """A fit that trains no step would end by testing, and registering, an untrained network as if it were the model."""
    for option in ("max_epochs", "max_steps"):
        if trainer.get(option) == 0:
            raise ConfigError(
                f"--trainer.{option} 0: a fit of no {option.removeprefix('max_')[:-1]} trains nothing (its test would "
                f"measure an untrained network); give 1 or more (-1: no limit), or `test --ckpt_path` to evaluate"
            )


@rank_zero_only
def rank_zero_print(line: str) -> None:
    print(line)


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
        auto_configure_optimizers=False,  # the module's own: model.optimizer, model.lr_scheduler
        args=args,
    )
