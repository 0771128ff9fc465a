"""A CSV past data.init_args.memory_budget_mb, copied once into Parquet to be streamed (datamodules/table_stream.py),
typed as the in-memory read types it (datamodules/table_csv.py's `typed`), in memory bounded by pyarrow.csv's blocks.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path big.csv \\
        --data.init_args.label outcome --data.init_args.memory_budget_mb 256

Two passes of pyarrow.csv's streaming reader, every cell read as text (MISSING's spellings missing): the first
decides each column's type by the in-memory rule over the whole file (`TextKind`: a column is numeric only where
every given cell's text is its number's own, so a cell late in the file that is not still makes it text), the second
writes the copy, those columns cast to their numbers. Which columns were typed, and as what pandas makes them in
memory (int64, Int64 where cells are missing, float64), is kept in the copy's schema metadata (`text_kinds`): their
rows still hash as the text they were read from (datamodules/row_hash.py), which for these numbers is their Python
text. Several CSV files of one table (a folder, an MLTable) share each column's type, as `same_kinds` makes them in
memory: a column typed differently in two files is copied as text in all (`csv_copies`). Copies live under the
system's temporary folder (`table-cache/`), said on stderr, reused while the file's size and time are unchanged.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datamodules.errors import DataError
from datamodules.preprocessing import table as preprocessing

ROW_GROUP_ROWS = 65_536  # the unit of work each process and worker reads
KINDS_KEY = b"table_csv.kinds"  # schema metadata: {column: its pandas dtype in memory} for the columns typed
COPY_FORMAT = "typed-1"  # in the cache's key: a copy of another format is not reused


class TextKind:
    """What the in-memory read makes of one CSV column (table_csv.typed), from its text a block of cells at a time."""

    def __init__(self) -> None:
        self.given = self.missing = False
        self.ints = self.ints_own = self.floats = self.floats_own = self.whole = True
        self.zeros: set[bool] = set()  # the signs of its zeros seen (True: -0.0)

    def add(self, text: pa.Array) -> None:
        self.missing |= text.null_count > 0
        given = text.drop_null()
        if len(given) == 0:
            return
        self.given = True
        if self.ints:
            try:
                ints = pc.cast(given, pa.int64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                self.ints = False
            else:
                self.ints_own = self.ints_own and pc.all(pc.equal(pc.cast(ints, pa.string()), given)).as_py()
        if self.floats and self.floats_own:  # later blocks may not be whole numbers: then these decide
            try:
                numbers = pc.cast(given, pa.float64()).to_numpy()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                self.floats = False
                return
            # numpy's str of a float64 is Python's: the text `typed` compares each cell with
            own = pc.equal(pa.array(numbers.astype(str)), given.cast(pa.string()))
            self.floats_own = pc.all(own).as_py()
            self.whole = self.whole and bool(np.all(numbers[np.isfinite(numbers)] % 1 == 0))
            self.zeros |= set(np.signbit(numbers[numbers == 0]).tolist())

    def kind(self) -> str:
        """The column's pandas dtype in memory: int64, Int64 (whole numbers, cells missing), float64, else object
        (text). Whole numbers holding both 0.0 and -0.0 stay text, as in memory (table_csv's module docstring)."""
        if not self.given:
            return "object"
        if self.ints:
            return ("Int64" if self.missing else "int64") if self.ints_own else "object"
        both_zeros = self.whole and self.zeros == {False, True}
        return "float64" if self.floats and self.floats_own and not both_zeros else "object"


def text_kinds(schema: pa.Schema) -> dict[str, str]:
    """A CSV copy's columns typed from text, each with its pandas dtype in memory ({} for any other table)."""
    return json.loads((schema.metadata or {}).get(KINDS_KEY, b"{}"))


def header(path: Path, delimiter: str) -> list[str]:
    with path.open(encoding="utf-8-sig", newline="") as file:
        names = [name.strip() for name in next(csv.reader(file, delimiter=delimiter), [])]
    if twice := next((name for name in names if names.count(name) > 1), None):
        raise DataError(f"{path}: column {twice!r} is named {names.count(twice)} times; give each column one name")
    return names


def text_batches(path: Path, names: list[str], delimiter: str):
    """The CSV's rows after its header, a block at a time, every cell text (MISSING's spellings missing)."""
    import pyarrow.csv as pv

    convert = pv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()), null_values=preprocessing.MISSING,
                                strings_can_be_null=True, quoted_strings_can_be_null=True)  # fmt: skip
    return pv.open_csv(path, read_options=pv.ReadOptions(column_names=names, skip_rows=1),
                       parse_options=pv.ParseOptions(delimiter=delimiter), convert_options=convert)  # fmt: skip


