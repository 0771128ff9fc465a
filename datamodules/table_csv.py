"""One CSV file as the table task reads it whole (datamodules/table.py's read_file): checked, parsed, and typed where
the format allows.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path FILE.csv \\
        --data.init_args.label COLUMN

pandas' parser reads the cells as they always were (quoting, blank lines, MISSING's spellings missing), but into
Arrow strings, a few bytes a cell rather than a Python object each. Then a column whose every given cell is the text
Python writes for its number (`3`, `-0.25`, `1e-05`, `2.0`) becomes that number column: int64 (Int64 where cells are
missing) or float64; any other stays text (object, missing cells NaN) as before. A CSV's rows are hashed from those
texts (`row_hashes`), so its split and digests do not change. A column of `3` and `3.5`, or of `3.50`, stays text (a
float writes 3.0 and 3.5); so does one of whole numbers holding both `0.0` and `-0.0` (one number, two texts, which
would count as one distinct value).
"""

from __future__ import annotations

import csv
import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from datamodules.errors import DataError
from datamodules.preprocessing import table as preprocessing
from datamodules.preprocessing.csv_files import check_csv_layout, drop_blank_rows, not_utf8
from datamodules.row_hash import frame_categorical, hashes


def read_csv_file(path: str, data: bytes, delimiter: str):
    """The CSV file at `path` (its bytes `data`, cells separated by `delimiter`) as a DataFrame, typed where the
    format allows, and a function naming its rows by their line."""
    if what := not_utf8(data[:4]):
        raise DataError(f"{path}: {what}")
    try:  # from the bytes, decoded as read: a StringIO of the whole text takes four bytes a character
        reader = csv.reader(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", newline=""), delimiter=delimiter)
        header, header_line, _ = check_csv_layout(reader, path)  # any column named twice: the line below
        if not header:
            raise DataError(f"{path}: empty; give a table whose first line names its columns")
        names = [name.strip() for name in header]
        if twice := next((name for name in names if names.count(name) > 1), None):
            raise DataError(f"{path}: column {twice!r} is named {names.count(twice)} times; give each column one name")
        frame = pd.read_csv(io.BytesIO(data), encoding="utf-8-sig", sep=delimiter, dtype="string[pyarrow]",
                            keep_default_na=False,
                            na_values=preprocessing.MISSING, index_col=False, usecols=range(len(header)),
                            skip_blank_lines=False, skiprows=header_line - 1)  # fmt: skip
    except (pd.errors.ParserError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"{path}: not a readable CSV ({str(error).strip().splitlines()[0]})") from None
    frame = pd.DataFrame({name: typed(frame.pop(column)) for name, column in zip(names, list(frame.columns))})
    frame = drop_blank_rows(frame, header_line)  # row i is line i + 2
    lines = frame.index.to_numpy()
    return frame.reset_index(drop=True), lambda index: f"line {int(lines[index]) + 2}"


def typed(column: pd.Series) -> pd.Series:
    """`column` (Arrow strings, missing cells NA) as numbers where each given cell's text is its number's own (the
    module docstring), else as text: an object column, missing cells NaN."""
    text = pd.Series(column.to_numpy(dtype=object, na_value=np.nan), index=column.index)
    values = pa.array(column)
    if values.null_count == len(values):
        return text
    for kind in (pa.int64(), pa.float64()):
        try:
            numbers = pc.cast(values, kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        missing_ints = kind == pa.int64() and numbers.null_count
        candidate = numbers.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get if missing_ints else None)
        given = text.notna().to_numpy()
        if [str(number) for number in candidate[given].tolist()] != text[given].tolist():
            return text
        # `0.0` and `-0.0`, one number of two texts: counted once, a column of whole numbers could be read as one value
        # or lose being an ID (preprocessing/table.py's describe_column); any other column is described alike.
        found = candidate[given].to_numpy(dtype=np.float64)
        whole = bool(np.all(found[np.isfinite(found)] % 1 == 0))
        if whole and candidate.nunique() != text.nunique():
            return text
        return candidate.set_axis(column.index)
    return text


def as_text(column: pd.Series) -> pd.Series:
    """A typed column back to its cells' text (object, missing cells NaN): the text each number was read from."""
    return pd.Series([np.nan if pd.isna(value) else str(value) for value in column.astype(object).tolist()],
                     index=column.index, name=column.name, dtype=object)  # fmt: skip


def categories_as_text(frame: pd.DataFrame, state: dict) -> pd.DataFrame:
    """`frame` (read from a CSV) with its typed columns that `state` reads as categories back as their text: `1.0`
    is the category `1.0` (as a number, preprocessing's as_text names it `1`), as when every cell was text. Another
    file's column, all numbers, where the training table's was not (rows to predict, test_path)."""
    categorical = [column["name"] for column in state["columns"] if column["kind"] == "categorical"]
    typed = [name for name in categorical if name in frame.columns and frame[name].dtype.kind in "fiu"]
    return frame.assign(**{name: as_text(frame[name]) for name in typed}) if typed else frame


def same_kinds(frames: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """CSV files read one by one (datamodules/table_sources.py), each column of one type in all: a column typed in
    one file and not in another (`3` here, `3.5` there) is text in all, as one file of both would be."""
    mixed = [name for name in frames[0].columns if len({str(frame[name].dtype) for frame in frames}) > 1]
    return [frame.assign(**{name: as_text(frame[name]) for name in mixed}) for frame in frames]


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


def row_hashes(frame: pd.DataFrame, from_text: bool) -> np.ndarray:
    """base.row_hashes of `frame`, its numbers (typed from a CSV's text: `from_text`) hashed as that text, each
    distinct number's text made once (`text_categorical`): as the frame of text cells hashed. A number's text is its
    own (the module docstring), but `0.0` and `-0.0` are one value to pandas' hashing of numbers."""
    numbers = {name for name, kind in frame.dtypes.items() if from_text and kind.kind in "fiu"}
    return hashes([
        text_categorical(pa.array(frame[name], from_pandas=True)) if name in numbers else frame_categorical(frame[name])
        for name in frame.columns
    ])  # fmt: skip
