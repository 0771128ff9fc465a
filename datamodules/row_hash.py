"""Rows' 64-bit hashes, the one implementation every table's split and digests come from (datamodules/base.py's
`row_hashes` of a frame in memory, datamodules/table_stream_hash.py's of a streamed row group's Arrow columns).

    .venv/bin/python -m pytest -q tests/test_row_hash.py tests/test_table_stream_hash.py

A row's hash is pandas' `hash_pandas_object` of its cells as Python objects (missing ones None), as it has always
been: pandas factorises each object column into its distinct values and hashes those once, as a categorical. Its
first try hashes them as text and, on a number, raises TypeError without freeing two arrays (pandas 2.3: 16 bytes a
distinct value, docs/measured.md), then hashes their `astype(str)`. Here each column becomes that categorical first
(`categorical`), its distinct values already as the text pandas falls back to, so pandas' own hashing of it succeeds
at once: the same hashes, nothing leaked. A CSV's numbers (datamodules/table_csv.py types them) hash as the text they
were read from (`text_categorical`): a number's text is its own there, and `0.0` and `-0.0` stay two values.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


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


def text_categorical(numbers: pa.Array | pa.ChunkedArray, whole: bool = False) -> pd.Categorical:
    """A column of numbers read from a CSV's text as the categorical of that text (missing cells -1): each distinct
    number's Python text, which for these numbers is the text they were read from (numpy's str of a float64 is
    Python's). `whole`: read as whole numbers (their text `3`, though given as floats)."""
    if isinstance(numbers, pa.ChunkedArray):
        numbers = numbers.combine_chunks() if numbers.num_chunks != 1 else numbers.chunk(0)
    if whole and pa.types.is_floating(numbers.type):  # whole numbers made floats (missing cells, as pandas does)
        numbers = numbers.cast(pa.int64())
    encoded = pc.dictionary_encode(numbers)  # 0.0 and -0.0 two values, as their texts are
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    texts = encoded.dictionary.to_numpy(zero_copy_only=False).astype(str).astype(object)
    return pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(pd.Index(texts, dtype=object), ordered=False))


def hashes(columns: list[pd.Categorical]) -> np.ndarray:
    """One hash per row of its cells in `columns` (each a column's `categorical`), as pandas combines them."""
    frame = pd.DataFrame(dict(enumerate(columns)))
    return pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)


def frame_hashes(frame: pd.DataFrame, texts: set | frozenset = frozenset()) -> np.ndarray:
    """One hash per row of `frame`, of its cells in its column order; `texts`: its columns of numbers read from a
    CSV's text, hashed as that text."""
    columns = [
        text_categorical(pa.array(frame.iloc[:, index], from_pandas=True))
        if name in texts
        else frame_categorical(frame.iloc[:, index])
        for index, name in enumerate(frame.columns)
    ]
    return hashes(columns)
