"""The one pass over a streamed table (datamodules/table_stream.py says what it gives and why): row group by row group,
each row's split written to disk, the label's values, the digests' sums and the training sample, in memory that does
not grow with the rows.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path lake/big/ \\
        --data.init_args.label outcome --data.init_args.memory_budget_mb 256
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import torch

from datamodules import base
from datamodules.errors import DataError
from datamodules.preprocessing import table as preprocessing
from datamodules.table_stream_batches import CODES
from datamodules.table_stream_hash import pandas_integers, row_hashes

SAMPLE_ROWS = 100_000  # training rows that decide column kinds and statistics: a few seconds, tens of MB
MOST_LABELS = 100_000  # distinct label values past which the label is no class (an ID or a measurement)
SAMPLE_SALT = np.uint64(0x5A3C9E1B7D246F81)  # the sample's order: the rows' hashes mixed with it
XOR_SALT = np.uint64(0x2545F4914F6CDD1D)


class Digests:
    """Per split and for all rows: the count, sum (mod 2**64) and xor of the rows' mixed hashes (order-free)."""

    def __init__(self) -> None:
        self.parts = {name: [0, np.uint64(0), np.uint64(0)] for name in (*CODES, "all")}

    def add(self, name: str, hashes: np.ndarray) -> None:
        part = self.parts[name]
        mixed = base.mixed(hashes)
        part[0] += len(hashes)
        part[1] = np.add.reduce(mixed, initial=part[1], dtype=np.uint64)
        part[2] = np.bitwise_xor.reduce(base.mixed(hashes ^ XOR_SALT), initial=part[2])

    def digests(self) -> dict[str, str]:
        import hashlib

        return {name: hashlib.sha256(f"{rows}:{total}:{xor}".encode()).hexdigest()[:16]
                for name, (rows, total, xor) in self.parts.items()}  # fmt: skip


def row_name(unit, index: int) -> str:
    """Row `index` of a row-group fragment, named by its file and its row there (`part-0.parquet row 7`)."""
    group = unit.row_groups[0].id
    before = sum(unit.metadata.row_group(i).num_rows for i in range(group))
    return f"{Path(unit.path).name} row {before + index + 1}"


def label_texts(values: pa.ChunkedArray, unit, where: str, label: str) -> dict:
    """The distinct label values of a row group and each one's text (preprocessing.as_text); an empty one is a
    DataError naming its first row."""
    uniques = pc.unique(values)
    texts = dict(zip(uniques.to_pylist(), preprocessing.as_text(pd.Series(uniques.to_pylist(), dtype=object))))
    empty = [value for value, text in texts.items() if text is None]
    if empty:
        missing = pc.is_in(values, value_set=pa.array(empty, values.type)).to_numpy(zero_copy_only=False)
        missing |= values.is_null().to_numpy(zero_copy_only=False)
        raise DataError(f"{where}: label column {label!r} is empty on {row_name(unit, int(missing.argmax()))}; fill in "
                        "those rows' classes or remove them")  # fmt: skip
    return texts


def class_names_of(texts: set[str], where: str, label: str) -> tuple[dict[str, str], list[str]]:
    """Each label text's class name, and the class names, as preprocessing/table.py's class_labels names them."""
    ordered = sorted(texts)
    numbers, bad = preprocessing.as_numbers(pd.Series(ordered, dtype=object))
    names = dict(zip(ordered, ordered))
    if ordered and not bad.any():
        if not np.all(numbers % 1 == 0):
            raise DataError(f"{where}: label column {label!r} holds numbers that are not whole; a classifier needs "
                            "classes (names or whole numbers): is it a measurement rather than the label?")  # fmt: skip
        names = {text: str(int(number)) if "." in text else text for text, number in zip(ordered, numbers)}
        return names, sorted(set(names.values()), key=float)
    return names, sorted(set(names.values()))


class Sample:
    """The training rows of the SAMPLE_ROWS smallest keys seen so far (a frame), in memory of that many rows."""

    def __init__(self) -> None:
        self.frame, self.keys = None, np.zeros(0, dtype=np.uint64)

    def add(self, frame: pd.DataFrame, hashes: np.ndarray) -> None:
        keys = np.concatenate([self.keys, base.mixed(hashes ^ SAMPLE_SALT)])
        frame = frame if self.frame is None else pd.concat([self.frame, frame], ignore_index=True)
        if len(keys) > SAMPLE_ROWS:
            kept = np.sort(np.argpartition(keys, SAMPLE_ROWS)[:SAMPLE_ROWS])
            frame, keys = frame.iloc[kept].reset_index(drop=True), keys[kept]
        self.frame, self.keys = frame, keys


def scan_table(dataset: ds.Dataset, units: list, columns: list[str], label: str, rule: dict, codes: Path, where: str,
               floats: set[str]) -> dict:  # fmt: skip
    """The pass over `units` (row groups of `dataset`), reading `columns` (integer ones of `floats` as float, as pandas
    reads them whole), split by `rule`; each unit's split codes written to `codes`/<index>.npy."""
    texts: dict = {}
    counts, digests, sample = [], Digests(), Sample()
    content_only = rule["columns"] == columns
    for index, unit in enumerate(units):
        table = unit.to_table(schema=dataset.schema, columns=columns)
        for name in floats:
            table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(pa.float64()))
        texts.update(label_texts(table.column(label), unit, where, label))
        if len(texts) > MOST_LABELS:
            raise DataError(
                f"{where}: label column {label!r} has more than {MOST_LABELS} values; a classifier needs "
                "several rows of each class: give the column of each row's class as data.init_args.label"
            )
        integers = pandas_integers(table.schema)
        hashes = row_hashes(table.select(rule["columns"]), integers)
        content = hashes if content_only else row_hashes(table, integers)
        parts = base.split_rows(rule, hashes, torch.zeros(len(hashes), dtype=torch.long))
        split = np.zeros(len(hashes), dtype=np.uint8)
        for name, rows in zip(CODES, parts):
            split[rows.numpy()] = CODES[name]
            digests.add(name, content[rows.numpy()])
        digests.add("all", content)
        np.save(codes / f"{index}.npy", split)
        counts.append({name: int((split == code).sum()) for name, code in CODES.items()})
        training = split == CODES["train"]
        sample.add(table.to_pandas()[training].reset_index(drop=True), content[training])
    names, classes = class_names_of({text for text in texts.values()}, where, label)
    values = list(texts)
    return {"classes": classes, "label_values": pa.array(values, dataset.schema.field(label).type),
            "label_names": [names[texts[value]] for value in values], "counts": counts,
            "digests": digests.digests(), "sample": sample.frame, "columns": columns}  # fmt: skip
