"""Any table's rows as the network sees them, with pandas and numpy only: which columns are numbers and which are
categories (decided on the training split), the missing-cell policy, the scaling, one-hot categories. The table
datamodule (datamodules/table.py: fit, test, predict) and the registered model (scripts/serving/pyfunc_model.py, which
ships this file) both turn rows into the network's input here, so both answer alike.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path FILE --data.init_args.label COLUMN

The state (`describe_columns`, kept in every checkpoint and in the registered model) lists each feature column in the
file's order:
- numeric (every cell given in the training split is a number, but for a few: `tolerated`): missing
  cells (MISSING's spellings, any case; `inf`; the few unreadable cells, named on stderr by the datamodule) become
  the training split's median; a column with missing training cells also gets a 0/1 "was missing" input; then
  standardised with the training split's mean and standard deviation (of the filled column);
- date (otherwise, every cell an ISO date or date-time, `2024-03-01`, `2024-03-01T12:30:00Z`, or a Parquet date or
  timestamp, with the same tolerance): days since 1970-01-01 (UTC; a time is a fraction of a day), then as numeric;
- categorical (any other): one 0/1 input per category of the training split (sorted), and one more for a missing cell
  or a category the training split did not have. More than MAX_CATEGORIES categories: the MAX_CATEGORIES commonest
  are kept and the others read as that "other" input (a city or a product code still informs; thousands of one-hot
  inputs of rare values would mostly learn noise).
Columns left out (named in `left_out`, and on stderr by the datamodule): every training cell distinct (an ID, a
row number: nothing a new row could be judged by), more than MAX_CATEGORIES categories that are more than half the
cells (free text: no category a new row is likely to share), columns of one value (or none) in the training split,
and those the user leaves out (`drop`).
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from datamodules.errors import DataError
from datamodules.preprocessing.table_schema import check_columns

log = logging.getLogger(__name__)

# Cells read as missing, in any case (`na`, `Null`, `N/A`): what spreadsheets, R, databases and UCI's files write for
# an empty cell. `nat`: pandas' missing timestamp.
MISSING = ["", "?", "-", "--", "NA", "N/A", "#N/A", "#NA", "<NA>", "NA/NA", "NULL", "None", "nan", "NaT"]
MISSING_TEXT = frozenset(text.lower() for text in MISSING)
MAX_CATEGORIES = 50
FEW_UNREADABLE = 5  # at most this many unreadable cells, and at most 1% of the column's given cells
ISO_DATE = r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?"
EPOCH = pd.Timestamp("1970-01-01", tz="UTC")


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
        return None if text.lower() in MISSING_TEXT else text

    return values.map(name).astype(object)


def as_numbers(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The cells as float64 (NaN where missing) and a mask of the cells given that are not finite numbers."""
    if values.dtype.kind in "fiu":  # numbers already (Parquet's): what their text would read as, without the text
        numbers = values.to_numpy(dtype=np.float64, na_value=np.nan)
        return numbers, np.isinf(numbers)
    text = as_text(values)
    given = text.notna().to_numpy()
    numbers = pd.to_numeric(text.where(text.notna(), np.nan), errors="coerce").to_numpy(dtype=np.float64)
    bad = given & ~np.isfinite(numbers)
    return numbers, bad


def infinite(value) -> bool:
    """Whether a cell is `inf` or `-inf` (a float, or text such as `inf`, `-Infinity`)."""
    return bool(np.isinf(as_numbers(pd.Series([value], dtype=object))[0][0]))


