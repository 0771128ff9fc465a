"""A CSV read whole is typed where its text allows (datamodules/table_csv.py): columns of numbers as numbers, any
other as text, and every row hashed as its text cells always were, so no existing CSV's split or digests change.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_table_csv.py -n 0
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from datamodules import base
from datamodules.preprocessing.table import MISSING
from datamodules.table import TableDataModule, read_table
from datamodules.table_csv import row_hashes

# Each column one way a CSV's cells can be written; the comment says what it is read as.
CSV = """\
floats,ints,missing ints,tens,mixed,padded,zeros,whole zeros,text,label
0.5,3,7,3.50,3,2.5,-0.0,-0.0,red,a
-1.25,-4,,2.00,3.5, 2.5,0.0,0.0,green,b
1e-05,0,NA,1.0,4,2.5,0.125,1.0,,a
inf,12,2,0.25,5.5,3.5,0.0,2.0,blue,b
,7,1,0.75,6,1.5,1.5,3.0,red,a
"""
KINDS = {"floats": "float64", "ints": "int64", "missing ints": "Int64", "tens": "object", "mixed": "object",
         "padded": "object", "zeros": "float64", "whole zeros": "object", "text": "object",
         "label": "object"}  # fmt: skip


def as_text_cells(path) -> pd.DataFrame:
    """The CSV as it was read before its cells were typed: every cell text, missing cells NaN."""
    return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=MISSING, index_col=False)


def test_columns_of_numbers_are_numbers_and_rows_hash_as_their_text(tmp_path):
    (tmp_path / "t.csv").write_text(CSV)
    frame, row_name = read_table(str(tmp_path / "t.csv"), "csv_path")
    assert {name: str(kind) for name, kind in frame.dtypes.items()} == KINDS
    assert frame["floats"].tolist()[:4] == [0.5, -1.25, 1e-05, np.inf] and row_name(4) == "line 6"
    assert frame["padded"].tolist()[1] == " 2.5"  # text kept as written: " 2.5" is not a number's own text
    text = as_text_cells(tmp_path / "t.csv")
    assert row_hashes(frame, from_text=True).tolist() == base.row_hashes(text).tolist()
    assert row_hashes(frame[["zeros"]], from_text=True).tolist() == base.row_hashes(text[["zeros"]]).tolist()


def test_a_typed_csv_splits_and_is_described_as_its_text_was(tmp_path):
    rng = np.random.default_rng(3)
    rows = 600
    table = pd.DataFrame({"x": rng.normal(size=rows).round(2), "n": rng.integers(0, 50, rows),
                          "colour": rng.choice(["red", "blue"], rows)})  # fmt: skip
    table["label"] = np.where(table["x"] > 0, "up", "down")
    table["n"] = table["n"].astype("Int64")
    table.loc[::37, "n"] = None  # whole numbers with missing cells, written as such
    table.to_csv(tmp_path / "t.csv", index=False)
    assert (table["x"] == 0).any() and "-0.0" in (tmp_path / "t.csv").read_text()  # both zeros, as rounding writes
    data = TableDataModule(str(tmp_path / "t.csv"), "label")
    data.setup("fit")
    text = as_text_cells(tmp_path / "t.csv")
    hashes = base.row_hashes(text)  # as every cell read as text hashed
    rule = base.split_rule(data.seed, 0.15, 0.15, list(text.columns))
    expected = base.split_rows(rule, hashes, torch.zeros(rows, dtype=torch.long))
    for name, part in zip(base.SPLITS, expected):
        assert data.raw[name][0].index.tolist() == part.tolist()  # the same rows in each split
        assert data.identity["splits"][name]["digest"] == base.digest(hashes[part.numpy()])
    assert data.identity["digest"] == base.digest(hashes)
    assert str(data.raw["train"][0]["x"].dtype) == "float64" and str(data.raw["train"][0]["n"].dtype) == "Int64"
    kinds = {column["name"]: column["kind"] for column in data.state["columns"]}
    assert kinds == {"x": "numeric", "n": "numeric", "colour": "categorical"}


def test_rows_to_predict_of_numbers_in_a_column_of_categories_read_as_the_categories_written(tmp_path):
    rng = np.random.default_rng(4)
    codes = rng.choice(["1.0", "2.0", "x"], 300)  # categories, one of them not a number
    label = np.where(codes == "1.0", "one", "other")
    pd.DataFrame({"code": codes, "size": rng.normal(size=300).round(2), "label": label}).to_csv(
        tmp_path / "t.csv", index=False
    )
    data = TableDataModule(str(tmp_path / "t.csv"), "label", predict_path=str(tmp_path / "new.csv"))
    data.setup("fit")
    assert data.state["columns"][0]["categories"] == ["1.0", "2.0", "x"]
    (tmp_path / "new.csv").write_text("code,size\n1.0,0.5\n2.0,0.5\n")  # this file's codes all numbers: typed
    frame, _ = read_table(str(tmp_path / "new.csv"), "predict_path")
    assert str(frame["code"].dtype) == "float64"
    inputs = data.features(frame, ["line 2", "line 3"], str(tmp_path / "new.csv"), say_unseen=True)
    assert inputs[:, :4].tolist() == [[1, 0, 0, 0], [0, 1, 0, 0]]  # "1.0", "2.0": seen categories, not "other"
