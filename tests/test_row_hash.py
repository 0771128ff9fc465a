"""Rows' hashes in memory (datamodules/row_hash.py, through base.row_hashes) are pandas' hashing of the cells as Python
objects, as they always were, cell for cell over awkward columns (mixed types, numbers and their text in one column,
times with and without zones, decimals, bytes), and hashing them keeps no memory per distinct value.

    .venv/bin/python -m pytest -q tests/test_row_hash.py
"""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pandas as pd
import pytest

from datamodules import base
from tests.test_table_stream_hash import awkward_table, resident_mb


def pandas_own(frame: pd.DataFrame) -> list[int]:
    """The rows' hashes as base.row_hashes has always made them: pandas' of the frame cast to objects."""
    cells = frame.astype(object).where(frame.notna(), None)
    return pd.util.hash_pandas_object(cells, index=False).to_numpy(dtype=np.uint64).tolist()


def awkward_frame() -> pd.DataFrame:
    moment = pd.Timestamp("2024-02-29 12:30:01")
    return pd.DataFrame({
        "numbers and text": [1, "1", 2.5, "b", None, 1.0],
        "ints and floats": [1, 1.0, 2, 2.5, np.nan, True],
        "zeros": [0.0, -0.0, 1.5, -0.0, None, 0.0],
        "float32": np.array([0.1, np.nan, 2.5, 0.1, np.inf, -1.0], dtype=np.float32),
        "uint8": np.array([0, 255, 3, 3, 0, 1], dtype=np.uint8),
        "bools": [True, False, True, True, False, False],
        "bools missing": [True, None, False, True, None, False],
        "Int64": pd.array([1, None, 3, 3, None, 0], dtype="Int64"),
        "arrow text": pd.array(["a", None, "", "é", "a", "😀"], dtype="string[pyarrow]"),
        "naive times": [moment, None, moment, moment, pd.Timestamp("1999-01-01"), moment],
        "zoned times": pd.to_datetime([moment, moment, None, moment, moment, moment]).tz_localize("Europe/Paris"),
        "times and text": [moment, "2024-02-29", None, moment, "x", "x"],
        "dates": [datetime.date(2024, 2, 29), None, datetime.date(1970, 1, 1)] * 2,
        "decimals": [decimal.Decimal("1.10"), None, decimal.Decimal("-0.01")] * 2,
        "bytes and numbers": [b"ab", 3, None, b"", b"ab", 3],
        "categories": pd.Categorical(["x", "y", None, "x", "z", "y"]),
        "empty": [None] * 6,
    })  # fmt: skip


def test_row_hashes_are_pandas_own_over_awkward_columns():
    frame = awkward_frame()
    assert base.row_hashes(frame).tolist() == pandas_own(frame)
    for name in frame.columns:  # each column alone, so that one column's difference is not hidden by another's
        assert base.row_hashes(frame[[name]]).tolist() == pandas_own(frame[[name]]), name
    table = awkward_table().to_pandas()
    assert base.row_hashes(table).tolist() == pandas_own(table)


@pytest.mark.parametrize("seed", [0, 1])
def test_row_hashes_are_pandas_own_over_many_random_rows(seed):
    rng = np.random.default_rng(seed)
    numbers = rng.normal(size=5000).round(2)
    numbers[rng.random(5000) < 0.1] = np.nan
    frame = pd.DataFrame({"x": numbers, "n": rng.integers(-3, 3, 5000), "c": rng.choice(["red", "blue", None], 5000),
                          "mixed": rng.choice(np.array([1, "1", 2.0, None], dtype=object), 5000)})  # fmt: skip
    frame.loc[rng.random(5000) < 0.05, "x"] = -0.0
    assert base.row_hashes(frame).tolist() == pandas_own(frame)


@pytest.mark.slow
def test_hashing_numbers_in_memory_holds_no_memory_per_row():
    """pandas' hashing of numbers as objects leaks 16 bytes a distinct value (its try as text raises without freeing):
    a table of 65,536 distinct numbers hashed 100 times would keep 100 MB."""
    rng = np.random.default_rng(0)
    frames = [pd.DataFrame({"x": rng.normal(size=65_536)}) for _ in range(4)]
    base.row_hashes(frames[0])
    before = resident_mb()
    for index in range(100):
        base.row_hashes(frames[index % 4])
    assert resident_mb() - before < 50
