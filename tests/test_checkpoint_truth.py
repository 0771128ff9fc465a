"""The checkpoint is the truth at predict and test: class names (not the folders of today's data_dir) and the penguin
scaling statistics (not those of today's CSV) come from it."""

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


def predict(*args: str) -> str:
    result = run_module("scripts.train", "predict", *args)
    assert result.returncode == 0, result.stderr[-2000:]
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


def test_penguins_predict_scales_as_the_checkpoints_training_data_did(tmp_path):
    from palmerpenguins import load_penguins

    subset = tmp_path / "subset.csv"
    load_penguins().dropna().iloc[::3].to_csv(subset, index=False)  # other statistics than all 344 penguins
    penguins = ["--config", "configs/penguins.yaml", "--data.init_args.preprocessing", "standardize"]
    best = fit(tmp_path / "outputs", *penguins, "--data.init_args.csv_path", str(subset))
    args = [*penguins, "--ckpt_path", str(best), "--data.init_args.predict_path", "configs/examples/penguins.csv"]
    as_trained = predict(*args, "--data.init_args.csv_path", str(subset))
    assert predict(*args) == as_trained  # today's data: PyPI's 344 penguins, whose statistics differ
