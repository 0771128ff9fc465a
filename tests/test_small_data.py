"""Small data sets train sensibly or say in one line which option to change: an image folder no larger than a batch,
MNIST-format files smaller than `val_size`.

    .venv/bin/python -m pytest -q tests/test_small_data.py
"""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from tests.conftest import bird_folders, birds_data, write_images


def test_an_image_folder_no_larger_than_a_batch_trains_four_steps_an_epoch(tmp_path, capsys):
    data = birds_data(bird_folders(tmp_path / "birds", count=6), batch_size=16)  # 12 training photos
    data.setup("fit")
    assert data.batch_size == 3
    assert len(data.train_dataloader()) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.init_args.batch_size 16" in err and "training at batch 3" in err


def test_a_batch_below_the_training_set_is_kept(tmp_path, capsys):
    data = birds_data(bird_folders(tmp_path / "birds", count=6), batch_size=11)
    data.setup("fit")
    assert data.batch_size == 11
    assert "batch_size" not in capsys.readouterr().err


def write_idx(folder, prefix: str, count: int) -> None:
    generator = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for kind, magic, shape in (("images", 2051, (count, 28, 28)), ("labels", 2049, (count,))):
        values = generator.integers(0, 256 if kind == "images" else 10, shape).astype(np.uint8)
        header = struct.pack(">I", magic) + b"".join(struct.pack(">I", side) for side in shape)
        dims = 3 if kind == "images" else 1
        (folder / f"{prefix}-{kind}-idx{dims}-ubyte.gz").write_bytes(gzip.compress(header + values.tobytes()))


@pytest.mark.slow
def test_mnist_files_smaller_than_val_size_name_it_and_leave_no_failed_run(tmp_path, train_cli):
    import mlflow

    write_idx(tmp_path / "digits", "train", 200)
    write_idx(tmp_path / "digits", "t10k", 50)
    fit = train_cli("fit", "--config", "configs/mnist.yaml", "--data.init_args.data_dir", tmp_path / "digits")
    assert fit.returncode != 0
    assert fit.stderr.strip().splitlines()[-1].startswith("error: data.init_args.val_size 5000: ")
    assert "below 200" in fit.stderr and "Traceback" not in fit.stderr
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    runs = [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]
    assert not [run for run in runs if run.info.status == "FAILED"]


def write_digits(root, counts: dict[str, int]) -> None:
    """Grey 28x28 PNGs of three strokes told apart by shape: a ring ("0"), an upright bar ("1"), a flat bar ("7"),
    each shifted by a few seeded pixels."""
    from PIL import Image, ImageDraw

    generator = np.random.default_rng(0)
    for split, count in counts.items():
        for label in ("0", "1", "7"):
            (root / split / label).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                image = Image.new("L", (28, 28), 0)
                x, y = generator.integers(-3, 4, 2).tolist()
                draw = ImageDraw.Draw(image)
                if label == "0":
                    draw.ellipse((8 + x, 5 + y, 20 + x, 23 + y), outline=255, width=3)
                else:
                    line = (14 + x, 4 + y, 14 + x, 24 + y) if label == "1" else (6 + x, 14 + y, 22 + x, 14 + y)
                    draw.line(line, fill=255, width=3)
                image.save(root / split / label / f"{i}.png")


@pytest.mark.slow
def test_grey_digit_pngs_in_class_folders_train_by_config(tmp_path, train_cli):
    write_digits(tmp_path / "digits", {"train": 10, "val": 4, "test": 4})
    data = ["--config", "configs/digits_folder.yaml", "--data.init_args.data_dir", tmp_path / "digits",
            "--trainer.enable_progress_bar", "false"]  # fmt: skip
    fit = train_cli("fit", *data, "--trainer.max_epochs", "4")
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "30 training images a process at data.init_args.batch_size 32" in fit.stderr  # the recipe's batch: 4 steps
    accuracy = float(next(line for line in fit.stdout.splitlines() if line.startswith("test_acc: ")).split(": ")[1])
    assert accuracy >= 0.6  # three classes: chance is 0.33
    checkpoint = next(line.split(": ", 1)[1] for line in fit.stdout.splitlines() if line.startswith("best checkpoint"))
    predict = train_cli("predict", *data, "--ckpt_path", checkpoint,
                        "--data.init_args.predict_path", tmp_path / "digits" / "test" / "0")  # fmt: skip
    assert predict.returncode == 0, predict.stderr[-3000:]
    rows = predict.stdout[predict.stdout.index("input,class,probability") :].splitlines()[1:]
    assert len(rows) == 4 and all(row.split(",")[1] in ("0", "1", "7") for row in rows)
    write_images(tmp_path / "photos", 3, 0)  # colour pictures: another task's
    other = train_cli("predict", *data, "--ckpt_path", checkpoint, "--data.init_args.predict_path", tmp_path / "photos")
    assert other.returncode == 1 and "input,class" not in other.stdout
    assert other.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'photos'}: colour pictures, but this checkpoint was trained on grey images only (another "
        "task's data?); give it images like its training data, or give --ckpt_path a checkpoint trained on pictures "
        "like these (make predict takes the newest trained on the config's data_dir)"
    )


def test_a_crop_share_out_of_range_names_the_option(tmp_path):
    from datamodules.errors import DataError

    with pytest.raises(DataError, match=r"^data.init_args.min_crop 0.0: give a share"):
        birds_data(tmp_path, min_crop=0.0)


def test_a_class_too_small_for_val_fraction_names_the_option(tmp_path):
    from datamodules.errors import DataError

    data = birds_data(bird_folders(tmp_path / "birds", splits=("train",), count=1))
    with pytest.raises(DataError, match=r"with data.init_args.val_fraction 0.2; add images"):
        data.setup("fit")