ARROW_TYPES = {"int64": pa.int64(), "Int64": pa.int64(), "float64": pa.float64()}


def csv_as_parquet(path: Path, delimiter: str, as_text: frozenset[str] = frozenset()) -> Path:
    """A Parquet copy of the CSV at `path`, typed (the module docstring) but for the columns of `as_text`, made once
    under the temporary folder and reused while the CSV's size and time are the same."""
    import pyarrow.parquet as pq

    stat = path.stat()
    texts = ",".join(sorted(as_text))
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{delimiter}|{COPY_FORMAT}|{texts}"
    copy = Path(tempfile.gettempdir()) / "table-cache" / hashlib.sha256(key.encode()).hexdigest()[:16]
    copy = copy / f"{path.stem}.parquet"
    if copy.is_file():
        return copy
    print(f"{path}: copied once into Parquet, {copy}, to be streamed", file=sys.stderr)
    names = header(path, delimiter)
    copy.parent.mkdir(parents=True, exist_ok=True)
    partial = copy.with_suffix(f".{os.getpid()}.partial")
    try:
        seen = {name: TextKind() for name in names if name not in as_text}
        for batch in text_batches(path, names, delimiter):
            for name, kind in seen.items():
                kind.add(batch.column(name))
        kinds = {name: kind.kind() for name, kind in seen.items() if kind.kind() != "object"}
        fields = [pa.field(name, ARROW_TYPES[kinds[name]] if name in kinds else pa.string()) for name in names]
        schema = pa.schema(fields, metadata={KINDS_KEY: json.dumps(kinds).encode()})
        with pq.ParquetWriter(partial, schema) as writer:
            held, rows = [], 0  # the reader's blocks (~1 MB each), written ROW_GROUP_ROWS rows a row group
            for batch in text_batches(path, names, delimiter):
                columns = [pc.cast(column, field.type) for column, field in zip(batch.columns, fields)]
                held.append(pa.record_batch(columns, schema=schema))
                rows += batch.num_rows
                if rows >= ROW_GROUP_ROWS:
                    rows = write_groups(writer, held)
            write_groups(writer, held, last=True)
    except pa.ArrowInvalid as error:
        partial.unlink(missing_ok=True)
        raise DataError(f"{path}: not a readable CSV ({str(error).strip().splitlines()[0]})") from None
    os.replace(partial, copy)  # whole or not at all, whichever process finishes first
    return copy


def write_groups(writer, held: list[pa.RecordBatch], last: bool = False) -> int:
    """Writes the whole row groups of `held` (all, if `last`), keeps the rest there; returns the rows kept."""
    table = pa.Table.from_batches(held, schema=writer.schema)
    whole = table.num_rows if last else table.num_rows - table.num_rows % ROW_GROUP_ROWS
    if whole:
        writer.write_table(table.slice(0, whole), row_group_size=ROW_GROUP_ROWS)
    held[:] = table.slice(whole).to_batches()
    return table.num_rows - whole


def csv_copies(files: list[Path], delimiter: str, as_text: frozenset[str] = frozenset()) -> list[Path]:
    """The Parquet copies of one table's CSV files, each column of one type in all (a column typed in one file and
    not alike in another is text in every file, as in memory), those of `as_text` text."""
    import pyarrow.parquet as pq

    copies = [csv_as_parquet(file, delimiter) for file in files]
    kinds = [text_kinds(pq.read_schema(copy)) for copy in copies]
    names = {name for found in kinds for name in found}
    texts = as_text | {name for name in names if len({found.get(name, "object") for found in kinds}) > 1}
    if not texts & names:
        return copies
    return [csv_as_parquet(file, delimiter, frozenset(texts & set(found))) for file, found in zip(files, kinds)]


def categories_typed(state: dict | None, schema: pa.Schema) -> frozenset[str]:
    """The columns `state` reads as categories that a CSV's copy (`schema`) typed as numbers: read as categories,
    their cells are the text written (`1.0`, not the number 1, as table_csv's categories_as_text reads them)."""
    categorical = {column["name"] for column in (state or {}).get("columns", []) if column["kind"] == "categorical"}
    return frozenset(categorical & set(text_kinds(schema)))
