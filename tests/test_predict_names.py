"""File names in predict's CSV: each survives a round trip through the csv module, and stdout stays UTF-8 under a
strict locale. One tiny birds fit and one tiny MNIST fit, each predicting a real folder of awkward names.

    .venv/bin/python -m pytest -q tests/test_predict_names.py
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import AWKWARD_NAMES, MNIST, REPO, STRICT_UTF8, bird_folders, needs_mnist, original_name, run_module

pytestmark = pytest.mark.slow


def awkward_folder(folder: Path, image: Path) -> list[str]:
    """`folder` with a copy of `image` under each AWKWARD_NAMES name; their names as Python holds them (os.fsdecode)."""
    folder.mkdir()
    for name in AWKWARD_NAMES:
        shutil.copyfile(image, os.path.join(os.fsencode(folder), name))
    return sorted(os.fsdecode(os.path.join(os.fsencode(folder), name)) for name in AWKWARD_NAMES)


def predicted_names(args: list[str]) -> list[str]:
    """The input column of `python -m scripts.train predict ARGS` under a strict UTF-8 locale, read back by the csv
    module, each cell turned back into its file's name."""
    command = [sys.executable, "-m", "scripts.train", "predict", *args]
    result = subprocess.run(command, cwd=REPO, env=STRICT_UTF8, capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    rows = list(csv.reader(io.StringIO(result.stdout.decode("utf-8"), newline="")))  # strictly UTF-8
    assert rows[0] == ["input", "class", "probability"] and all(len(row) == 3 for row in rows)
    return sorted(original_name(row[0]) for row in rows[1:])


@pytest.fixture(scope="module")
def birds(tmp_path_factory) -> list[str]:
    """The options of a tiny birds fit, its checkpoint among them."""
    root = tmp_path_factory.mktemp("birds")
    data = ["--config", "configs/birds.yaml", "--data.init_args.data_dir", str(bird_folders(root / "birds", count=2)),
            "--data.init_args.archive", "null", "--model.network.init_args.weights", "none",
            "--data.init_args.image_size", "32", "--trainer.enable_progress_bar", "false"]  # fmt: skip
    outputs = ["--trainer.default_root_dir", str(root / "outputs")]
    fit = run_module("scripts.train", "fit", *data, *outputs, "--trainer.max_steps", "1", "--test_after_fit", "false")
    assert fit.returncode == 0, fit.stderr[-3000:]
    (checkpoint,) = (root / "outputs").glob("*/*/checkpoints/last.ckpt")
    return [*data, "--ckpt_path", str(checkpoint)]


def test_names_of_image_folder_files_survive_a_round_trip_through_the_csv_module(birds, tmp_path):
    """A carriage return split a row; a name that is not UTF-8 ended predict in a UnicodeEncodeError traceback."""
    image = next(Path(birds[birds.index("--data.init_args.data_dir") + 1]).glob("train/*/*.png"))
    expected = awkward_folder(tmp_path / "photos", image)
    assert predicted_names([*birds, "--data.init_args.predict_path", str(tmp_path / "photos")]) == expected


@needs_mnist
def test_names_of_mnist_digit_files_survive_a_round_trip_through_the_csv_module(tmp_path):
    from PIL import Image

    data = ["--config", "configs/mnist.yaml", "--data.init_args.data_dir", str(MNIST), "--trainer.enable_progress_bar",
            "false", "--trainer.default_root_dir", str(tmp_path / "outputs")]  # fmt: skip
    fit = run_module("scripts.train", "fit", *data, "--trainer.max_steps", "1", "--test_after_fit", "false")
    assert fit.returncode == 0, fit.stderr[-3000:]
    (checkpoint,) = (tmp_path / "outputs").glob("*/*/checkpoints/last.ckpt")
    Image.new("L", (28, 28), 0).save(tmp_path / "digit.png")
    expected = awkward_folder(tmp_path / "digits", tmp_path / "digit.png")
    assert predicted_names([*data, "--ckpt_path", str(checkpoint), "--data.init_args.predict_path",
                            str(tmp_path / "digits")]) == expected  # fmt: skip
