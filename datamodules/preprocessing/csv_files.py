"""A user's CSV file checked and read as predict, the table task and the scoring script read it (its columns
separated by commas, UTF-8, no row longer than its header, rows named by their own line), so that a file refused by
one is refused alike by the others. Torch-free (numpy, pandas, datamodules.errors): the registered model ships it, and
scripts/score.py loads it by its path. Loaded only when a CSV file is read, not for PyPI's palmerpenguins.

    python -m scripts.train predict --config configs/penguins.yaml --ckpt_path CKPT --data.predict_path new.csv
"""

from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Collection
from pathlib import Path

import numpy as np

from datamodules.errors import DataError

SAVE_AS = 'save it as a comma-separated CSV in UTF-8 (a spreadsheet\'s "CSV UTF-8 (Comma delimited)")'


def not_utf8(start: bytes) -> str | None:
    """What a CSV that is not UTF-8 is, by its first bytes, and the fix (None: no telling): a spreadsheet's "Unicode
    Text" (UTF-16) or its workbook itself (a zip); the decoder's own reason ('invalid start byte') tells neither."""
    if start[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16's byte order mark
        return f"UTF-16 text, not UTF-8; {SAVE_AS}"
    # Without a byte order mark, a header's letters in UTF-16 are each one byte beside a NUL: valid UTF-8 bytes, read
    # as a header of none of the columns ("missing columns") unless told by the NULs' places.
    if len(start) >= 4 and start[1::2] == b"\x00" * len(start[1::2]) and b"\x00" not in start[0::2]:
        return f"UTF-16LE text (without a byte order mark), not UTF-8; {SAVE_AS}"
    if len(start) >= 4 and start[0::2] == b"\x00" * len(start[0::2]) and b"\x00" not in start[1::2]:
        return f"UTF-16BE text (without a byte order mark), not UTF-8; {SAVE_AS}"
    if start[:4] == b"PK\x03\x04":  # a zip: an Excel workbook (.xlsx) itself, most likely
        return f"a zip archive (an Excel workbook?), not a CSV; {SAVE_AS}"
    return None


def check_csv_layout(reader, where: str, model_columns: Collection[str] = ()) -> tuple[list[str], int, int]:
    """The header of a CSV (`reader`: a csv.reader of it), the line it is on (the first not blank; 0 for none) and
    how many rows follow it (blank ones not counted). Refuses, as DataError naming `where`:
    - a header of one column holding semicolons (a spreadsheet in a language whose decimal mark is a comma), tabs or
      '|': read as one column, it was refused as missing the columns it names;
    - a column the model reads (`model_columns`) named twice: pandas renamed the second `BodyMass.1`, and the first
      was read without a word, whichever the user meant;
    - a row with more values than the header names (`5,000` for 5000, or a stray value): pandas would take the first
      field of every row as its index and shift the rest one column left. Empty fields past the header's are a
      spreadsheet's trailing commas, and fine; the header's own are dropped from it.
    Lines are the file's own (reader.line_num), blank lines counted."""
    header = next((record for record in reader if any(cell.strip() for cell in record)), [])  # not blank
    header_line = reader.line_num
    while header and not header[-1].strip():  # a trailing comma on the header too
        header = header[:-1]
    separator = next((s for s in ";\t|" if len(header) == 1 and s in header[0]), None)
    if separator is not None:  # a spreadsheet set to another language's list separator
        raise DataError(f"{where}: its columns are separated by {separator!r}, not commas; {SAVE_AS}")
    names = [name.lstrip("\ufeff").strip() for name in header]  # as penguin_table matches them
    if twice := next((name for name in names if name in model_columns and names.count(name) > 1), None):
        where_named = " and ".join(str(i + 1) for i, name in enumerate(names) if name == twice)
        raise DataError(
            f"{where}: column {twice} is named {names.count(twice)} times (columns {where_named}); keep one, or "
            "rename the others"
        )
    rows = 0
    for record in reader:
        # The cells past the header's, looked at only in a row that has any: a batch file has many rows.
        extra = [cell for cell in record[len(header) :] if cell.strip()] if len(record) > len(header) else []
        if header and extra:
            listed = ", ".join(name.lstrip("\ufeff") for name in header)
            raise DataError(
                f"{where}: line {reader.line_num} has {len(header) + len(extra)} values, the header names "
                f"{len(header)} columns ({listed}); remove the extra values (a thousands separator: 5000, not 5,000) "
                "or name their columns"
            )
        rows += bool("".join(record).strip())  # not blank: some cell has more than spaces
    return header, header_line, rows


def drop_blank_rows(frame, header_line: int):
    """`frame` (a CSV read by pandas from its header's line, blank lines kept as rows) less its rows of nothing
    (blank, spaces, or commas only), indexed so that row i is line i + 2 of the file: pandas' own skipping of blank
    lines numbered the rows after one a line too early, and predict and the scoring script named the wrong line."""
    blank = np.ones(len(frame), dtype=bool)
    for _, column in frame.items():  # column by column, not a Python call per cell: a batch CSV has many
        values = column.to_numpy()
        if values.dtype == object:  # missing (NaN, not equal to itself) or text of spaces
            blank &= (values != values) | (column.astype(str).str.strip() == "").to_numpy()
        else:  # numbers: blank only where missing
            blank &= column.isna().to_numpy()
    return frame.set_axis(frame.index + header_line - 1)[~blank]


def read_csv(path: str | Path, na_values: list[str], model_columns: Collection[str]):
    """The CSV file at `path` as a pandas DataFrame of the header's columns, checked (`check_csv_layout`), less its
    blank rows: row i is line i + 2 of the file."""
    import pandas as pd

    where, data = str(path), Path(path).read_bytes()  # read once: the layout checks and pandas read these bytes
    if what := not_utf8(data[:4]):
        raise DataError(f"{where}: {what}")
    # Decoded as it is read, as the file was: a layout mistake before a byte that is not UTF-8 is still the one named.
    with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="") as file:
        try:
            header, header_line, _ = check_csv_layout(csv.reader(file), where, model_columns)
            columns, header_line = len(header), max(header_line, 1)
        except (csv.Error, UnicodeDecodeError):
            columns, header_line = None, 1  # not a CSV of text: pandas says what is wrong
    try:
        # Only the header's columns: a row's empty fields past them (a spreadsheet's trailing commas) are dropped,
        # rather than its first field taken as the row's index; pandas' warning of it is no news (checked).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pd.errors.ParserWarning)
            frame = pd.read_csv(io.BytesIO(data), keep_default_na=False, na_values=na_values, index_col=False,
                                usecols=range(columns) if columns else None, skip_blank_lines=False,
                                skiprows=header_line - 1)  # fmt: skip
        return drop_blank_rows(frame, header_line)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as error:
        raise DataError(f"{where}: not a readable CSV ({str(error).strip()})") from None
