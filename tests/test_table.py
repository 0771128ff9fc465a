"""The table task (datamodules/table.py, configs/table.yaml) on tables the tests make with real-world shapes: numeric
and text columns, missing cells, spaces and slashes in column names, an ID column and a constant one, string and integer
labels, two and three classes. Real fits through scripts.train, compared with a logistic regression on the same split.
The registered model of such a fit: tests/serving/test_table_serving.py.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_table.py -n 0
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from datamodules.errors import DataError
from datamodules.preprocessing import table as preprocessing
from datamodules.table import TableDataModule
from tests.conftest import run_module

LENGTH, COLOUR, WEIGHT = "bill length / mm", "colour", "weight (g)"


def make_table(rows: int, seed: int, two_classes: bool = False, integer_labels: bool = False) -> pd.DataFrame:
    """A class that no straight line separates: the middle band of the length, and the colour (3 classes: middle,
    else red or not; 2 classes: middle XOR red). Weight is noise, `row id` an ID, `site` one value; a twentieth of the
    lengths and colours are missing."""
    rng = np.random.default_rng(seed)
    length, colour = rng.uniform(-3, 3, rows), rng.choice(["red", "green", "blue"], rows)
    middle, red = np.abs(length) < 1, colour == "red"
    if two_classes:
        labels = np.where(middle ^ red, "yes", "no")
    else:
        labels = np.where(middle, "Adelie", np.where(red, "Gentoo", "Chinstrap"))
    if integer_labels:  # values that sort otherwise as text: 10 < 2
        named = [labels == "Adelie", labels == "Gentoo", labels == "yes"]
        labels = np.select(named, [10, 2, 1], 0 if two_classes else 1)
    frame = pd.DataFrame({"row id": rng.permutation(rows) + 1, LENGTH: length.round(3), COLOUR: colour,
                          WEIGHT: rng.normal(50, 10, rows).round(1), "site": "north", "species": labels})  # fmt: skip
    frame.loc[rng.choice(rows, rows // 20, replace=False), LENGTH] = np.nan
    frame.loc[rng.choice(rows, rows // 20, replace=False), COLOUR] = None
    return frame


# Rows to classify: a missing length, a missing colour, a colour the training data never had, and the label column.
NEW_ROWS = pd.DataFrame({LENGTH: [0.2, np.nan, -2.5, 2.0], COLOUR: ["green", "red", None, "purple"],
                         WEIGHT: [48.0, 51.0, 60.0, 45.0], "species": ["?", "?", "?", "?"]})  # fmt: skip


def logistic_regression_accuracy(data: TableDataModule) -> float:
    """A multinomial logistic regression (torch, full batch, L-BFGS) on the datamodule's training inputs, scored on its
    test inputs: the floor the network must reach on the same split."""
    (train_x, train_y), (test_x, test_y) = data.splits["train"], data.splits["test"]
    torch.manual_seed(0)
    linear = torch.nn.Linear(train_x.shape[1], len(data.class_names))
    optimizer = torch.optim.LBFGS(linear.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(linear(train_x), train_y) + 1e-4 * linear.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return (linear(test_x).argmax(1) == test_y).float().mean().item()


def fit_table(folder: Path, source: Path, *args: str) -> dict:
    """scripts.train fit of configs/table.yaml on `source` (label `species`), then predict of NEW_ROWS: the run's test
    accuracy, checkpoint, stderr and predict's answer lines."""
    outputs = folder / "outputs"
    fit = run_module("scripts.train", "fit", "--config", "configs/table.yaml", "--data.init_args.csv_path", source,
                     "--data.init_args.label", "species", "--trainer.max_epochs", "40", "--trainer.default_root_dir",
                     outputs, "--metrics_file", folder / "metrics.json", *args)  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    (checkpoint,) = outputs.glob("*/*/checkpoints/best.ckpt")
    rows = folder / "new.csv"
    NEW_ROWS.to_csv(rows, index=False)
    predict = run_module("scripts.train", "predict", "--config", "configs/table.yaml", "--ckpt_path", checkpoint,
                         "--data.init_args.predict_path", rows)  # fmt: skip
    assert predict.returncode == 0, predict.stderr[-3000:]
    answers = [line.split(",") for line in predict.stdout.strip().splitlines()[-len(NEW_ROWS) :]]
    metrics = json.loads((folder / "metrics.json").read_text())
    return {"folder": folder, "source": source, "checkpoint": checkpoint, "stderr": fit.stderr, "answers": answers,
            "test_acc": metrics["test_acc"], "rows": rows}  # fmt: skip


