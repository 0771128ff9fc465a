"""The evaluation report (scripts/training/run_record.py EvaluationReport): after a fit's test, and after `test`,
the run has per-class precision, recall and F1 under the class names, and evaluation/ (confusion_matrix.png and .csv,
per_class.csv and, for images, most_confident_mistakes.png) in its folder beside the checkpoints and in its MLflow
artifacts. One tiny fit per task, read back here: the PNGs with Pillow, the CSVs, the store's metrics and artifacts,
a real MLflow server's too. A class the split lacks is n/a, not 0; past 30 classes the picture is of the top
confusions (scripts/training/confusions.py), its size bounded.

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
from scripts.training.run_record import confusion_figure, metric_names, per_class_scores, png
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
    assert any(line.startswith("test_acc: ") and line.count(" ") == 1 for line in penguins["stdout"].splitlines())
    counts = list(csv.reader((penguins["folder"] / "confusion_matrix.csv").read_text().splitlines()))
    assert counts[0][1:] == [row[0] for row in counts[1:]] == PenguinDataModule.class_names  # true down, then across
    assert [sum(map(int, row[1:])) for row in counts[1:]] == [int(row["support"]) for row in rows]
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
    names = ("confusion_matrix.png", "confusion_matrix.csv", "per_class.csv")
    assert listed == {f"evaluation/{name}" for name in names}


def test_a_class_the_test_split_lacks_is_not_scored_as_0(penguins, tmp_path):
    """`test` of the fit's checkpoint on penguins without Chinstraps (other data, as a pipeline's test_data): their
    recall and F1 are n/a in per_class.csv, said once, and not logged as metrics."""
    from palmerpenguins import load_penguins

    table = load_penguins()
    table[table.species != "Chinstrap"].to_csv(tmp_path / "no_chinstraps.csv", index=False)
    best = penguins["folder"].parent / "checkpoints" / "best.ckpt"
    result = run_module("scripts.train", "test", "--config", "configs/penguins.yaml", "--ckpt_path", best,
                        "--data.init_args.csv_path", tmp_path / "no_chinstraps.csv", "--trainer.enable_progress_bar",
                        "false", "--trainer.default_root_dir", tmp_path / "outputs")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (tmp_path / "outputs").glob("*/*/evaluation")
    rows = {row["class"]: row for row in per_class_rows(folder)}
    assert rows["Chinstrap"]["support"] == "0" and rows["Chinstrap"]["recall"] == rows["Chinstrap"]["f1"] == "n/a"
    assert rows["Chinstrap"]["precision"] in ("n/a", "0.0000")  # n/a unless the network answered Chinstrap
    assert all(rows[name]["recall"] != "n/a" for name in ("Adelie", "Gentoo"))
    said = [line for line in result.stdout.splitlines() if "Chinstrap" in line]
    assert said == ["evaluation: Chinstrap: none in the test split; n/a in per_class.csv (not 0), no metric logged"]
    metrics = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}").get_run(folder.parent.name).data.metrics
    assert "test_f1/Adelie" in metrics and not {"test_recall/Chinstrap", "test_f1/Chinstrap"} & set(metrics)


def many_classes(classes: int, seed: int = 0) -> tuple[list[str], torch.Tensor]:
    """A test split of `classes` classes, 20 items each, mostly right, with confusions planted: c007 answered c003
    15 times, c012 answered c050 9 times, and one item of most classes answered as the next class."""
    names = [f"c{index:03d}" for index in range(classes)]
    matrix = torch.diag(torch.full((classes,), 19))
    matrix += torch.roll(torch.eye(classes, dtype=torch.long), 1, dims=1)
    matrix[7, 7], matrix[7, 3] = 4, 15
    matrix[12, 12], matrix[12, 50] = 10, 9
    return names, matrix


def test_past_30_classes_the_picture_shows_the_top_confusions_at_a_bounded_size(tmp_path):
    names, matrix = many_classes(60)
    figure = confusion_figure(names, matrix)
    bars, grid = figure.axes[:2]
    shown = [label.get_text() for label in bars.get_yticklabels()]
    assert shown[:2] == ["c007 -> c003", "c012 -> c050"]  # the most frequent first
    assert {"c003", "c007", "c012", "c050"} <= {label.get_text() for label in grid.get_yticklabels()}
    (tmp_path / "matrix.png").write_bytes(png(figure))
    check_png(tmp_path / "matrix.png", (800, 500))
    with Image.open(tmp_path / "matrix.png") as image:  # drawn cell by cell, 60 classes were 2,170 px a side
        assert image.width <= 2000 and image.height <= 1200, image.size


def test_a_test_split_with_no_mistakes_of_many_classes_says_so(tmp_path):
    names = [f"c{index:03d}" for index in range(40)]
    figure = confusion_figure(names, torch.diag(torch.full((40,), 3)))
    assert any(text.get_text() == "no mistakes" for axes in figure.axes for text in axes.texts)


@pytest.mark.slow
def test_a_birds_fit_also_shows_its_most_confident_mistakes(birds):
    rows = per_class_rows(birds["folder"])
    assert [row["class"] for row in rows] == list(CLASSES)
    assert sum(int(row["support"]) for row in rows) == BIRDS_TEST_IMAGES
    check_png(birds["folder"] / "confusion_matrix.png", (300, 300))
    check_png(birds["folder"] / "most_confident_mistakes.png", (150, 150))
    metrics = birds["store"].get_run(birds["run_id"]).data.metrics
    assert {f"test_f1/{name}" for name in CLASSES} <= set(metrics)
    listed = {a.path for a in birds["store"].list_artifacts(birds["run_id"], "evaluation")}
    names = ("confusion_matrix.png", "confusion_matrix.csv", "per_class.csv", "most_confident_mistakes.png")
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
    names = ("confusion_matrix.png", "confusion_matrix.csv", "per_class.csv")
    assert listed == {f"evaluation/{name}" for name in names}
    assert {f"test_f1/{name}" for name in PenguinDataModule.class_names} <= set(run.data.metrics)


def test_a_ratio_of_nothing_is_zero_not_nan():
    # Class 0 right twice; class 1 never predicted; class 2 absent from the split but predicted once. The report
    # writes n/a for class 2's recall and F1 (run_record.py `known`); the averages count them as 0, as torchmetrics.
    scores = per_class_scores(torch.tensor([[2, 0, 0], [1, 0, 1], [0, 0, 0]]))
    assert scores["precision"].tolist() == pytest.approx([2 / 3, 0, 0])
    assert scores["recall"].tolist() == pytest.approx([1, 0, 0])
    assert scores["f1"].tolist() == pytest.approx([0.8, 0, 0])
    assert scores["support"].tolist() == [2, 2, 0]


def test_the_matrix_names_a_class_without_items_and_the_split_it_is_of():
    figure = confusion_figure(["a", "b", "c"], torch.tensor([[2, 0, 0], [1, 0, 1], [0, 0, 0]]), "validation split")
    (axes,) = figure.axes
    assert [label.get_text() for label in axes.get_yticklabels()] == ["a", "b", "c (no items)"]
    assert axes.get_title() == "validation split: 4 items, 50.0% right"


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