def as_days(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The cells as days since 1970-01-01 UTC (NaN where missing; a date-time without a zone taken as UTC) and a mask
    of the cells given that are no ISO date or date-time."""
    text = as_text(values)
    given = text.notna().to_numpy()
    iso = text.str.fullmatch(ISO_DATE, na=False).to_numpy(dtype=bool)
    stamps = pd.to_datetime(text.where(iso, None), utc=True, format="ISO8601", errors="coerce")
    days = ((stamps - EPOCH) / pd.Timedelta(days=1)).to_numpy(dtype=np.float64, na_value=np.nan)
    return days, given & ~np.isfinite(days)


def cell_numbers(values: pd.Series, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """A numeric or date column's cells as numbers, and the mask of the given cells that are none."""
    return as_days(values) if kind == "date" else as_numbers(values)


def tolerated(unreadable: int, given: int) -> bool:
    """Whether a column of `given` cells, `unreadable` of them not of its kind, is still of that kind: a few typing
    slips (`12..5`, `n.a.`) in a column of numbers, not a column of text that holds some numbers."""
    return unreadable <= min(FEW_UNREADABLE, given // 100)


def unreadable_cells(state: dict, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per numeric or date column of `state`, the mask of `frame`'s cells given that are not of its kind: the
    training file's few unreadable cells (and `inf`), which the datamodule reads as missing and names."""
    found = {}
    for column in state["columns"]:
        if column["kind"] in ("numeric", "date") and column["name"] in frame.columns:
            bad = cell_numbers(frame[column["name"]], column["kind"])[1]
            if bad.any():
                found[column["name"]] = bad
    return found


def describe_columns(train: pd.DataFrame, label: str, where: str = "the table", drop: dict | None = None) -> dict:
    """The state of a table whose training split is `train` (every column but `label` and those of `drop`, a dict of
    column: why, is a candidate feature); `where` names the table in messages."""
    columns, left_out = [], dict(drop or {})
    for column in train.columns:
        if column == label or column in left_out:
            continue
        described = describe_column(train[column], column, len(train))
        if isinstance(described, str):
            left_out[column] = described
        else:
            columns.append(described)
    if not columns:
        raise DataError(
            f"{where}: no column to learn from: every column but the label {label!r} is left out ("
            + "; ".join(f"{name}: {reason}" for name, reason in left_out.items())
            + "); give a table with feature columns"
        )
    # fills_missing_cells: batch scoring (scripts/score.py, scripts/serving/batch_score.py) hands this model rows with
    # empty cells rather than skipping them as it does for a model that refuses them (the penguins').
    return {"label": label, "columns": columns, "left_out": left_out, "fills_missing_cells": True}


def describe_column(values: pd.Series, name: str, rows: int) -> dict | str:
    """One training column's state, or why it is left out."""
    given = values.dropna() if values.dtype.kind in "fiu" else as_text(values).dropna()  # numbers: one text each
    if given.nunique() <= 1:
        return f"one value ({as_text(given.head(1)).iloc[0]!r}) in the training split" if len(given) else "empty"
    numbers, bad = as_numbers(values)
    kind = "numeric" if tolerated(int((bad & ~np.isinf(numbers)).sum()), len(given)) else None
    if kind is None and tolerated(int((days := as_days(values))[1].sum()), len(given)):
        kind, (numbers, bad) = "date", days
    distinct = given.nunique() == rows
    if distinct and kind is None:
        return "a different value on every training row (an ID?)"
    if distinct and kind == "numeric":
        whole = numbers[np.isfinite(numbers)]
        # Whole numbers, each once, spread no wider than twice the rows: row numbers or IDs, not a measurement.
        if np.all(whole == np.round(whole)) and whole.max() - whole.min() < 2 * len(whole):
            return "whole numbers, a different one on every training row (an ID or row number?)"
    if kind is not None:
        missing = ~np.isfinite(numbers)
        median = float(np.median(numbers[~missing]))
        filled = np.where(missing, median, numbers)
        return {
            "name": name, "kind": kind, "median": median, "mean": float(filled.mean()),
            "std": max(float(filled.std()), 1e-6), "indicator": bool(missing.any()),
        }  # fmt: skip
    counts = given.value_counts()
    if len(counts) > MAX_CATEGORIES and len(counts) > len(given) / 2:
        return f"{len(counts)} different texts in {len(given)} cells (free text or an ID?)"
    # The commonest first, ties by name: the MAX_CATEGORIES kept do not depend on the order of the rows.
    kept = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:MAX_CATEGORIES]
    return {
        "name": name, "kind": "categorical", "categories": sorted(category for category, _ in kept),
        "example": str(kept[0][0]), **({"others": len(counts) - len(kept)} if len(counts) > len(kept) else {}),
    }  # fmt: skip


def describe_kinds(state: dict) -> dict[str, str]:
    """Each column of the table as read, in a few words: its kind (and what it becomes) or why it is left out."""
    kinds = {}
    for column in state["columns"]:
        kind = column["kind"]
        if kind == "categorical":
            kind += f", {len(column['categories'])} categories"
            if column.get("others"):
                kind += f" (the commonest; {column['others']} rarer ones read as other)"
        elif kind == "date":
            kind += " (as days since 1970-01-01)"
        kinds[column["name"]] = kind + (", some missing" if column.get("indicator") else "")
    return kinds | {name: f"left out: {why}" for name, why in state["left_out"].items()}


def width(state: dict) -> int:
    """The network's input width for `state`: what the datamodule sizes the network by."""
    return sum(
        1 + column["indicator"] if column["kind"] != "categorical" else len(column["categories"]) + 1
        for column in state["columns"]
    )


def example_row(state: dict) -> pd.DataFrame:
    """One raw row (each numeric column's training median, each categorical column's commonest category): the
    registered model's input example."""

    def example(column: dict):
        if column["kind"] == "date":
            return (EPOCH + pd.Timedelta(days=column["median"])).strftime("%Y-%m-%d")
        return column["median"] if column["kind"] == "numeric" else column["example"]

    return pd.DataFrame({column["name"]: [example(column)] for column in state["columns"]})


def serving_batch(state: dict, inputs, names: list[str], where: str = "request", say_unseen: bool = True) -> np.ndarray:
    """Rows (a pandas DataFrame in the training file's column names; others ignored; one name per row for messages)
    as the network's input batch (N, width(state)), float32. A missing cell follows the policy above; columns are
    checked as table_schema.py says; a cell of a numeric or date column that is none is a DataError naming it. Cells
    of categories the training split did not have are counted in one log line (`say_unseen`)."""
    frame = inputs.reset_index(drop=True)
    check_columns(state, frame, names, where)
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
        if column["kind"] != "categorical":
            numbers, bad = cell_numbers(values, column["kind"])
            if bad.any():
                row = int(bad.argmax())
                value = values[row].item() if isinstance(values[row], np.generic) else values[row]  # inf, not numpy's
                wanted = "a date (2024-03-01, or 2024-03-01T12:30:00)" if column["kind"] == "date" else "a number"
                raise DataError(
                    f"{where}: {names[row]}, column {column['name']!r}: {value!r} is not {wanted}; give "
                    f"{wanted.split(' (')[0]}, or leave the cell empty"
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
            text = as_text(values)
            positions = [index.get(value, other) for value in text]
            parts.append(np.eye(other + 1)[np.asarray(positions, dtype=np.int64)])
            unseen = [(row, value) for row, value in enumerate(text) if value is not None and value not in index]
            if unseen and say_unseen:
                row, value = unseen[0]
                log.warning(
                    "%s: %d cell(s) of column %r hold a category the training split did not have (%s: %r), answered "
                    "as its other or missing one", where, len(unseen), column["name"], names[row], value,
                )  # fmt: skip
    return np.concatenate(parts, axis=1).astype(np.float32)


def column_lines(where: str, state: dict, unreadable: list[tuple[str, str, object]], shown: int = 10) -> list[str]:
    """The stderr block that says how the table was read: each column's kind (or why it is left out), then the cells
    read as missing that were no number or date (`inf` in one line a column)."""
    kinds = describe_kinds(state).items()
    lines = [f"{where}: column {name!r}{' ' if kind.startswith('left') else ': '}{kind}" for name, kind in kinds]
    inf_cells = [(row, column) for row, column, value in unreadable if infinite(value)]
    for column in dict.fromkeys(column for _, column in inf_cells):
        rows = [row for row, named in inf_cells if named == column]
        lines.append(f"{where}: column {column!r}: {len(rows)} inf cell(s) ({', '.join(rows[:shown])}) read as missing")
    others = [(row, column, value) for row, column, value in unreadable if (row, column) not in set(inf_cells)]
    for row, column, value in others[:shown]:
        lines.append(f"{where}: {row}, column {column!r}: {value!r} is no number or date: read as missing")
    if len(others) > shown:
        lines.append(f"{where}: {len(others) - shown} more such cells read as missing")
    return lines


def class_labels(values, where: str, label: str, row_name) -> tuple[list[str], list[str]]:
    """Each row's class name and the sorted class names (whole numbers sorted by value) of a label column."""
    text = as_text(values)
    if text.isna().any():
        row = int(text.isna().to_numpy().argmax())
        count = int(text.isna().sum())
        raise DataError(
            f"{where}: label column {label!r} is empty on {row_name(row)} ({count} row{'s' * (count > 1)} in all); "
            "fill in those rows' classes or remove them"
        )
    labels = text.tolist()
    classes = sorted(set(labels))
    numbers = as_numbers(text)[0]
    if not as_numbers(text)[1].any():  # every label a number
        if any(not float(number).is_integer() for number in numbers):
            raise DataError(
                f"{where}: label column {label!r} holds numbers that are not whole ({text[(numbers % 1 != 0)].iloc[0]})"
                "; a classifier needs classes (names or whole numbers): is it a measurement rather than the label?"
            )
        # `0.0` (a CSV written from floats) is named `0`, as the same labels read from Parquet are.
        labels = [str(int(number)) if "." in name else name for name, number in zip(labels, numbers)]
        classes = sorted(set(labels), key=float)
    if len(classes) < 2:
        raise DataError(
            f"{where}: every row of label column {label!r} is {classes[0]!r}; a classifier needs rows of two classes "
            "or more"
        )
    return labels, classes
