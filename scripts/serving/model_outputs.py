"""What a fit hands on besides its checkpoints and metrics, when asked: `--model_dir` (the best network as an MLflow
model in a folder: an Azure ML pipeline's mlflow_model output) and `--register_model NAME` (that model logged to the
run and registered). scripts.train's CLI loads it only for these (scripts/training/extras.py):

    python -m scripts.train fit --config configs/penguins.yaml --register_model penguins-classifier
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger

from scripts.serving.mlflow_model import (
    ExportError,
    RegistryError,
    register_later,
    register_model,
    save_model,
    serving_inputs,
    test_inputs,
)


class OutputError(Exception):
    """An output option that cannot work (a folder in use, a name the registry refuses); the message names it."""


def check_model_dir(folder: Path, option: str) -> None:
    """Stops before anything starts when `folder` holds anything but an MLflow model saved there before (which a
    restarted job's fit replaces): a model is saved only into a new, empty or earlier model's folder. (Whether it can
    be written the CLI checks as it does every output folder: cli.check_writable.)"""
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not (folder / "MLmodel").is_file())):
        raise OutputError(
            f"{option} {folder}: neither empty nor an MLflow model's folder; give a new or empty one (nothing in it "
            "is replaced)"
        )


def check_registrable(name: str, trainer: L.Trainer, datamodule) -> None:
    """Before the fit, what would stop the registry after it: no MLflow logger or checkpoint, a name Azure ML's
    registry refuses, a datamodule that cannot be served."""
    from scripts.training.asset_names import name_problem

    if not (isinstance(trainer.logger, MLFlowLogger) and trainer.checkpoint_callback):
        raise OutputError("--register_model needs the MLflow logger and checkpoints; check trainer.logger")
    if problem := name_problem(name, "--register_model"):
        raise OutputError(problem)
    if type(datamodule).serving_kind is None:
        raise OutputError(
            f"--register_model: {type(datamodule).__name__} has no serving_kind; give it serving_kind, serving_state "
            "and serving_preprocess (the README's Add your own dataset), or train without it"
        )


def hand_on(cli, checkpoint: ModelCheckpoint | None) -> None:
    """After a fit (and its test), on global rank 0: the model folder and the registered model the options ask for."""
    config = cli.config.fit
    if checkpoint is None or not checkpoint.best_model_path:
        return
    if config.register_model:
        register_best(cli, config.register_model, checkpoint)
    if config.model_dir:
        folder = Path(config.model_dir)
        try:
            save_model_in(folder, *best_network(cli, checkpoint), serving_inputs(cli.datamodule))
        except ExportError as error:
            raise OutputError(f"--model_dir {folder}: {error}") from None
        print(f"saved model: {config.model_dir}")


def best_network(cli, checkpoint: ModelCheckpoint) -> tuple[torch.nn.Module, torch.Tensor, list[str]]:
    """The best checkpoint's network, a batch of its test inputs and its class names."""
    state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=False)["state_dict"]
    cli.model.load_state_dict(state)
    example = test_inputs(cli.datamodule, batches=1)[0]
    return cli.model.network, example, cli.model.class_names


def register_best(cli, name: str, checkpoint: ModelCheckpoint) -> None:
    logger = cli.trainer.logger
    network, example, classes = best_network(cli, checkpoint)
    tracking_uri = cli.config.fit.trainer.logger.init_args.tracking_uri
    try:
        inputs = serving_inputs(cli.datamodule)
        version = register_model(tracking_uri, logger.run_id, network, example, classes, name, inputs)
    except RegistryError as error:  # after the whole fit: what is kept, and how to register it without another
        later = register_later(tracking_uri, logger.run_id, name)
        raise OutputError(
            f"--register_model {name}: the MLflow registry refused it ({error}); the fit, its MLflow run and its "
            f"checkpoints are kept (best: {checkpoint.best_model_path}), the model is logged to the run as "
            f"runs:/{logger.run_id}/model: register it later with {later}"
        ) from None
    except ExportError as error:
        raise OutputError(f"--register_model {name}: {error}") from None
    print(f"registered model: {name} version {version}")


def save_model_in(folder: Path, network, example, class_names: list[str], inputs: dict | None) -> None:
    """save_model into `folder`, an earlier model there replaced (the folder itself stays: it may be a mount)."""
    if (folder / "MLmodel").is_file():
        for path in folder.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    save_model(network, example, class_names, folder, inputs)
