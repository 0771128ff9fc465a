"""Columns of the table task as a person means them (datamodules/preprocessing/table.py, datamodules/table.py): the
missing-cell spellings of real exports, a few unreadable or `inf` cells in a numeric column, dates, free text and
many categories, `data.init_args.drop`, Parquet list columns, and labels that are no classes. Tables made here.

    .venv/bin/python -m pytest -q tests/test_table_columns.py -n 0
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from datamodules.errors import DataError
from datamodules.preprocessing import table as preprocessing
from datamodules.table import TableDataModule
from tests.test_table import logistic_regression_accuracy


def strong_column_table(rows: int = 600, seed: int = 0) -> pd.DataFrame:
    """`x` decides the class (x > 0, a tenth of the labels flipped near the boundary), `noise` and `colour` do not."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, rows).round(4)
    labels = np.where(x + rng.normal(0, 0.1, rows) > 0, "yes", "no")
    return pd.DataFrame({"x": x, "noise": rng.normal(0, 1, rows).round(3),
                         "colour": rng.choice(["red", "blue"], rows), "label": labels})  # fmt: skip


def fitted(frame: pd.DataFrame, path, **options) -> TableDataModule:
    frame.to_csv(path, index=False)
    data = TableDataModule(str(path), "label", **options)
    data.setup("fit")
    return data


def kinds(data: TableDataModule) -> dict[str, str]:
    return {column["name"]: column["kind"] for column in data.state["columns"]}


def test_missing_spellings_and_a_few_unreadable_or_inf_cells_keep_a_numeric_column_numeric(tmp_path, capsys):
    """Three `?` cells in 600 rows made `x` ~419 categories (test accuracy 0.51, 0.97 without them); one `?` or two
    `inf` cells left it out as "(an ID?)"."""
    clean = strong_column_table()
    floor = logistic_regression_accuracy(fitted(clean, tmp_path / "clean.csv"))
    assert floor > 0.9
    messy = clean.astype({"x": object})
    messy.loc[[5, 50, 500], "x"] = "?"
    for row, spelling in zip((7, 8, 9, 10, 11), ("NA", "n/a", "NULL", "-", "None")):
        messy.loc[row, "x"] = spelling
    for name, frame in {
        "marks": messy,
        "one mark": clean.astype({"x": object}).assign(x=lambda f: f["x"].where(f.index != 3, "?")),
        "two inf": clean.astype({"x": object}).assign(x=lambda f: f["x"].where(~f.index.isin([3, 4]), "inf")),
        "a typo": clean.astype({"x": object}).assign(x=lambda f: f["x"].where(f.index != 3, "0..5")),
    }.items():
        data = fitted(frame, tmp_path / "t.csv")
        assert kinds(data) == {"x": "numeric", "noise": "numeric", "colour": "categorical"}, name
        assert logistic_regression_accuracy(data) >= floor - 0.03, name
    stderr = capsys.readouterr().err
    assert f"{tmp_path}/t.csv: column 'x': 2 inf cell(s) (line 5, line 6) read as missing" in stderr
    assert f"{tmp_path}/t.csv: line 5, column 'x': '0..5' is no number or date: read as missing" in stderr
    # The rule: at most 5 unreadable cells and 1% of the column's; more are a column of text (here free text).
    many = clean.astype({"x": object}).assign(x=lambda f: f["x"].where(f.index % 50 != 0, "about 1"))
    assert fitted(many, tmp_path / "many.csv").state["left_out"]["x"].endswith("(free text or an ID?)")


def test_dates_become_days_and_the_kinds_are_said_once(tmp_path, capsys):
    frame = strong_column_table(200)
    frame["day"] = pd.date_range("2021-01-01", periods=200, freq="D").strftime("%Y-%m-%d")
    frame["stamp"] = pd.date_range("2021-01-01T06:00:00", periods=200, freq="h").strftime("%Y-%m-%dT%H:%M:%SZ")
    data = fitted(frame, tmp_path / "dates.csv")
    assert kinds(data) | {} == {"x": "numeric", "noise": "numeric", "colour": "categorical", "day": "date",
                                "stamp": "date"}  # fmt: skip
    assert preprocessing.width(data.state) == 7  # x, noise, colour's 2 + other, day, stamp: no 200-wide one-hot
    stderr = capsys.readouterr().err
    assert stderr.count(f"{tmp_path}/dates.csv: column 'day': date (as days since 1970-01-01)") == 1
    assert f"{tmp_path}/dates.csv: column 'colour': categorical, 2 categories" in stderr
    parquet = frame.assign(day=pd.to_datetime(frame["day"]), stamp=pd.to_datetime(frame["stamp"]))
    parquet.to_parquet(tmp_path / "dates.parquet")
    from_parquet = TableDataModule(str(tmp_path / "dates.parquet"), "label")
    from_parquet.setup("fit")
    assert kinds(from_parquet) == kinds(data)
    # The same days from either file (the rows' split may differ: a row's hash is of its cells as the file holds them,
    # a date's text in the CSV, a timestamp in the Parquet file).
    days = {
        name: next(c for c in d.state["columns"] if c["name"] == "day")
        for name, d in (("csv", data), ("pq", from_parquet))
    }
    assert abs(days["csv"]["median"] - days["pq"]["median"]) < 40
    day = next(column for column in data.state["columns"] if column["name"] == "day")
    assert (
        pd.Timestamp("2021-01-01")
        < pd.Timestamp("1970-01-01") + pd.Timedelta(days=day["median"])
        < pd.Timestamp("2021-07-20")
    )
    rows = preprocessing.example_row(data.state).assign(day="2021-02-30")
    with pytest.raises(DataError, match=r"request: a, column 'day': '2021-02-30' is not a date \(2024-03-01"):
        preprocessing.serving_batch(data.state, rows, ["a"])


