"""The CLI's part for a command that starts from a checkpoint (validate, test, predict, a fit given --ckpt_path): the
checkpoint's class names are the truth, and predict prints its answers as CSV. Loaded only for such a command.

    python -m scripts.train predict --config configs/penguins.yaml --ckpt_path CKPT --data.predict_path new.csv
"""

from __future__ import annotations

import sys
import warnings
import zipfile
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from datamodules.printable import csv_line
from scripts.training.checkpoints import CheckpointError, flatten


def check_checkpoint_file(path: str | Path) -> None:
    """Raises CheckpointError for a file that is missing or not torch.save's zip (a --ckpt_path, a resume's last.ckpt,
    and rank 0's read of a checkpoint for several processes: several_processes.py)."""
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
    """Raises CheckpointError for a --ckpt_path file that is not a checkpoint, before LightningCLI's bare torch.load of
    it. Under a launcher only in rank 0, which reads it for all, and a missing one only alone: the others would wait
    for this one; rank 0's read at the run's start stops every process together."""
    if not ckpt_path or ckpt_path in ("best", "last", "hpc", "registry"):
        return
    if not launched:
        check_checkpoint_file(ckpt_path)
        return
    from strategies.launch_check import launched_first, launched_processes

    if launched_first() and (Path(ckpt_path).exists() or launched_processes() == 1):
        check_checkpoint_file(ckpt_path)


def check_before_reading(config, subcommand: str, words: object, launched: bool) -> None:
    """Before LightningCLI reads the --ckpt_path's hyperparameters into `config` (the command's): the file, and at
    validate, test and predict the --model. options of the command line `words` against it."""
    check_ckpt_path(config.ckpt_path, launched)
    if subcommand != "fit" and Path(config.ckpt_path).is_file() and isinstance(words, list):  # else its model wins
        check_model_options(config.ckpt_path, config.model, words)


def check_model_options(ckpt_path: str, model, words: list[str]) -> None:
    """Raises CheckpointError for a `--model.` option on the command line (`words`) whose value (in `model`, the
    parsed config's) contradicts the checkpoint's: LightningCLI would replace it with the checkpoint's without a word,
    and the network evaluated is the one trained."""
    import torch

    given = {word[2:].split("=", 1)[0] for word in words if isinstance(word, str) and word.startswith("--model.")}
    if not given:
        return
    hyper_parameters = torch.load(ckpt_path, weights_only=True, map_location="cpu", mmap=True).get("hyper_parameters")
    trained = flatten({"model": {k: v for k, v in (hyper_parameters or {}).items() if not k.startswith("_")}})
    now = flatten({"model": model.as_dict()})
    for option in sorted(given):
        keys = [key for key in now if key == option or key.startswith(f"{option}.")]
        if any(key in trained and str(trained[key]) != str(now[key]) for key in keys):
            raise CheckpointError(
                f"--{option} {shown(now, option)}: {ckpt_path} was trained with {shown(trained, option)}, and "
                f"validate, test and predict use its network as trained; leave --{option} out"
            )


def shown(flat: dict, option: str) -> object:
    """`option`'s value in a flattened config: a class by its class path, a group by its options."""
    if option in flat or f"{option}.class_path" in flat:
        return flat.get(option, flat.get(f"{option}.class_path"))
    return ", ".join(
        f"{key.removeprefix(option + '.')} {value}" for key, value in flat.items() if key.startswith(option)
    )


def prepare(cli: LightningCLI, config) -> None:
    """Before the classes are built: refuses validate, test and predict without a checkpoint, and takes its classes."""
    if cli.subcommand != "fit" and not config.get("ckpt_path"):
        raise CheckpointError(
            f"{cli.subcommand} needs --ckpt_path: the .ckpt a fit wrote (outputs/<exp>/<run>/checkpoints/"
            "best.ckpt; `make evaluate` and `make predict` find the newest); without it the network is untrained"
        )
    network_args = config.model.network.get("init_args") or {}
    if "weights" in network_args:  # a TransferNet: the checkpoint has every weight
        from lightning_modules.transfer_net import skip_pretrained_weights

        skip_pretrained_weights(network_args)
    if cli.subcommand != "fit":
        # LightningCLI has read the checkpoint's hyperparameters into model: its class names are the truth. A
        # datamodule that takes `classes` gets them (predict labels with them; test checks its folders have them).
        classes, data_args = config.model.get("class_names"), config.data.get("init_args") or {}
        cli.checkpoint_classes = list(classes or [])
        if classes and "classes" in data_args:
            data_args["classes"] = list(classes)
        # The checkpoint's ModelCheckpoint state names its fit's folder, not this command's: nothing to act on.
        warnings.filterwarnings("ignore", r"The dirpath has changed from")
    if cli.subcommand == "predict":
        # Its output is a CSV on stdout (`predict > out.csv`): no progress bar there. It records nothing: no run.
        config.trainer.enable_progress_bar, config.trainer.logger = False, False


def before_command(cli: LightningCLI) -> None:
    """The data's classes must be the checkpoint's, in its order: else every label would mean another class."""
    trained, given = cli.checkpoint_classes, list(cli.datamodule.class_names)
    if trained and trained != given:
        raise CheckpointError(
            f"--ckpt_path {cli.config[cli.subcommand].ckpt_path}: trained on classes {trained}, but the data has "
            f"{given}; give the checkpoint of this task, or data of its classes"
        )
    if cli.subcommand == "predict" and cli.trainer.world_size > 1:  # each process would print its share of the rows
        sys.exit("error: predict runs in one process: give --trainer.devices 1 --trainer.num_nodes 1")


def write_predictions(cli: LightningCLI) -> None:
    """The answers on stdout, scripts.score's lines: a name's comma or carriage return quoted, bytes that are not
    UTF-8 as \\xNN."""
    rows = [row for batch in cli.trainer.predict_loop.predictions for row in batch]
    sys.stdout.write(csv_line(["input", "class", "probability"]))
    for name, (label, probability) in zip(cli.datamodule.predict_names, rows):
        sys.stdout.write(csv_line([name, label, f"{probability:.4f}"]))
    sys.stdout.flush()  # here, where scripts.train ends a closed pipe (`| head -1`) quietly; not at exit
