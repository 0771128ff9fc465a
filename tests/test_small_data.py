"""Small data sets train sensibly or say in one line which option to change: an image folder no larger than a batch,
MNIST-format files smaller than `val_size`.

    .venv/bin/python -m pytest -q tests/test_small_data.py
"""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from tests.conftest import bird_folders, birds_data


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