@pytest.fixture(scope="module")
def three_classes(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("three")
    make_table(300, seed=1).to_csv(folder / "birds and more.csv", index=False)
    return fit_table(folder, folder / "birds and more.csv")


@pytest.fixture(scope="module")
def two_integer_classes(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("two")
    make_table(300, seed=2, two_classes=True, integer_labels=True).to_parquet(folder / "table.parquet")
    return fit_table(folder, folder / "table.parquet")


def test_columns_are_typed_on_the_training_split_and_ids_and_constants_named(tmp_path, capsys):
    make_table(200, seed=3).to_csv(tmp_path / "t.csv", index=False)
    data = TableDataModule(str(tmp_path / "t.csv"), "species")
    assert data.class_names == ["Adelie", "Chinstrap", "Gentoo"]
    data.setup("fit")
    kinds = {column["name"]: column["kind"] for column in data.state["columns"]}
    assert kinds == {LENGTH: "numeric", COLOUR: "categorical", WEIGHT: "numeric"}
    assert [column.get("indicator") for column in data.state["columns"]] == [True, None, False]
    assert set(data.state["left_out"]) == {"row id", "site"}
    stderr = capsys.readouterr().err
    assert "column 'row id' left out" in stderr and "column 'site' left out: one value ('north')" in stderr
    # The input width: the length and its missing flag, blue/green/red/other, the weight.
    assert preprocessing.width(data.state) == 7 == data.splits["train"][0].shape[1]
    # Scaling statistics are the training split's alone.
    train = data.raw["train"][0][WEIGHT].astype(float)
    weight = next(column for column in data.state["columns"] if column["name"] == WEIGHT)
    assert weight["mean"] == pytest.approx(train.mean()) and weight["std"] == pytest.approx(train.std(ddof=0))
    assert weight["mean"] != pytest.approx(pd.read_csv(tmp_path / "t.csv")[WEIGHT].mean(), abs=1e-9)


def test_missing_cells_and_unseen_categories_follow_the_policy():
    state = preprocessing.describe_columns(make_table(100, seed=4), "species")
    batch = preprocessing.serving_batch(state, NEW_ROWS, ["a", "b", "c", "d"])
    length = state["columns"][0]
    assert batch[1, 0] == pytest.approx((length["median"] - length["mean"]) / length["std"])  # median, flagged
    assert batch[:, 1].tolist() == [0, 1, 0, 0]
    assert batch[2, 2:6].tolist() == [0, 0, 0, 1] and batch[3, 2:6].tolist() == [0, 0, 0, 1]  # missing, unseen
    with pytest.raises(DataError, match=r"request: b, column 'weight \(g\)': 'heavy' is not a number"):
        preprocessing.serving_batch(state, NEW_ROWS.assign(**{WEIGHT: [1, "heavy", 2, 3]}), ["a", "b", "c", "d"])
    with pytest.raises(DataError, match=r"request: no column 'colour'; send every column"):
        preprocessing.serving_batch(state, NEW_ROWS.drop(columns=[COLOUR]), ["a", "b", "c", "d"])


# An MLTable file as Azure ML's data assets have it (scripts.assets writes one alike): a CSV beside it, read whole.
MLTABLE = """\
$schema: https://azuremlschemas.azureedge.net/latest/MLTable.schema.json
type: mltable
paths:
- file: ./t.csv
transformations:
- read_delimited:
    delimiter: ','
    header: all_files_same_headers
    encoding: utf8
    empty_as_string: false
"""


def test_integer_labels_sort_by_value_and_parquet_and_an_mltable_read_alike(tmp_path):
    frame = make_table(120, seed=5, integer_labels=True)
    frame.to_parquet(tmp_path / "t.parquet")
    (tmp_path / "asset").mkdir()
    frame.to_csv(tmp_path / "asset" / "t.csv", index=False)
    (tmp_path / "asset" / "MLTable").write_text(MLTABLE)
    parquet = TableDataModule(str(tmp_path / "t.parquet"), "species")
    mltable = TableDataModule(str(tmp_path / "asset"), "species")
    assert parquet.class_names == mltable.class_names == ["1", "2", "10"]
    parquet.setup("fit")
    mltable.setup("fit")
    for split in ("train", "val", "test"):
        assert torch.allclose(parquet.splits[split][0], mltable.splits[split][0])
        assert torch.equal(parquet.splits[split][1], mltable.splits[split][1])


@pytest.mark.slow
@pytest.mark.parametrize("fitted", ["three_classes", "two_integer_classes"])
def test_a_fit_reaches_a_logistic_regression_on_the_same_split(fitted, request):
    run = request.getfixturevalue(fitted)
    data = TableDataModule(str(run["source"]), "species")
    data.setup("fit")
    floor = logistic_regression_accuracy(data)
    print(f"{fitted}: test_acc {run['test_acc']:.4f}, logistic regression {floor:.4f}")
    assert run["test_acc"] >= floor, (run["test_acc"], floor)
    assert run["test_acc"] >= 0.8  # the classes are learnable: far above a constant answer
    assert "column 'row id' left out" in run["stderr"] and "column 'site' left out" in run["stderr"]
    # Each column's kind, said once on stderr and kept in the run.
    assert run["stderr"].count(f"{run['source']}: column '{COLOUR}': categorical, 3 categories") == 1
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{run['folder'] / 'outputs' / 'mlflow.db'}")
    (found,) = client.search_runs([e.experiment_id for e in client.search_experiments() if e.name == "table"])
    columns = json.loads(
        Path(client.download_artifacts(found.info.run_id, "columns.json", str(run["folder"]))).read_text()
    )
    assert columns[LENGTH] == "numeric, some missing" and columns["site"].startswith("left out: one value")


@pytest.mark.slow
def test_the_checkpoint_keeps_the_column_types_and_integer_class_names(two_integer_classes):
    saved = torch.load(two_integer_classes["checkpoint"], map_location="cpu", weights_only=False)
    assert saved["hyper_parameters"]["class_names"] == ["0", "1"]
    (state,) = [value["serving"] for value in saved.values() if isinstance(value, dict) and "serving" in value]
    assert [(column["name"], column["kind"]) for column in state["columns"]] == [
        (LENGTH, "numeric"), (COLOUR, "categorical"), (WEIGHT, "numeric"),
    ]  # fmt: skip
    assert {answer[1] for answer in two_integer_classes["answers"]} <= {"0", "1"}


def bad_tables(folder: Path) -> dict[str, tuple[Path, str, str]]:
    """A mistake each: (file, label, the start of its one line after 'error: ')."""
    table = make_table(60, seed=6)
    table.to_csv(folder / "t.csv", index=False)
    table.assign(species="Adelie").to_csv(folder / "one.csv", index=False)
    table.assign(species=table["species"].where(table.index != 7)).to_csv(folder / "gaps.csv", index=False)
    (folder / "t.xlsx").write_bytes(b"PK\x03\x04" + bytes(100))
    (folder / "book.csv").write_bytes(b"PK\x03\x04" + bytes(100))
    table[["row id", "site", "species"]].to_csv(folder / "ids.csv", index=False)
    table.assign(species=table[WEIGHT]).to_csv(folder / "weights.csv", index=False)
    (folder / "broken.parquet").write_bytes(b"PAR1" + bytes(100))
    (folder / "asset").mkdir()
    (folder / "asset" / "MLTable").write_text("paths:\n  - folder: ./\n")
    return {
        "no such label column": (folder / "t.csv", "Species", "t.csv: no label column 'Species' (did you"),
        "one class only": (folder / "one.csv", "species", "one.csv: every row of label column 'species'"),
        "label with missing cells": (
            folder / "gaps.csv",
            "species",
            "gaps.csv: label column 'species' is empty on line 9 (1 row in all)",
        ),  # fmt: skip
        "not CSV or Parquet": (folder / "t.xlsx", "species", "t.xlsx: not a CSV or Parquet file"),
        "a workbook named .csv": (folder / "book.csv", "species", "book.csv: a zip archive (an Excel workbook?)"),
        "labels not whole numbers": (
            folder / "weights.csv",
            "species",
            "weights.csv: label column 'species' holds numbers that are not whole",
        ),  # fmt: skip
        "a broken Parquet file": (folder / "broken.parquet", "species", "broken.parquet: not a readable Parquet file"),
        "an MLTable of no file": (folder / "asset", "species", "asset/MLTable: its paths name no file"),
        "no feature column": (folder / "ids.csv", "species", "ids.csv: no column to learn from: every column but"),
    }


MISTAKES = ["no such label column", "one class only", "label with missing cells", "not CSV or Parquet",
            "a workbook named .csv", "labels not whole numbers", "a broken Parquet file", "an MLTable of no file",
            "no feature column"]  # fmt: skip


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_bad_table_is_one_data_error(mistake, tmp_path):
    path, label, message = bad_tables(tmp_path)[mistake]
    with pytest.raises(DataError) as error:
        data = TableDataModule(str(path), label)
        data.class_names  # noqa: B018 (what the CLI reads right after __init__)
        data.setup("fit")
    assert f"{error.value}".startswith(f"{tmp_path}/{message}"), error.value
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_a_bad_label_column_is_one_line_from_the_cli(tmp_path):
    path, label, message = bad_tables(tmp_path)["no such label column"]
    done = run_module("scripts.train", "fit", "--config", "configs/table.yaml", "--data.init_args.csv_path", path,
                      "--data.init_args.label", label, "--trainer.default_root_dir", tmp_path / "outputs")  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path}/{message}"), done.stderr
    assert "Traceback" not in done.stderr and not list((tmp_path / "outputs").glob("*/*"))


@pytest.mark.slow
def test_a_network_made_for_another_width_is_one_line(tmp_path):
    make_table(60, seed=7).to_csv(tmp_path / "t.csv", index=False)
    network = "lightning_modules.penguin_net.PenguinNet"  # the penguins' 5 inputs
    done = run_module("scripts.train", "fit", "--config", "configs/table.yaml", "--data.init_args.csv_path",
                      tmp_path / "t.csv", "--data.init_args.label", "species", "--model.network", network,
                      "--trainer.default_root_dir", tmp_path / "out")  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("error: model.network: the data's inputs of shape (7,) do not fit it (")
    ), done.stderr


