"""The template's LightningCLI: one classification module, any ClassificationDataModule, the MLflow logger set up,
what can be checked before anything starts, and after `fit` the best checkpoint tested. scripts.train, the sweeps,
Spark and the benches build it. What a plain fit does not use loads only when asked for (docs/architecture.md).

    python -m scripts.train fit --config configs/penguins.yaml --print_config
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from datamodules.base import ClassificationDataModule
from lightning_modules.classifier import ClassificationModule, refuse_lightning_optimizer_options
from scripts.training import tracking
from scripts.training.checkpoints import RandomStates, WholeCheckpointIO, add_checkpoint_arguments
from scripts.training.run_record import EvaluationReport, TrackConfig, first_process, launched

rank_zero_print = rank_zero_only(print)
PROCESSES_PER_CORE = 4  # the most CPU training processes a core: --trainer.devices' bound
OUTPUTS = Path("outputs")  # Azure ML uploads ./outputs of every job
PROGRESS_BAR_REFRESH = 10  # batches: Lightning's redraws twice a batch, a share of a short step and a log line each
OPTIONS = {  # the template's own, besides --test_after_fit and the checkpoints' (checkpoints.py)
    "--register_model": "fit: log the best checkpoint's network as the run's MLflow model, registered under this name",
    "--model_dir": "fit: also save the best checkpoint's network as an MLflow model in this folder (new or empty): "
    "what --register_model registers; an Azure ML pipeline's mlflow_model output",
    "--metrics_file": "fit, test: write the final metrics (the last validation's and the test's) to this JSON file",
}


class ConfigError(Exception):
    """Options this machine or this template cannot run."""


class TestDataFirst(L.Callback):
    """Sets the test split up right after the training data: a fit that ends by testing finds a broken or missing test
    file (MNIST's t10k files, birds' test/ folder) before its first step, not after every epoch."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.datamodule is not None:
            trainer.datamodule.setup("test")


class TemplateCLI(LightningCLI):
    def __init__(self, *positional, args=None, **kwargs) -> None:
        refuse_lightning_optimizer_options(sys.argv[1:] if args is None else args)  # the module's own are ours
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
        for option, help in OPTIONS.items():
            parser.add_argument(option, type=str | None, default=None, help=help)

    def check_on_rank_zero(self, check, *args) -> None:
        """`check(*args)`; under a launcher in global rank 0 alone, its error raised in every process once they meet
        (several_processes.py): else the others would wait for this one until torch.distributed's timeout."""
        if launched():
            importlib.import_module("scripts.training.several_processes").check_on_rank_zero(self, check, *args)
        else:
            check(*args)

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        words = sys.argv[1:] if args is None else args
        if isinstance(words, list) and sum(str(word).startswith("--config") for word in words) > 1:  # overlays
            importlib.import_module("scripts.training.config_overlays").note_replaced_callbacks(words)
        subcommand = self.config.get("subcommand")
        if subcommand and self.config[subcommand].get("ckpt_path"):  # LightningCLI reads its hyperparameters next
            from scripts.training.from_checkpoint import check_before_reading

            check_before_reading(self.config[subcommand], subcommand, words, launched())

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        if self.subcommand != "fit" or config.get("ckpt_path"):
            from scripts.training.from_checkpoint import prepare

            prepare(self, config)
        resumable = self.subcommand == "fit" and config.get("checkpoint_dir")
        if self.subcommand == "fit":
            for option in ("max_epochs", "max_steps"):  # a fit of no step would test an untrained network
                if config.trainer.get(option) == 0:
                    raise ConfigError(
                        f"--trainer.{option} 0: a fit of no {option.removeprefix('max_')[:-1]} trains nothing (its "
                        "test would measure an untrained network); give 1 or more (-1: no limit), or `test "
                        "--ckpt_path` to evaluate"
                    )
            if config.get("model_dir"):
                outputs = model_outputs("--model_dir")
                self.check_on_rank_zero(outputs.check_model_dir, Path(config.model_dir), "--model_dir")
                self.check_on_rank_zero(check_writable, Path(config.model_dir), "--model_dir")
        if resumable:
            from scripts.training import resume

            self.check_on_rank_zero(check_writable, Path(config.checkpoint_dir), "--checkpoint_dir")
            resume.prepare(self, config)
        check_trainer(config.trainer, writes=self.subcommand != "predict")
        logger, tracking_args = config.trainer.logger, None
        if tracking.is_mlflow_logger(logger):
            tracking_args = logger.init_args
            outputs = Path(config.trainer.default_root_dir or OUTPUTS)
            tracking.set_up_tracking(tracking_args, outputs, self.subcommand, first_process())
        if resumable:  # checked; nothing of the run is written yet
            resume.take_over(self, config, tracking_args)

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        trainer_config = self.config_init[self.subcommand].trainer if self.subcommand else {}
        named = list(trainer_config.get("callbacks") or [])
        if trainer_config.get("enable_progress_bar", True) and not any(isinstance(c, ProgressBar) for c in named):
            kwargs["callbacks"] = [*named, TQDMProgressBar(refresh_rate=PROGRESS_BAR_REFRESH)]
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except ValueError as error:  # the Trainer's own checks of its options (a strategy name that does not exist)
            raise ConfigError(f"trainer: {str(error).strip().splitlines()[0]}") from None
        if isinstance(logger := trainer.logger, tracking.BufferedMLFlowLogger):  # its run starts at the first batch
            logger.held = not logger.started and not logger.handed_over  # (TrackConfig; a resumed run exists)
        trainer.callbacks.append(RandomStates())
        if self.subcommand == "fit" and self.config.fit.get("ckpt_path"):  # data compared before the weights load
            from scripts.training.resume import CheckData

            trainer.callbacks.append(CheckData(self.config.fit.ckpt_path))
        if self.subcommand == "test" or (self.subcommand == "fit" and self.config.fit.test_after_fit):
            trainer.callbacks.append(EvaluationReport())
        if type(trainer.strategy.checkpoint_io).__name__ == "TorchCheckpointIO":  # a user's own plugin is left alone
            trainer.strategy.checkpoint_io = WholeCheckpointIO()
        if launched() or trainer.world_size > 1:
            importlib.import_module("scripts.training.several_processes").install(trainer, self)
        return trainer

    def before_fit(self) -> None:
        if name := self.config.fit.register_model:  # refused before the fit, not by the registry after it
            model_outputs("--register_model").check_registrable(name, self.trainer, self.datamodule)
        if self.config.fit.test_after_fit:
            self.trainer.callbacks.append(TestDataFirst())

    def after_fit(self) -> None:
        checkpoint = self.trainer.checkpoint_callback
        if checkpoint is not None and checkpoint.best_model_path:
            rank_zero_print(f"best checkpoint: {checkpoint.best_model_path}")
        if self.trainer.global_step == 0:  # nothing trained, in this fit or the one it resumed
            importlib.import_module("scripts.training.failed_runs").end_failed(self.trainer)
            raise ConfigError(
                "the fit trained no step (check trainer.max_epochs, max_steps, limit_train_batches and the training "
                "data): its network is untrained, so it is not tested; give options that train at least one step"
            )
        metrics = dict(self.trainer.callback_metrics)  # the last validation's: testing replaces them
        if self.config.fit.test_after_fit:
            ckpt_path = "best" if checkpoint is not None and checkpoint.best_model_path else None
            (results,) = self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)
            validation = getattr(self.datamodule, "tests_on_validation", False)  # results: reduced over processes
            rank_zero_print(f"test_acc: {results['test_acc']:.4f}" + " (validation split: optimistic)" * validation)
            metrics.update(results)
        config = self.config.fit
        if config.metrics_file and self.trainer.is_global_zero:
            importlib.import_module("scripts.training.metrics_file").write_metrics(metrics, Path(config.metrics_file))
        if (config.register_model or config.model_dir) and self.trainer.is_global_zero:
            model_outputs("--register_model").hand_on(self, checkpoint)

    def before_validate(self) -> None:  # validate, test and predict start from a checkpoint: from_checkpoint.py
        from scripts.training.from_checkpoint import before_command

        before_command(self)

    before_test = before_predict = before_validate

    def after_test(self) -> None:
        if self.config.test.metrics_file and self.trainer.is_global_zero:
            metrics, path = dict(self.trainer.callback_metrics), Path(self.config.test.metrics_file)
            importlib.import_module("scripts.training.metrics_file").write_metrics(metrics, path)

    def after_predict(self) -> None:
        from scripts.training.from_checkpoint import write_predictions

        write_predictions(self)


