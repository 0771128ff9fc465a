"""The checkpoint is the truth at predict and test: class names (not the folders of today's data_dir), the penguin
scaling and its statistics (not those of today's CSV or config) and the birds' crop size come from it."""

from __future__ import annotations

import pytest

from tests.conftest import bird_folders, run_module, write_images

pytestmark = pytest.mark.slow
BIRDS = ["--config", "configs/birds.yaml", "--data.init_args.image_size", "32", "--data.init_args.num_workers", "0"]


def fit(root, *args: str):
    result = run_module(
        "scripts.train", "fit", *args, "--trainer.max_epochs", "2", "--test_after_fit", "false",
        "--trainer.default_root_dir", str(root),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (best,) = root.glob("*/*/checkpoints/best.ckpt")
    return best


def predict(*args: str, note: str | None = None) -> str:
    """predict's CSV; `note`: the line stderr must hold (the checkpoint's preprocessing chosen over the config's)."""
    result = run_module("scripts.train", "predict", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (note in result.stderr.splitlines()) if note else ("checkpoint's network" not in result.stderr)
    return result.stdout


def test_birds_predict_labels_with_the_checkpoints_classes_whatever_data_dir_holds(tmp_path):
    birds = bird_folders(tmp_path / "birds", count=4)
    best = fit(tmp_path / "outputs", *BIRDS, "--data.init_args.data_dir", str(birds))
    for name, channel in (("turkeys", 1), ("zebra_chickens", 0), ("ducks", 2)):  # other classes, other order
        write_images(tmp_path / "elsewhere" / "train" / name, 2, channel)
    photos = tmp_path / "photos"
    write_images(photos, 4, 0, start=50)
    args = [*BIRDS, "--ckpt_path", str(best), "--data.init_args.predict_path", str(photos)]
    with_training_data = predict(*args, "--data.init_args.data_dir", str(birds))
    assert with_training_data == predict(*args, "--data.init_args.data_dir", str(tmp_path / "elsewhere"))
    assert predict(*args, "--data.init_args.data_dir", str(tmp_path / "nowhere")) == with_training_data
    labels = {line.split(",")[1] for line in with_training_data.splitlines()[1:]}
    assert labels <= {"chickens", "turkeys"}
    note = "data.init_args.image_size: 32 as the checkpoint's network was trained, not the config's 64"
    bigger = [*args, "--data.init_args.data_dir", str(birds), "--data.init_args.image_size", "64"]
    assert predict(*bigger, note=note) == with_training_data  # 32 px crops, as trained


def test_penguins_predict_scales_as_the_checkpoints_training_data_did(tmp_path):
    from palmerpenguins import load_penguins

    subset = tmp_path / "subset.csv"
    load_penguins().dropna().iloc[::3].to_csv(subset, index=False)  # other statistics than all 344 penguins
    penguins = ["--config", "configs/penguins.yaml", "--data.init_args.preprocessing", "standardize"]
    best = fit(tmp_path / "outputs", *penguins, "--data.init_args.csv_path", str(subset))
    args = [*penguins, "--ckpt_path", str(best), "--data.init_args.predict_path", "configs/examples/penguins.csv"]
    as_trained = predict(*args, "--data.init_args.csv_path", str(subset))
    assert predict(*args) == as_trained  # today's data: PyPI's 344 penguins, whose statistics differ
    course = ["--config", "configs/penguins.yaml", "--ckpt_path", str(best), *args[-2:]]  # the config's: `course`
    note = "data.init_args.preprocessing: 'standardize' as the checkpoint's network was trained, not the config's "
    note += "'course'"
    assert predict(*course, note=note) == as_trained
