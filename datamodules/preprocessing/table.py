"""Any table's rows as the network sees them, with pandas and numpy only: which columns are numbers and which are
categories (decided on the training split), the missing-cell policy, the scaling, one-hot categories. The table
datamodule (datamodules/table.py: fit, test, predict) and the registered model (scripts/serving/pyfunc_model.py, which
ships this file) both turn rows into the network's input here, so both answer alike.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path FILE --data.init_args.label COLUMN

The state (`describe_columns`, kept in every checkpoint and in the registered model) lists each feature column in the
file's order:
- numeric (every cell given in the training split is a finite number): missing cells become the training split's
  median; a column with missing training cells also gets a 0/1 "was missing" input; then standardised with the
  training split's mean and standard deviation (of the filled column);
- categorical (any other): one 0/1 input per category of the training split (sorted), and one more for a missing cell
  or a category the training split did not have.
Columns left out (named in `left_out`, and on stderr by the datamodule): every training cell distinct (an ID, a
row number: nothing a new row could be judged by) and columns of one value (or none) in the training split.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from datamodules.errors import DataError

# Cells read as missing in a CSV; pandas' other defaults (e.g. "nan", "NaN") are read as missing too by to_numeric.
MISSING = ["", "NA", "N/A", "n/a", "#N/A", "#NA", "<NA>", "NA/NA", "NULL", "null", "None", "none", "nan", "NaN", "-"]


def as_text(values: pd.Series) -> pd.Series:
    """Cells as category names: text stripped, whole numbers without '.0' (a JSON client's 3 for a category "3"),
    missing cells as None."""

    def name(value) -> str | None:
        if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
            return None
        if isinstance(value, bool | np.bool_):
            return str(bool(value))
        if isinstance(value, float | np.floating) and float(value).is_integer():
            return str(int(value))
        text = str(value).strip()
        return None if text in MISSING else text

    return values.map(name).astype(object)


def as_numbers(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The cells as float64 (NaN where missing) and a mask of the cells given that are not finite numbers."""
    text = as_text(values)
    given = text.notna().to_numpy()
    numbers = pd.to_numeric(text.where(text.notna(), np.nan), errors="coerce").to_numpy(dtype=np.float64)
    bad = given & ~np.isfinite(numbers)
    return numbers, bad


def describe_columns(train: pd.DataFrame, label: str, where: str = "the table") -> dict:
    """The state of a table whose training split is `train` (every column but `label` is a candidate feature);
    `where` names the table in messages."""
    columns, left_out = [], {}
    for column in train.columns:
        if column == label:
            continue
        text = as_text(train[column])
        given = text.dropna()
        if given.nunique() <= 1:
            left_out[column] = f"one value ({given.iloc[0]!r}) in the training split" if len(given) else "empty"
            continue
        numbers, bad = as_numbers(train[column])
        numeric = not bad.any()
        distinct = given.nunique() == len(train)
        if distinct and not numeric:
            left_out[column] = "a different value on every training row (an ID?)"
            continue
        if distinct and numeric:
            whole = numbers[np.isfinite(numbers)]
            # Whole numbers, each once, spread no wider than twice the rows: row numbers or IDs, not a measurement.
            if np.all(whole == np.round(whole)) and whole.max() - whole.min() < 2 * len(whole):
                left_out[column] = "whole numbers, a different one on every training row (an ID or row number?)"
                continue
        if numeric:
            missing = np.isnan(numbers)
            median = float(np.median(numbers[~missing]))
            filled = np.where(missing, median, numbers)
            columns.append({
                "name": column, "kind": "numeric", "median": median, "mean": float(filled.mean()),
                "std": max(float(filled.std()), 1e-6), "indicator": bool(missing.any()),
            })  # fmt: skip
        else:
            counts = given.value_counts()
            columns.append({
                "name": column, "kind": "categorical", "categories": sorted(counts.index.tolist()),
                "example": str(counts.index[0]),
            })  # fmt: skip
    if not columns:
        raise DataError(
            f"{where}: no column to learn from: every column but the label {label!r} is left out ("
            + "; ".join(f"{name}: {reason}" for name, reason in left_out.items())
            + "); give a table with feature columns"
        )
    # fills_missing_cells: batch scoring (scripts/score.py, scripts/serving/batch_score.py) hands this model rows with
    # empty cells rather than skipping them as it does for a model that refuses them (the penguins').
    return {"label": label, "columns": columns, "left_out": left_out, "fills_missing_cells": True}


def width(state: dict) -> int:
    """The network's input width for `state`: what the datamodule sizes the network by."""
    return sum(
        1 + column["indicator"] if column["kind"] == "numeric" else len(column["categories"]) + 1
        for column in state["columns"]
    )


def feature_names(state: dict) -> list[str]:
    """One name per input of the network, for messages and docs: `col`, `col (missing)`, `col=category`,
    `col=(other or missing)`."""
    names = []
    for column in state["columns"]:
        if column["kind"] == "numeric":
            names += [column["name"]] + ([f"{column['name']} (missing)"] if column["indicator"] else [])
        else:
            names += [f"{column['name']}={category}" for category in column["categories"]]
            names.append(f"{column['name']}=(other or missing)")
    return names


def example_row(state: dict) -> pd.DataFrame:
    """One raw row (each numeric column's training median, each categorical column's commonest category): the
    registered model's input example."""
    return pd.DataFrame(
        {
            column["name"]: [column["median"] if column["kind"] == "numeric" else column["example"]]
            for column in state["columns"]
        }
    )


def serving_batch(state: dict, inputs, names: list[str], where: str = "request") -> np.ndarray:
    """Rows (a pandas DataFrame in the training file's column names; others ignored; one name per row for messages)
    as the network's input batch (N, width(state)), float32. A missing cell follows the policy above; a column the
    model reads that is absent, or a cell of a numeric column that is no number, is a DataError naming it."""
    frame = inputs.reset_index(drop=True)
    absent = [column["name"] for column in state["columns"] if column["name"] not in frame.columns]
    if absent:
        listed = ", ".join(repr(name) for name in absent)
        # A column renamed since the fit: the rows' own names that the model does not read (the label's and those the
        # fit left out aside) say which one.
        known = {column["name"] for column in state["columns"]} | set(state["left_out"]) | {state["label"]}
        unread = [repr(name) for name in frame.columns if name not in known][:5]
        raise DataError(
            f"{where}: no column {listed}; send every column the model was trained on "
            f"({', '.join(repr(column['name']) for column in state['columns'])}), a missing value as an empty cell"
            + (f" (it has {', '.join(unread)}, which the model does not read)" if unread else "")
        )
    parts = []
    for column in state["columns"]:
        values = frame[column["name"]]
        odd = values.map(lambda value: isinstance(value, list | dict | tuple | set | bytes)).to_numpy()
        if odd.any():
            row = int(odd.argmax())
            raise DataError(
                f"{where}: {names[row]}, column {column['name']!r}: a {type(values[row]).__name__}; give one string "
                "or number per cell"
            )
        if column["kind"] == "numeric":
            numbers, bad = as_numbers(values)
            if bad.any():
                row = int(bad.argmax())
                value = values[row].item() if isinstance(values[row], np.generic) else values[row]  # inf, not numpy's
                raise DataError(
                    f"{where}: {names[row]}, column {column['name']!r}: {value!r} is not a number; give a "
                    "number, or leave the cell empty"
                )
            missing = np.isnan(numbers)
            filled = np.where(missing, column["median"], numbers)
            parts.append(((filled - column["mean"]) / column["std"])[:, None])
            if column["indicator"]:
                parts.append(missing[:, None].astype(np.float64))
        else:
            categories = column["categories"]
            index = {category: i for i, category in enumerate(categories)}
            other = len(categories)  # a missing cell, or a category the training split had not
            positions = [index.get(value, other) for value in as_text(values)]
            parts.append(np.eye(other + 1)[np.asarray(positions, dtype=np.int64)])
    return np.concatenate(parts, axis=1).astype(np.float32)