def check_trainer(trainer: dict, writes: bool) -> None:
    """The Trainer's options that cannot run here (a GPU this machine lacks, a count below 1 that Lightning divides by,
    nodes no launcher starts, more CPU processes than its cores run) and the output folder of a run that `writes`."""
    if str(trainer.accelerator) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"--trainer.accelerator {trainer.accelerator}: torch sees no GPU on this machine; give "
            "--trainer.accelerator cpu (or leave out configs/trainer/gpu.yaml)"
        )
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
    # The machine's cores, not this process's share (mpirun binds each process to one). Past a few a core, processes
    # only wait their turn.
    most = PROCESSES_PER_CORE * (os.cpu_count() or 1)
    if on_cpus and not launched() and devices.lstrip("-").isdigit() and not 1 <= int(devices) <= most:
        raise ConfigError(
            f"--trainer.devices {devices}: on CPUs each device is a training process; give 1 to {most} "
            f"({PROCESSES_PER_CORE} a core of this machine's {os.cpu_count() or 1})"
        )
    if writes:
        check_writable(Path(trainer.default_root_dir or OUTPUTS), "--trainer.default_root_dir")


def check_writable(folder: Path, option: str) -> None:
    """Whether `folder` (given by `option`) can be made and written. Makes nothing: a start that fails later leaves no
    empty folder behind."""
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


def model_outputs(option: str):
    """The serving extra's model_outputs.py, which `option` needs (one line where the extra is missing: extras.py)."""
    from scripts.training.extras import load

    return load("scripts.serving.model_outputs", "serving", option)


def make_cli(args: list[str] | None, cli_class: type[TemplateCLI]) -> TemplateCLI:
    logger = {"class_path": "scripts.training.tracking.BufferedMLFlowLogger",
              "init_args": {"experiment_name": "lightning-template", "log_model": True}}  # fmt: skip
    return cli_class(
        ClassificationModule,
        ClassificationDataModule,
        subclass_mode_data=True,
        save_config_callback=TrackConfig,
        save_config_kwargs={"save_to_log_dir": False},
        trainer_defaults={"default_root_dir": str(OUTPUTS), "logger": logger},
        parser_kwargs={"exit_on_error": False},
        auto_configure_optimizers=False,  # the module's own: model.optimizer, model.lr_scheduler
        args=args,
    )