def test_free_text_is_left_out_and_many_categories_are_capped(tmp_path):
    frame = strong_column_table(600)
    rng = np.random.default_rng(1)
    frame["comment"] = [f"note {i}" for i in rng.integers(0, 5000, 600)]  # mostly one-off texts
    frame["city"] = [f"city {i}" for i in rng.integers(0, 80, 600)]  # 80 repeated names
    data = fitted(frame, tmp_path / "text.csv")
    assert data.state["left_out"]["comment"].endswith("(free text or an ID?)")
    city = next(column for column in data.state["columns"] if column["name"] == "city")
    assert len(city["categories"]) == preprocessing.MAX_CATEGORIES and city["others"] > 0
    assert "(the commonest; " in data.columns_record()["city"]


def test_drop_leaves_columns_out_and_an_unknown_name_is_one_line(tmp_path):
    frame = strong_column_table(100)
    data = fitted(frame, tmp_path / "t.csv", drop=["noise"])
    assert kinds(data) == {"x": "numeric", "colour": "categorical"}
    assert data.state["left_out"] == {"noise": "data.init_args.drop names it"}
    for drop, what in ((["Noise"], f"no column 'Noise' in {tmp_path}/t.csv"), (["label"], "the label")):
        with pytest.raises(DataError) as error:
            TableDataModule(str(tmp_path / "t.csv"), "label", drop=drop).setup("fit")
        assert str(error.value) == (
            f"data.init_args.drop: {what}; give columns of the table to leave out (its columns: 'x', 'noise', 'colour')"
        )


def test_a_parquet_list_column_is_left_out_and_said(tmp_path):
    """A 68-line TypeError (unhashable type: 'numpy.ndarray') from the split's search for copies."""
    strong_column_table(100).assign(tags=[[1, 2]] * 100).to_parquet(tmp_path / "t.parquet")
    data = TableDataModule(str(tmp_path / "t.parquet"), "label")
    data.setup("fit")
    assert data.state["left_out"]["tags"].startswith("lists, not one value a cell")


@pytest.mark.parametrize("classes", [100, 500])
def test_a_label_of_many_classes_is_named(classes, tmp_path):
    """An ID column as the label (every class one row) and a label of 500 values in 600 rows were told 'N rows leave no
    test rows ... give more rows or a larger test_fraction'."""
    frame = strong_column_table(classes if classes == 100 else 600).assign(label=lambda f: f.index % classes)
    frame.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError) as error:
        TableDataModule(str(tmp_path / "t.csv"), "label").setup("fit")
    assert str(error.value).startswith(f"{tmp_path}/t.csv: label column 'label' has {classes} classes in "), error.value
    assert "needs several rows of each class" in str(error.value)


def test_whole_float_labels_are_named_alike_from_csv_and_parquet(tmp_path):
    frame = strong_column_table(100).assign(label=lambda f: np.where(f["label"] == "yes", 1.0, 0.0))
    frame.to_csv(tmp_path / "t.csv", index=False)  # 0.0 and 1.0
    frame.to_parquet(tmp_path / "t.parquet")
    assert TableDataModule(str(tmp_path / "t.csv"), "label").class_names == ["0", "1"]
    assert TableDataModule(str(tmp_path / "t.parquet"), "label").class_names == ["0", "1"]


def test_the_exact_copies_line_is_printed_once_per_table(tmp_path, capsys):
    """Penguins' setup runs per stage (fit, then its test, then the registration's): the line came 3 times."""
    from palmerpenguins import load_penguins

    from datamodules.penguins import PenguinDataModule

    table = load_penguins()
    pd.concat([table, table.iloc[:5]]).to_csv(tmp_path / "twice.csv", index=False)
    data = PenguinDataModule(csv_path=str(tmp_path / "twice.csv"))
    for stage in ("fit", "test", "validate"):
        data.setup(stage)
    assert capsys.readouterr().err.count("rows are exact copies of others") == 1