@pytest.mark.slow
def test_predict_refuses_a_table_without_the_checkpoints_columns_in_one_line_and_reads_past_others(
    three_classes, tmp_path
):
    tables = {
        "lacking": NEW_ROWS.drop(columns=[COLOUR]),
        "renamed": NEW_ROWS.rename(columns={LENGTH: "bill length (mm)"}),
        "extra": NEW_ROWS.assign(notes="x", **{"row id": [1, 2, 3, 4]}),  # the fit left `row id` out
    }
    done = {}
    for name, frame in tables.items():
        frame.to_csv(tmp_path / f"{name}.csv", index=False)
        done[name] = run_module("scripts.train", "predict", "--config", "configs/table.yaml", "--ckpt_path",
                                three_classes["checkpoint"], "--data.init_args.predict_path",
                                tmp_path / f"{name}.csv")  # fmt: skip
    wanted = "send every column the model was trained on ('bill length / mm', 'colour', 'weight (g)')"
    for name, missing, given in (("lacking", "'colour'", ""), ("renamed", "'bill length / mm'", "'bill length (mm)'")):
        result = done[name]
        assert result.returncode == 1 and "Traceback" not in result.stderr and "input,class" not in result.stdout
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith(f"error: {tmp_path}/{name}.csv: no column {missing}; {wanted}"), line
        assert given in line  # the table's own column that the model does not read, where it has one
    assert done["extra"].returncode == 0, done["extra"].stderr[-2000:]
    lines = done["extra"].stdout.strip().splitlines()[-len(NEW_ROWS) :]
    assert [line.split(",")[1] for line in lines] == [answer[1] for answer in three_classes["answers"]]
