"""Rows' 64-bit hashes, the one implementation every table's split and digests come from: pandas' `hash_pandas_object`
of the cells as Python objects (missing ones None), as it has always been, without its leak.

    .venv/bin/python -m pytest -q tests/test_row_hash.py tests/test_table_stream_hash.py

pandas hashes an object column as a categorical of its distinct values. Its first try hashes them as text and, on a
number, raises TypeError without freeing two arrays (pandas 2.3: 16 bytes a distinct value, docs/measured.md), then
hashes their `astype(str)`. Here each column is given as that categorical, numbers already as that text.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def hashable_as_text(value) -> bool:
    """Whether pandas hashes `value` as it is (pandas' hash_object_array: text, bytes, tuples and missing ones)."""
    return isinstance(value, str | bytes | tuple) or value is None or (isinstance(value, float) and math.isnan(value))


def categorical(codes: np.ndarray, distinct: np.ndarray) -> pd.Categorical:
    """The categorical pandas hashes an object column as, from its factorisation: each cell's code (-1: missing) and the
    distinct values (objects, in order of first appearance). Those pandas would hash only after failing as text are
    given as the text it then hashes (`astype(str)`), merged where two values have one text (`1` and `"1"`)."""
    categories = pd.Index(distinct)  # as pandas makes it: naive times become datetime64, hashed as numbers
    values = np.asarray(categories.array)
    if values.dtype == object and not all(hashable_as_text(value) for value in values):
        texts, inverse = np.unique(values.astype(str), return_inverse=True)
        codes = np.where(codes >= 0, inverse.reshape(-1)[codes], -1)
        categories = pd.Index(texts.astype(object), dtype=object)
    return pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(categories, ordered=False))


def frame_categorical(column: pd.Series) -> pd.Categorical:
    """One column of a frame as `categorical`, factorised as pandas factorises it cast to objects (missing cells
    None); a numpy column of numbers or bools is factorised as it is (the same codes and distinct values, without a
    Python object a cell)."""
    values = column.to_numpy()
    if not (isinstance(column.dtype, np.dtype) and column.dtype.kind in "biuf"):
        values = column.astype(object).where(column.notna(), None).to_numpy()
    codes, distinct = pd.factorize(values, sort=False)
    return categorical(codes, np.asarray(distinct).astype(object))


def hashes(columns: list[pd.Categorical]) -> np.ndarray:
    """One hash per row of its cells in `columns` (each a column's `categorical`), as pandas combines them."""
    frame = pd.DataFrame(dict(enumerate(columns)))
    return pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)


def frame_hashes(frame: pd.DataFrame) -> np.ndarray:
    """One hash per row of `frame`, of its cells in its column order (base.row_hashes)."""
    return hashes([frame_categorical(frame.iloc[:, index]) for index in range(frame.shape[1])])
