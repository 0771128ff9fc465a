"""The streamed pass's row hashes from Arrow columns (datamodules/table_stream_hash.py) are base.row_hashes' of the
same row group read by pandas, cell for cell, over awkward cells: missing ones of every type, whole numbers with
missing cells (floats to pandas) or with pandas' Int64 metadata, NaN, -0.0 before and after 0.0, text, unicode,
bools, dates, times, decimals, categoricals, bytes.

    .venv/bin/python -m pytest -q tests/test_table_stream_hash.py
"""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from datamodules import base
from datamodules.table_stream_hash import pandas_integers, row_hashes


def awkward_table() -> pa.Table:
    day = datetime.date(2024, 2, 29)
    moment = datetime.datetime(2024, 2, 29, 12, 30, 1, 5)
    return pa.table({
        "whole": pa.array([1, 2, 2, 3, -7, 0], pa.int64()),
        "whole_missing": pa.array([1, None, 3, 3, None, 0], pa.int64()),
        "small": pa.array([1, 2, None, 4, 5, 6], pa.int8()),
        "unsigned": pa.array([2**64 - 1, 0, 1, 1, 5, 2**63], pa.uint64()),
        "real": pa.array([1.5, float("nan"), None, -0.0, 0.0, 1e-05], pa.float64()),
        "zero_first": pa.array([0.0, -0.0, 2.0, -0.0, 0.0, 3.0], pa.float64()),
        "single": pa.array([0.1, None, 2.5, 0.1, float("inf"), -1.0], pa.float32()),
        "text": pa.array(["a", None, "", " a ", "NA", "a"], pa.string()),
        "unicode": pa.array(["é", "日本", "😀", None, "é", "ß"], pa.large_string()),
        "flag": pa.array([True, False, None, True, True, False], pa.bool_()),
        "flag_full": pa.array([True, False, False, True, True, False], pa.bool_()),
        "day": pa.array([day, None, day, datetime.date(1970, 1, 1), day, day], pa.date32()),
        "moment": pa.array([moment, None, moment, moment, datetime.datetime(1999, 1, 1), moment], pa.timestamp("us")),
        "zoned": pa.array([moment, moment, None, moment, moment, moment], pa.timestamp("ms", tz="Europe/Paris")),
        "money": pa.array([decimal.Decimal("1.10"), None, decimal.Decimal("-0.01")] * 2, pa.decimal128(6, 2)),
        "kind": pa.array(["x", "y", None, "x", "z", "y"]).dictionary_encode(),
        "raw": pa.array([b"\x00\xff", b"", None, b"ab", b"ab", b"\x00\xff"], pa.binary()),
        "empty": pa.array([None] * 6, pa.string()),
    })  # fmt: skip


def test_row_hashes_from_arrow_are_pandas_own_over_awkward_cells():
    table = awkward_table()
    ours = row_hashes(table, pandas_integers(table.schema))
    assert ours.dtype == np.uint64 and ours.tolist() == base.row_hashes(table.to_pandas()).tolist()
    for name in table.column_names:  # each column alone, so that one column's difference is not hidden by another's
        column = table.select([name])
        assert (
            row_hashes(column, pandas_integers(column.schema)).tolist() == base.row_hashes(column.to_pandas()).tolist()
        ), name


def test_row_hashes_from_arrow_follow_pandas_metadata_and_chunks():
    frame = pd.DataFrame({"visits": pd.array([None, 3, 4, None], dtype="Int64"), "name": ["a", "b", "c", "d"]})
    table = pa.Table.from_pandas(frame, preserve_index=False)  # Int64 in its metadata: ints to pandas, not floats
    assert row_hashes(table, pandas_integers(table.schema)).tolist() == base.row_hashes(table.to_pandas()).tolist()
    chunked = pa.concat_tables([awkward_table().slice(0, 2), awkward_table().slice(2)])
    expected = base.row_hashes(chunked.to_pandas()).tolist()
    assert row_hashes(chunked, pandas_integers(chunked.schema)).tolist() == expected


@pytest.mark.parametrize("seed", [0, 1])
def test_row_hashes_from_arrow_are_pandas_own_over_many_random_rows(seed):
    rng = np.random.default_rng(seed)
    numbers = rng.normal(size=5000).round(2)
    numbers[rng.random(5000) < 0.1] = np.nan
    table = pa.table({"x": numbers, "n": pa.array(rng.integers(-3, 3, 5000)).cast(pa.int32()),
                      "c": pa.array(rng.choice(["red", "blue", None], 5000))})  # fmt: skip
    ours = row_hashes(table, pandas_integers(table.schema))
    assert ours.tolist() == base.row_hashes(table.to_pandas()).tolist()


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:")) / 1024


@pytest.mark.slow
def test_hashing_numbers_from_arrow_holds_no_memory_per_row():
    """pandas' hashing of numbers as objects leaks 16 bytes a distinct value (its try as text raises without freeing):
    a column of 100 row groups of 65,536 distinct numbers, as the pass hashes them, would keep 100 MB."""
    rng = np.random.default_rng(0)
    groups = [pa.table({"x": rng.normal(size=65_536)}) for _ in range(4)]
    integers = pandas_integers(groups[0].schema)
    row_hashes(groups[0], integers)
    before = resident_mb()
    for index in range(100):
        row_hashes(groups[index % 4], integers)
    assert resident_mb() - before < 50
