"""Checkpoints of older code (tests/checkpoints/, one a task, written by tests/checkpoints/make.py) load as today's code
loads a user's: predict through the CLI (LightningCLI reads their hyperparameters, builds the network and datamodule
today's code builds, restores the datamodule's saved state and loads the weights strictly) and export's and serve's
`scripts.export.load` (the serving preprocessing, given the checkpoint's state, feeds the network). A layer renumbered
or renamed, an argument renamed, a datamodule that reads its saved state otherwise: each fails here in seconds, as it
would fail every checkpoint trained before it. A checkpoint whose network does not fit is one line naming it and the
network's class.

.venv/bin/python -m pytest -q tests/test_old_checkpoints.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torchvision.io import write_png

from lightning_modules.checkpoint_fit import differences
from lightning_modules.penguin_net import PenguinNet
from lightning_modules.table_net import TableNet
from tests.conftest import REPO, run_module

CHECKPOINTS = REPO / "tests" / "checkpoints"
TASKS = sorted(path.stem for path in (REPO / "configs").glob("*.yaml"))


def test_every_task_has_a_checkpoint_of_older_code():
    missing = [task for task in TASKS if not (CHECKPOINTS / f"{task}.ckpt").is_file()]
    assert not missing, f"configs/{missing[0]}.yaml: no tests/checkpoints/{missing[0]}.ckpt (tests/checkpoints/make.py)"
    assert sorted(path.stem for path in CHECKPOINTS.glob("*.ckpt")) == TASKS  # none of a task that is gone
    assert sum(path.stat().st_size for path in CHECKPOINTS.glob("*.ckpt")) < 1_000_000  # git keeps each for good


def picture(path: Path, channels: int, size: int) -> Path:
    """A picture of a bright vertical bar on black: red, in colour."""
    image = torch.zeros(channels, size, size, dtype=torch.uint8)
    image[0, size // 6 : -size // 6, size // 2 - 2 : size // 2 + 2] = 255
    write_png(image, str(path))
    return path


def inputs(task: str, folder: Path) -> list[str]:
    """predict's options for one input of `task`'s kind."""
    if task == "penguins":
        rows = "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nBiscoe,50.4,15.3,224,5550\n"
    elif task == "table":  # tests/checkpoints/make.py's columns
        rows = "length,weight,colour\n41.5,4.2,red\n"
    else:
        channels, size = (3, 32) if task == "birds" else (1, 28)  # a digit: grey
        return ["--data.init_args.predict_path", str(picture(folder / "input.png", channels, size))]
    (folder / "input.csv").write_text(rows)
    return ["--data.init_args.predict_path", str(folder / "input.csv")]


@pytest.mark.parametrize("task", TASKS)
def test_an_older_checkpoint_predicts_through_the_cli(task, tmp_path, capsys, monkeypatch):
    from scripts.train import main

    monkeypatch.setattr(sys, "argv", ["scripts.train"])  # as `python -m` has it (LightningCLI warns of pytest's)
    checkpoint = CHECKPOINTS / f"{task}.ckpt"
    main(["predict", "--config", f"configs/{task}.yaml", "--ckpt_path", str(checkpoint), *inputs(task, tmp_path)])
    header, *rows = capsys.readouterr().out.splitlines()
    classes = torch.load(checkpoint, weights_only=True)["hyper_parameters"]["class_names"]
    assert header == "input,class,probability" and len(rows) == 1 and rows[0].split(",")[1] in classes


# extra: serving
@pytest.mark.parametrize("task", TASKS)
def test_an_older_checkpoint_exports_and_serves_with_its_own_preprocessing(task):
    from scripts.export import load
    from scripts.serving.mlflow_model import serving_inputs

    module, datamodule = load(CHECKPOINTS / f"{task}.ckpt")
    served = serving_inputs(datamodule)
    batch = type(datamodule).serving_batch(served["state"], served["example"], ["example"] * len(served["example"]))
    with torch.no_grad():
        logits = module.network.eval()(batch)
    assert logits.shape == (len(batch), len(module.class_names)) and logits.isfinite().all()
    assert tuple(batch.shape[1:]) == module.input_shape  # what the checkpoint says it was trained on


# end extra: serving


def test_what_keeps_a_state_dict_from_loading_is_named():
    saved = PenguinNet(3).state_dict()
    inserted = nn.Sequential(*list(PenguinNet(3, num_features=6))[:2], nn.Dropout(), *list(PenguinNet(3))[2:])
    assert differences(inserted.state_dict(), saved) == [
        "missing: 3.weight, 3.bias, 5.weight and 1 more",
        "unexpected: 2.weight, 2.bias, 4.weight and 1 more",
        "shape of 0.weight: checkpoint [10, 5], code [10, 6]",
    ]
    assert differences(PenguinNet(3).state_dict(), saved) == []


def test_a_lazy_first_layer_takes_the_width_of_the_checkpoint():
    trained = TableNet(2, hidden=8)
    trained(torch.zeros(1, 7))
    assert differences(TableNet(2, hidden=8).state_dict(), trained.state_dict()) == []
    assert differences(TableNet(2, hidden=9).state_dict(), trained.state_dict())[0].startswith("shape of 3.weight")


def renumbered(checkpoint: Path, target: Path) -> Path:
    """`checkpoint` as a PenguinNet of a layer more before its last would have written it: network.6, not network.4."""
    saved = torch.load(checkpoint, weights_only=False)
    saved["state_dict"] = {key.replace("network.4.", "network.6."): value for key, value in saved["state_dict"].items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(saved, target)
    return target


MISMATCH = (
    "error: {path}: its network does not fit lightning_modules.penguin_net.PenguinNet as the code builds it now "
    "(missing: network.4.weight, network.4.bias; unexpected: network.6.weight, network.6.bias); give a checkpoint "
    "trained by this version of the code, or the code it was trained with"
)


def last_line(result) -> tuple[int, str]:
    """The exit status and the last line on stderr of a command that must end in one line, without a traceback."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.returncode, result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_checkpoint_of_another_network_is_one_line_at_predict_resume_and_export(tmp_path):
    other = renumbered(CHECKPOINTS / "penguins.ckpt", tmp_path / "other.ckpt")
    (tmp_path / "new.csv").write_text("Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nBiscoe,50,15,224,5550\n")
    predict = run_module("scripts.train", "predict", "--config", "configs/penguins.yaml", "--ckpt_path", other,
                         "--data.init_args.predict_path", tmp_path / "new.csv")  # fmt: skip
    assert last_line(predict) == (1, MISMATCH.format(path=other))
    # A --checkpoint_dir whose last.ckpt another network wrote, resumed with the options that made it.
    last = renumbered(CHECKPOINTS / "penguins.ckpt", tmp_path / "resume" / "last.ckpt")
    made_with = re.findall(r"limit_train_batches: (\d+)", torch.load(last, weights_only=False)["fit_config"])
    resume = run_module("scripts.train", "fit", "--config", "configs/penguins.yaml", "--checkpoint_dir", last.parent,
                        "--trainer.limit_train_batches", *made_with,
                        "--trainer.default_root_dir", tmp_path / "outputs")  # fmt: skip
    assert last_line(resume) == (1, MISMATCH.format(path=last))
    assert last_line(run_module("scripts.export", other)) == (1, MISMATCH.format(path=other))  # extra: serving
