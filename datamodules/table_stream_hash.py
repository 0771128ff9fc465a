"""Each row's hash of a streamed row group (datamodules/table_stream_scan.py's pass), from its Arrow columns: exactly
`base.row_hashes(table.to_pandas())`, without the frame of one Python object a cell that it makes.

    .venv/bin/python -m pytest -q tests/test_table_stream_hash.py

pandas hashes an object column (`hash_pandas_object`) by factorising it and hashing each distinct value once, as a
categorical: its text (numpy's str of a number) through SipHash, a missing cell as 2**64 - 1. Here Arrow's dictionary
encoding finds the distinct values; only those become Python objects (of the types `to_pandas` gives, cast to object
as `row_hashes` casts them), and pandas hashes them as the same categorical, so the cells' hashes and their
combination across columns are pandas' own. Numbers are given to it as their text, as pandas itself falls back to
(datamodules/row_hash.py's `categorical`, shared with the rows hashed in memory): its first try, as text, leaks 16
bytes a distinct value (pandas 2.3), 850 MB over a pass of 2 million rows of 26 numeric columns (docs/measured.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from datamodules.row_hash import categorical, hashes
from datamodules.table_csv import text_categorical
from datamodules.table_csv_copy import text_kinds


def pandas_integers(schema: pa.Schema) -> set[str]:
    """Columns that `to_pandas` makes numpy integers (not pandas' Int64, which its metadata in the files may ask for):
    those, with a missing cell, pandas makes floats (3 becomes 3.0, which hashes as its text "3.0")."""
    dtypes = schema.empty_table().to_pandas().dtypes
    return {name for name, dtype in dtypes.items() if isinstance(dtype, np.dtype) and dtype.kind in "iu"}


def column_codes(values: pa.ChunkedArray, to_float: bool) -> pd.Categorical:
    """`values` as the categorical pandas factorises `row_hashes`' object column into: each cell's code (-1 where
    missing, NaN included) and the distinct values, in order of first appearance, as the Python objects it holds."""
    values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    if to_float and values.null_count:
        values = values.cast(pa.float64())
    floating = pa.types.is_floating(values.type)
    if floating:
        values = pc.if_else(pc.is_nan(values), pa.scalar(None, values.type), values)
    encoded = pc.dictionary_encode(values)
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    distinct = encoded.dictionary
    if floating:  # pandas' factorising holds 0.0 and -0.0 as one value (they are ==), the first seen
        codes, distinct = merged_zeros(codes, distinct)
    return categorical(codes, distinct.to_pandas().astype(object).to_numpy())  # numbers given as their text


def merged_zeros(codes: np.ndarray, distinct: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Codes and distinct floats with -0.0 and 0.0 as one value, the one seen first (the lower code)."""
    zeros = np.flatnonzero(distinct.to_numpy(zero_copy_only=False) == 0)
    if len(zeros) < 2:
        return codes, distinct
    first, second = zeros
    codes = np.where(codes == second, first, codes)
    codes = np.where(codes > second, codes - 1, codes)
    keep = np.ones(len(distinct), dtype=bool)
    keep[second] = False
    return codes, distinct.filter(pa.array(keep))


def row_hashes(table: pa.Table, integers: set[str]) -> np.ndarray:
    """One 64-bit hash per row of `table`, equal to `base.row_hashes(table.to_pandas())` (a CSV's copy: to its rows
    read as text); `integers`: its columns `to_pandas` makes numpy integers (`pandas_integers`)."""
    if table.num_columns == 0:
        return np.array([], dtype=np.uint64)
    texts = text_kinds(table.schema)  # a CSV's copy: its numbers hashed as the text they were read from
    return hashes([
        text_categorical(column, texts[name] != "float64") if name in texts else column_codes(column, name in integers)
        for name, column in zip(table.column_names, table.columns)
    ])  # fmt: skip
