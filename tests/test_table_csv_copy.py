"""A CSV streamed past its memory budget is copied into Parquet typed as the in-memory read types it
(datamodules/table_csv_copy.py), a column that is not numbers late in the file included, its rows hashed as their
text exactly as in memory; several CSV files of one table share each column's type.

    .venv/bin/python -m pytest -q tests/test_table_csv_copy.py
"""

from __future__ import annotations

import tempfile

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamodules import base
from datamodules.preprocessing.table import MISSING
from datamodules.table import read_table
from datamodules.table_stream import open_dataset
from datamodules.table_stream_hash import pandas_integers, row_hashes
from tests.test_table_csv import CSV

ROWS = 120_000  # past pyarrow.csv's first block (1 MB): the last row is read in a later one


def late_csv(path) -> None:
    """Columns each numbers but for a last row that makes them otherwise (or not), past the reader's first block."""
    rng = np.random.default_rng(5)
    frame = pd.DataFrame({
        "ints": rng.integers(-50, 50, ROWS).astype(str),
        "ints then float": rng.integers(0, 9, ROWS).astype(str),
        "floats": rng.normal(size=ROWS).round(3).astype(str),
        "floats then padded": rng.normal(size=ROWS).round(3).astype(str),
        "whole then minus zero": rng.integers(0, 3, ROWS).astype(float).astype(str),
        "ints then missing": rng.integers(0, 1000, ROWS).astype(str),
        "label": rng.choice(["a", "b"], ROWS),
    })  # fmt: skip
    frame.loc[ROWS - 1] = ["7", "3.5", "0.25", "1.50", "-0.0", "NA", "a"]
    frame.to_csv(path, index=False)


def text_cells(path) -> pd.DataFrame:
    """The CSV as it was read before its cells were typed: every cell text, missing cells NaN."""
    return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=MISSING, index_col=False)


def copied(path) -> tuple[pa.Schema, np.ndarray]:
    """The streamed copy's schema and its rows' hashes, row group by row group, as the streamed pass makes them."""
    dataset, units = open_dataset(str(path))
    tables = [unit.to_table(schema=dataset.schema) for unit in units]
    return dataset.schema, np.concatenate([row_hashes(table, pandas_integers(table.schema)) for table in tables])


def arrow_kind(dtype) -> str:
    return {"int64": "int64", "Int64": "int64", "float64": "double"}.get(str(dtype), "string")


@pytest.mark.parametrize("make", ["late", "awkward"])
def test_a_streamed_csv_is_typed_as_read_whole_and_hashes_as_its_text(tmp_path, monkeypatch, make):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the copy goes under the system's temporary folder
    source = tmp_path / "t.csv"
    late_csv(source) if make == "late" else source.write_text(CSV)
    whole, _ = read_table(str(source), "csv_path")
    schema, hashes = copied(source)
    assert {field.name: str(field.type) for field in schema} == {
        name: arrow_kind(dtype) for name, dtype in whole.dtypes.items()
    }
    if make == "late":  # a last cell that is no number's own text makes its column text, as in memory
        assert [str(dtype) for dtype in whole.dtypes] == ["int64", "object", "float64", "object", "object", "Int64",
                                                          "object"]  # fmt: skip
        (copy,) = tmp_path.glob("table-cache/*/t.parquet")
        metadata = pq.read_metadata(copy)  # row groups of ROW_GROUP_ROWS, not one a block the reader read
        assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [65_536, ROWS - 65_536]
    assert hashes.tolist() == base.row_hashes(text_cells(source)).tolist()


def test_csv_files_of_one_table_share_each_column_type(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "exports").mkdir()
    # "n": whole numbers, one file with a missing cell (Int64 in memory), the other without (int64): text in both
    (tmp_path / "exports" / "a.csv").write_text("n,x,label\n1,0.5,a\nNA,1.5,b\n3,2.5,a\n")
    (tmp_path / "exports" / "b.csv").write_text("n,x,label\n4,0.25,b\n5,1.0,a\n6,3.5,b\n")
    whole, _ = read_table(str(tmp_path / "exports"), "csv_path")
    schema, hashes = copied(tmp_path / "exports")
    assert {field.name: str(field.type) for field in schema} == {"n": "string", "x": "double", "label": "string"}
    assert [str(dtype) for dtype in whole.dtypes] == ["object", "float64", "object"]
    texts = pd.concat([text_cells(path) for path in sorted((tmp_path / "exports").glob("*.csv"))], ignore_index=True)
    assert sorted(hashes.tolist()) == sorted(base.row_hashes(texts).tolist())


def test_a_streamed_test_paths_numbers_in_a_column_of_categories_read_as_the_categories_written(tmp_path, monkeypatch):
    from datamodules.table import TableDataModule
    from tests.test_table_stream import loaded, rows_of, same_rows

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rng = np.random.default_rng(6)
    codes = rng.choice(["1.0", "2.0", "2.5", "x"], 400)  # categories, one of them not a number
    label = np.where(np.isin(codes, ["1.0", "2.5"]), "one", "other")
    pd.DataFrame({"code": codes, "size": rng.normal(size=400).round(2), "label": label}).to_csv(
        tmp_path / "train.csv", index=False
    )
    tests = rng.choice(["1.0", "2.0", "2.5"], 200)  # this file's codes all numbers: typed as floats
    test_rows = {
        "code": tests,
        "size": rng.normal(size=200).round(2),
        "label": np.where(tests == "2.0", "other", "one"),
    }
    pd.DataFrame(test_rows).to_csv(tmp_path / "test.csv", index=False)
    whole, streamed = (TableDataModule(str(tmp_path / "train.csv"), "label", test_path=str(tmp_path / "test.csv"),
                                       memory_budget_mb=budget) for budget in (2048, 0))  # fmt: skip
    assert whole.test_stream is None and streamed.test_stream is not None
    whole.setup("fit")
    streamed.setup("fit")
    assert whole.state["columns"][0]["categories"] == ["1.0", "2.0", "2.5", "x"]
    assert whole.splits["test"][0][:, :5].sum(dim=0).tolist()[4] == 0  # none "other": seen categories
    assert same_rows(rows_of(*loaded(streamed, "test")), rows_of(*whole.splits["test"]))
