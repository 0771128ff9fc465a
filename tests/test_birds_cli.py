"""Birds through the real CLI: fit then predict a folder, bad images and weights in one line, predict and export
without ImageNet weights once trained.

    .venv/bin/python -m pytest -q tests/test_birds_cli.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import (
    CLASSES,
    bird_folders,
    run_module,  # extra: serving
    write_images,
)

# ---- the CLI ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_fit_then_predict_a_folder(tmp_path, train_cli):
    root = bird_folders(tmp_path / "birds", count=4)
    write_images(tmp_path / "photos", 3, 1, size=(50, 70))
    data = [
        "--config", "configs/birds.yaml",
        "--data.init_args.data_dir", str(root),
        "--data.init_args.archive", "null",
        "--data.init_args.image_size", "32",
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    fit = train_cli("fit", *data, "--trainer.max_epochs", "2", "--trainer.callbacks.unfreeze_backbone_at_epoch", "1")
    assert fit.returncode == 0, fit.stderr[-3000:]
    # No test/: the test scores the validation split, which chose the checkpoint; the fit says so, once, and its end.
    (score,) = [line for line in fit.stdout.splitlines() if line.startswith("test_acc: ")]
    assert score.endswith(" (validation split: optimistic)"), score
    assert fit.stderr.count(f"{root}: no test/ folder, so `test` scores the validation split, which chose the") == 1
    (report,) = (tmp_path / "outputs").glob("*/*/evaluation/per_class.csv")
    assert sum(int(row.rsplit(",", 1)[1]) for row in report.read_text().splitlines()[1:]) == 2 * 4  # val/: 4 a class
    checkpoint = next(line.split(": ", 1)[1] for line in fit.stdout.splitlines() if line.startswith("best checkpoint"))

    predict = train_cli(
        "predict", *data, "--ckpt_path", checkpoint, "--data.init_args.predict_path", tmp_path / "photos"
    )
    assert predict.returncode == 0, predict.stderr[-3000:]
    rows = predict.stdout[predict.stdout.index("input,class,probability") :].splitlines()[1:]
    assert len(rows) == 3
    for row, i in zip(rows, range(3)):
        name, label, probability = row.split(",")
        assert Path(name).name == f"{i}.{'jpg' if i % 2 else 'png'}" and label in CLASSES
        assert 0.5 <= float(probability) <= 1


@pytest.mark.slow
def test_predict_and_export_need_no_imagenet_weights_once_trained(tmp_path, train_cli):
    weights = tmp_path / "resnet18.pth"
    from torchvision.models import resnet18

    torch.save(resnet18().state_dict(), weights)
    root = bird_folders(tmp_path / "birds", count=2)
    data = [
        "--config", "configs/birds.yaml",
        "--data.init_args.data_dir", str(root),
        "--data.init_args.image_size", "32",
        "--model.network.init_args.backbone", "resnet18",
        "--model.network.init_args.weights_path", str(weights),
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    fit = train_cli("fit", *data, "--trainer.max_epochs", "1")
    assert fit.returncode == 0, fit.stderr[-3000:]
    checkpoint = next(line.split(": ", 1)[1] for line in fit.stdout.splitlines() if line.startswith("best checkpoint"))
    weights.unlink()  # another machine, offline: the checkpoint alone must do
    write_images(tmp_path / "photos", 2, 0)
    predict = train_cli(
        "predict", *data, "--ckpt_path", checkpoint, "--data.init_args.predict_path", tmp_path / "photos"
    )
    assert predict.returncode == 0, predict.stderr[-3000:]
    assert len(predict.stdout[predict.stdout.index("input,class,probability") :].splitlines()) == 3
    # extra: serving
    export = run_module("scripts.export", checkpoint, "--output", tmp_path / "birds.onnx")
    assert export.returncode == 0, export.stderr[-3000:]
    assert (tmp_path / "birds.onnx").is_file()
    # end extra: serving


@pytest.mark.slow
def test_a_fit_cut_short_by_max_steps_then_predict_quotes_a_name_with_a_comma(tmp_path, train_cli):
    import csv

    root = bird_folders(tmp_path / "birds", count=4)
    data = [
        "--config", "configs/birds.yaml",
        "--data.init_args.data_dir", str(root),
        "--data.init_args.archive", "null",
        "--data.init_args.image_size", "32",
        "--data.init_args.batch_size", "2",
        "--data.init_args.num_workers", "0",
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    fit = train_cli("fit", *data, "--trainer.max_steps", "1")  # stops before the epoch's validation: no val_loss
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "Traceback" not in fit.stderr
    (checkpoint,) = (tmp_path / "outputs").glob("*/*/checkpoints/last.ckpt")
    write_images(tmp_path / "photos", 2, 1)
    (tmp_path / "photos" / "1.jpg").rename(tmp_path / "photos" / "turkey, wild.jpg")
    predict = train_cli(
        "predict", *data, "--ckpt_path", checkpoint, "--data.init_args.predict_path", tmp_path / "photos"
    )
    assert predict.returncode == 0, predict.stderr[-3000:]
    rows = list(csv.reader(predict.stdout[predict.stdout.index("input,class,probability") :].splitlines()))
    assert [len(row) for row in rows] == [3, 3, 3]
    assert rows[2][0] == str(tmp_path / "photos" / "turkey, wild.jpg") and rows[2][1] in CLASSES
