"""The evaluation report (scripts/training/run_record.py EvaluationReport): after a fit's test, and after `test`,
the run has per-class precision, recall and F1 under the class names, and evaluation/ (confusion_matrix.png,
per_class.csv and, for images, most_confident_mistakes.png) in its folder beside the checkpoints and in its MLflow
artifacts. One tiny fit per task, read back here: the PNGs with Pillow, the CSV, the store's metrics and artifacts,
a real MLflow server's too.

.venv/bin/python -m pytest -q tests/test_evaluation.py
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from PIL import Image

from datamodules.penguins import PenguinDataModule
from scripts.training.run_record import metric_names, per_class_scores
from tests.conftest import CLASSES, MNIST, bird_folders, birds_data, run_module

BIRDS_TEST_IMAGES = 2 * 6  # bird_folders: 6 images a class in test/


def fit(outputs: Path, *args: str) -> dict:
    """A fit into `outputs` (its own sqlite store); what a test reads back of its run."""
    result = run_module("scripts.train", "fit", *args, "--trainer.default_root_dir", str(outputs),
                        "--trainer.enable_progress_bar", "false")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = outputs.glob("*/*/evaluation")
    store = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    return {"folder": folder, "run_id": folder.parent.name, "store": store, "stdout": result.stdout}


@pytest.fixture(scope="module")
def penguins(tmp_path_factory) -> dict:
    return fit(tmp_path_factory.mktemp("penguins"), "--config", "configs/penguins.yaml", "--trainer.max_epochs", "2")


@pytest.fixture(scope="module")
def birds(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("birds")
    photos = bird_folders(root / "data", splits=("train", "val", "test"))
    return fit(
        root / "outputs", "--config", "configs/birds.yaml", "--data.init_args.data_dir", str(photos),
        "--data.init_args.archive", "null", "--model.network.init_args.weights", "none",
        "--data.init_args.image_size", "32", "--data.init_args.num_workers", "0", "--trainer.max_epochs", "1",
    )  # fmt: skip


def per_class_rows(folder: Path) -> list[dict]:
    return list(csv.DictReader((folder / "per_class.csv").read_text().splitlines()))


def check_png(path: Path, least: tuple[int, int]) -> None:
    """A whole PNG of at least `least` pixels that is not one colour."""
    with Image.open(path) as image:
        image.load()  # a cut-short file fails here
        assert image.format == "PNG" and image.width >= least[0] and image.height >= least[1], image.size
        extremes = image.convert("RGB").getextrema()
        assert any(low != high for low, high in extremes), f"{path.name} is one colour"


def test_a_penguins_fit_reports_each_species_on_disk_and_in_its_run(penguins):
    rows = per_class_rows(penguins["folder"])
    assert [row["class"] for row in rows] == PenguinDataModule.class_names
    data = PenguinDataModule()
    data.setup("test")
    assert sum(int(row["support"]) for row in rows) == len(data.split_rows[2])  # each test row once
    check_png(penguins["folder"] / "confusion_matrix.png", (300, 300))
    assert not (penguins["folder"] / "most_confident_mistakes.png").exists()  # a table has no pictures to show
    assert f"evaluation: {penguins['folder']}" in penguins["stdout"]
    assert penguins["folder"].parent.joinpath("checkpoints", "best.ckpt").is_file()  # beside the checkpoints

    metrics = penguins["store"].get_run(penguins["run_id"]).data.metrics
    for row in rows:
        for name in ("precision", "recall", "f1"):
            assert metrics[f"test_{name}/{row['class']}"] == pytest.approx(float(row[name]), abs=1e-4)
    assert {"test_precision_macro", "test_recall_macro", "test_f1_macro"} <= set(metrics)
    # The matrix's diagonal is what test_acc counted: recall weighted by support.
    right = sum(float(row["recall"]) * int(row["support"]) for row in rows)
    assert right / sum(int(row["support"]) for row in rows) == pytest.approx(metrics["test_acc"], abs=1e-3)
    listed = {a.path for a in penguins["store"].list_artifacts(penguins["run_id"], "evaluation")}
    assert listed == {"evaluation/confusion_matrix.png", "evaluation/per_class.csv"}


def test_a_birds_fit_also_shows_its_most_confident_mistakes(birds):
    rows = per_class_rows(birds["folder"])
    assert [row["class"] for row in rows] == list(CLASSES)
    assert sum(int(row["support"]) for row in rows) == BIRDS_TEST_IMAGES
    check_png(birds["folder"] / "confusion_matrix.png", (300, 300))
    check_png(birds["folder"] / "most_confident_mistakes.png", (150, 150))
    metrics = birds["store"].get_run(birds["run_id"]).data.metrics
    assert {f"test_f1/{name}" for name in CLASSES} <= set(metrics)
    listed = {a.path for a in birds["store"].list_artifacts(birds["run_id"], "evaluation")}
    names = ("confusion_matrix.png", "per_class.csv", "most_confident_mistakes.png")
    assert listed == {f"evaluation/{name}" for name in names}


@pytest.mark.slow
def test_a_test_against_a_tracking_server_reports_into_its_own_run(penguins, mlflow_server, tmp_path):
    """`test` of the fit's best.ckpt is a run of its own: its folder gets the report (the fit's stays as it was), and
    the server, sent the files in line behind the metrics, lists them."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server}
    env.pop("MLFLOW_RUN_ID", None)
    experiment = tmp_path.name  # its own: the server is the whole test run's
    best = penguins["folder"].parent / "checkpoints" / "best.ckpt"
    fit_csv = (penguins["folder"] / "per_class.csv").read_bytes()
    outputs = tmp_path / "outputs"
    result = run_module("scripts.train", "test", "--config", "configs/penguins.yaml", "--ckpt_path", str(best),
                        "--trainer.logger.init_args.experiment_name", experiment,
                        "--trainer.default_root_dir", str(outputs), env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    folder = outputs / run.info.experiment_id / run.info.run_id / "evaluation"
    assert per_class_rows(folder) == per_class_rows(penguins["folder"])  # the same checkpoint on the same split
    assert (penguins["folder"] / "per_class.csv").read_bytes() == fit_csv
    listed = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert listed == {"evaluation/confusion_matrix.png", "evaluation/per_class.csv"}
    assert {f"test_f1/{name}" for name in PenguinDataModule.class_names} <= set(run.data.metrics)


def test_a_ratio_of_nothing_is_zero_not_nan():
    # Class 0 right twice; class 1 never predicted; class 2 absent from the split but predicted once.
    scores = per_class_scores(torch.tensor([[2, 0, 0], [1, 0, 1], [0, 0, 0]]))
    assert scores["precision"].tolist() == pytest.approx([2 / 3, 0, 0])
    assert scores["recall"].tolist() == pytest.approx([1, 0, 0])
    assert scores["f1"].tolist() == pytest.approx([0.8, 0, 0])
    assert scores["support"].tolist() == [2, 2, 0]


def test_class_names_become_metric_keys_mlflow_takes_each_its_own(tmp_path):
    names = metric_names(["Adélie", "yes/no", "yes_no", "..", "", "big cat", "3.5"])
    assert names == ["Ad_lie", "yes_no", "yes_no_2", "class_3", "class_4", "big cat", "3.5"]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("keys"))
    from mlflow.entities import Metric

    client.log_batch(run.info.run_id, metrics=[Metric(f"test_f1/{name}", 0.5, 0, 0) for name in names])
    assert len(client.get_run(run.info.run_id).data.metrics) == len(names)


def test_the_mistakes_are_shown_as_the_pictures_were_before_normalising(tmp_path):
    from datamodules.image_folder import normalize_images
    from datamodules.mnist import MNISTDataModule

    pictures = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    photos = birds_data(bird_folders(tmp_path / "birds", count=1))
    assert torch.allclose(photos.images_to_show(normalize_images(pictures.clone())), pictures / 255, atol=1e-5)
    digits = MNISTDataModule(data_dir=str(MNIST))
    grey = pictures[:, :1]
    inputs = digits.on_after_batch_transfer((grey.clone(), torch.zeros(2)), 0)[0]
    assert torch.allclose(digits.images_to_show(inputs), grey / 255, atol=1e-5)
