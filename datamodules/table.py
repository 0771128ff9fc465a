"""Any table: a CSV or Parquet file (or an Azure ML MLTable folder naming one) and the name of its label column.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path FILE --data.init_args.label COLUMN

The split is a rule on rows, made before anything is learnt (70/15/15 by default): a seeded hash of each row's cells,
or of its `id_column`'s, decides its split (datamodules/base.py), so editing or appending rows moves no other row
into training; the rule, the content's digest and the schema are kept in every checkpoint. Which columns are numbers,
dates and categories, the missing-cell policy, the scaling statistics and the columns left out (IDs, constants, free
text, those of data.init_args.drop: each column's kind printed once on stderr and kept as the run's `columns.json`)
come from the training split alone (datamodules/preprocessing/table.py), are kept in every checkpoint and in
the registered model, and decide the network's input width (TableNet's lazy first layer takes it from the first batch:
lightning_modules/classifier.py). Class names are the label column's values, sorted (whole
numbers by value).
"""

from __future__ import annotations

import io
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from datamodules import base, table_csv
from datamodules.base import InMemoryDataModule, check_fractions, say_copies
from datamodules.errors import DataError
from datamodules.preprocessing import table as preprocessing

CSV_SUFFIXES = {".csv": ",", ".tsv": "\t", ".txt": ","}  # and the delimiter each means
PARQUET_SUFFIXES = (".parquet", ".pq")
# The in-memory fit's peak RSS past the ~1.1 GB a process's imports take, measured as about these bytes a Parquet cell
# (rows x columns, from its footer) and a CSV byte (its cells read as text: what a CSV of text columns still takes)
# (docs/measured.md, 2026-11-29).
PARQUET_CELL_BYTES, CSV_BYTE_BYTES = 70, 15
FILE_KINDS = (
    "a CSV (.csv, .tsv) or Parquet (.parquet) file, a folder or glob of them, "
    "an MLTable folder or a Delta table's folder"
)


def read_table(path: str, option: str):
    """The table at `path` as a DataFrame (a CSV's cells typed where their text allows: datamodules/table_csv.py,
    missing cells None or NaN) and a function naming its rows in messages ("line 7" of a CSV, "row 6" of a Parquet
    file): one file here, a folder, glob, MLTable or Delta table of many through datamodules/table_sources.py."""
    source = Path(path)
    if source.is_dir() or (not source.exists() and any(character in path for character in "*?[")):
        from datamodules.table_sources import read_source

        return read_source(path, option, read_file)
    if not source.exists():
        raise DataError(f"{path}: no such file or folder; give data.init_args.{option} {FILE_KINDS}")
    if source.suffix.lower() in CSV_SUFFIXES:
        return read_file(path, CSV_SUFFIXES[source.suffix.lower()])
    if source.suffix.lower() in PARQUET_SUFFIXES or source.read_bytes()[:4] == b"PAR1":
        return read_file(path, None)
    raise DataError(f"{path}: not a CSV or Parquet file (by its name and first bytes); give {FILE_KINDS}")


def in_memory_mb(path: str) -> float:
    """The in-memory read's estimated peak (MB) of the table at `path` (a file, folder, glob, MLTable or Delta table:
    the files it holds now), from their sizes and Parquet footers, none read; 0 for what is not there (the read says
    what is wrong)."""
    import pyarrow.parquet as pq

    if Path(path).is_file():  # one file, as most tables are: without table_sources.py
        files, delimiter, partitions = [Path(path)], CSV_SUFFIXES.get(Path(path).suffix.lower()), {}
    else:
        from datamodules.table_sources import table_files

        try:
            found = table_files(path)
        except DataError:
            return 0.0
        files, delimiter, partitions = found.files, found.delimiter, found.partitions
    total = 0
    for file in files:
        if delimiter is not None:
            total += file.stat().st_size * CSV_BYTE_BYTES
            continue
        try:
            metadata = pq.read_metadata(file)
        except Exception:  # pyarrow's many types: the in-memory read names what is wrong with the file
            continue
        columns = metadata.num_columns + len(partitions.get(file, {}))  # a Delta file's partition columns too
        total += metadata.num_rows * columns * PARQUET_CELL_BYTES
    return total / 2**20


def read_file(path: str, delimiter: str | None):
    """One CSV file (cells separated by `delimiter`) or Parquet file (None) and a function naming its rows."""
    import pandas as pd

    data = Path(path).read_bytes()
    if delimiter is None:
        try:
            frame = pd.read_parquet(io.BytesIO(data))
        except Exception as error:  # pyarrow's many types
            raise DataError(f"{path}: not a readable Parquet file ({str(error).strip().splitlines()[0]})") from None
        return frame.reset_index(drop=True), lambda index: f"row {index + 1}"
    return table_csv.read_csv_file(path, data, delimiter)


def read_as_text(path: str) -> bool:
    """Whether the table at `path` is of CSV files, its numbers typed from their text (datamodules/table_csv.py)."""
    if Path(path).is_file():
        return Path(path).suffix.lower() in CSV_SUFFIXES
    from datamodules.table_sources import table_files

    try:
        return table_files(path).delimiter is not None
    except DataError:
        return False


def holds_many(value) -> bool:
    """Whether a cell holds several values (a list, an array, a dict: Parquet's nested types)."""
    return hasattr(value, "__len__") and not isinstance(value, str | bytes)


class TableDataModule(InMemoryDataModule):
    """
    Args:
        csv_path: the table: a CSV (.csv, .tsv) or Parquet file, or a folder holding an MLTable file (an Azure ML data
            asset mounted as a folder) whose paths name one.
        label: the column holding each row's class; every other column is a candidate feature.
        drop: columns to leave out of the features (a date the model should not learn from, a leaky column).
        predict_path: a CSV or Parquet file of rows to classify (the label column not needed).
        classes: class names in index order; None: the label column's values, sorted (whole numbers by value). At
            validate, test and predict the checkpoint's (then predict needs no training data).
        batch_size: rows per step and process.
        val_fraction, test_fraction: the shares of rows held out (each class's, on average), before anything is learnt.
        seed: the split's seed; every process computes the same split.
        id_column: a column naming each row (not learnt from): its value alone decides the row's split, so rows of
            one id share a split and editing a row's cells never moves it; None: the row's cells decide.
        test_path: a table of its own to test on, all of its rows (of csv_path's columns): csv_path then gives
            training and validation rows alone (test_fraction is not used). What a DataFrame split with randomSplit
            gives (scripts/spark/dataframes.py). Streamed past memory_budget_mb, or where csv_path is.
        memory_budget_mb: past this estimate of the in-memory read's peak (`in_memory_mb`: sizes and Parquet footers,
            before reading), the table streams (datamodules/table_stream.py) in memory that does not grow with its
            rows. 2048: a laptop's or small node's share beside the ~1.1 GB torch, Lightning and MLflow take, about
            1,000,000 rows x 30 columns of Parquet or a 140 MB CSV (docs/tasks.md, "Tables bigger than memory").
        num_workers: DataLoader worker processes that read a streamed table's row groups (an in-memory one has none).
    """

    serving_kind = "rows"
    evaluate_in_one_batch = True

    def __init__(
        self,
        csv_path: str | None = None,
        label: str | None = None,
        predict_path: str | None = None,
        classes: list[str] | None = None,
        batch_size: int = 32,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        seed: int = 42,
        drop: list[str] | None = None,
        id_column: str | None = None,
        test_path: str | None = None,
        memory_budget_mb: float = 2048,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed)
        check_fractions(val_fraction, test_fraction)
        if classes is None and (csv_path is None or label is None):
            raise DataError(
                "the table task needs data.init_args.csv_path (a CSV or Parquet file, or an MLTable folder) and "
                "data.init_args.label (the column holding each row's class)"
            )
        self.save_hyperparameters()
        self.state: dict | None = None
        self._table = None
        self.set_aside: dict[str, str] = {}  # column: why it is no feature (data.init_args.drop, lists)
        self.stream = None  # past the budget, what reads the table (datamodules/table_stream.py)
        if csv_path is not None and in_memory_mb(csv_path) > memory_budget_mb:
            from datamodules.table_stream import TableStream

            self.stream = TableStream(self)
        # test_path past the budget, or beside a streamed table: what reads it (datamodules/table_test_path.py)
        self.test_stream = None
        if test_path is not None and (self.stream or in_memory_mb(test_path) > memory_budget_mb):
            from datamodules.table_test_path import StreamedTestPath

            self.test_stream = StreamedTestPath(self)

    def table(self):
        """The training table, its row names, each row's class and the class names: read once."""
        if self._table is None:
            path, label = self.hparams.csv_path, self.hparams.label
            if path is None or label is None:  # validate and test (given the checkpoint's classes) read the table
                raise DataError(
                    "give data.init_args.csv_path and data.init_args.label: the table (and its label column) to split "
                    "as the checkpoint's fit did; predict alone needs neither"
                )
            frame, row_name = read_table(path, "csv_path")
            if label not in frame.columns:
                near = [name for name in frame.columns if name.strip().lower() == str(label).strip().lower()]
                hint = f"did you mean {near[0]!r}?" if near else f"its columns: {', '.join(map(str, frame.columns))}"
                raise DataError(f"{path}: no label column {label!r} ({hint}); give data.init_args.label one of them")
            frame = self.set_columns_aside(frame, path, label)
            labels, classes = preprocessing.class_labels(frame[label], path, label, row_name)
            self._table = frame, row_name, labels, classes
        return self._table

    def set_columns_aside(self, frame, path: str, label: str):
        """`frame` less its columns of lists (a Parquet list column: no one value a cell, and unhashable where the
        split looks for copies); those and data.init_args.drop's are named in `set_aside`."""
        self.check_drop(list(map(str, frame.columns)), path, label)
        # A Parquet column's cells are all of its one type: its first given cell tells (a CSV's are all text).
        lists = [column for column in frame.columns if frame[column].dropna().head(1).map(holds_many).any()]
        for column in lists:
            self.set_aside[column] = "lists, not one value a cell (give one number or text a cell to use it)"
        return frame.drop(columns=lists)

    def check_drop(self, columns: list[str], path: str, label: str) -> None:
        """data.init_args.drop's columns, each one of `columns` and not the label, named in `set_aside`."""
        for name in self.hparams.drop or []:
            if name not in columns or name == label:
                what = "the label" if name == label else f"no column {name!r} in {path}"
                raise DataError(
                    f"data.init_args.drop: {what}; give columns of the table to leave out (its columns: "
                    f"{', '.join(repr(column) for column in columns if column != label)})"
                )
            self.set_aside[name] = "data.init_args.drop names it"

    @property
    def class_names(self) -> list[str]:
        if self.hparams.classes is not None:
            return list(self.hparams.classes)
        return self.stream.class_names() if self.stream else self.table()[3]

    def setup(self, stage: str) -> None:
        predicting_alone = stage == "predict" and self.hparams.classes is not None
        if (
            not predicting_alone and "train" not in self.splits and not (self.stream and self.state)
        ):  # streamed: no splits
            self.split()
        if stage == "predict":
            if self.hparams.predict_path is None:
                raise DataError("predict needs data.init_args.predict_path: a CSV or Parquet file of rows")
            frame, row_name = read_table(self.hparams.predict_path, "predict_path")
            if frame.empty:
                raise DataError(f"{self.hparams.predict_path}: no rows; give rows to classify")
            self.predict_frame = frame
            self.predict_names = [row_name(i) for i in range(len(frame))]

    def split(self, rule: dict | None = None) -> None:
        """The split by `rule` (a checkpoint's; None: this config's), the training split's column state, each split's
        features by it, and the data's identity."""
        if self.stream:
            return self.stream.split(rule)
        frame, row_name, labels, classes = self.table()
        where, label, id_column = self.hparams.csv_path, self.hparams.label, self.hparams.id_column
        index = {name: i for i, name in enumerate(self.class_names)}
        unknown = next((name for name in labels if name not in index), None)
        if unknown is not None:
            raise DataError(
                f"{where}: label {unknown!r} is not one of the checkpoint's classes {self.class_names}; give the data "
                "it was trained on"
            )
        if id_column is not None and id_column not in frame.columns:
            raise DataError(f"{where}: no column {id_column!r}; give data.init_args.id_column one of its columns")
        targets = torch.tensor([index[name] for name in labels], dtype=torch.long)
        keys = [id_column] if id_column is not None else list(frame.columns)
        test_fraction = 0.0 if self.hparams.test_path else self.hparams.test_fraction
        rule = rule or base.split_rule(self.seed, self.hparams.val_fraction, test_fraction, keys, id_column)
        if absent := [column for column in rule["columns"] if column not in frame.columns]:
            raise DataError(
                f"{where}: no column {absent[0]!r}, which the checkpoint's split was made by (it hashed "
                f"{', '.join(map(repr, rule['columns']))}); give the table it was trained on"
            )
        text = read_as_text(where)  # a CSV's numbers hash as their text (datamodules/table_csv.py)
        hashes = table_csv.row_hashes(frame[rule["columns"]], text)
        content = hashes if rule["columns"] == list(frame.columns) else table_csv.row_hashes(frame, text)
        say_copies(len(content) - len(np.unique(content)), where, self.trainer)
        rows = base.split_rows(rule, hashes, targets)
        self.raw = {
            name: (frame.iloc[part.numpy()], [row_name(int(i)) for i in part], targets[part])
            for name, part in zip(base.SPLITS, rows)
        }
        if self.test_stream:
            del self.raw["test"]  # test_path's rows, streamed
        elif self.hparams.test_path:
            self.raw["test"] = self.test_table(list(frame.columns), index)
        if len(classes) * 2 > len(frame):  # more classes than half the rows: an ID or a measurement as the label
            raise DataError(
                f"{self.hparams.csv_path}: label column {self.hparams.label!r} has {len(classes)} classes in "
                f"{len(frame)} rows ({sum(n == 1 for n in Counter(labels).values())} of one row); a classifier "
                "needs several rows of each class: give the column of each row's class as data.init_args.label"
            )
        if "test" in self.raw and len(self.raw["test"][2]) == 0:
            raise DataError(
                f"{where}: {len(frame)} rows leave no test rows at test_fraction {self.hparams.test_fraction}; give "
                "more rows or a larger data.init_args.test_fraction"
            )
        train = self.raw["train"][0].drop(columns=[rule["id_column"]] if rule["id_column"] else [])  # not learnt
        self.state = preprocessing.describe_columns(train, label, where, self.set_aside)
        unreadable = self.featurise()
        if self.trainer is None or self.trainer.is_global_zero:
            print("\n".join(preprocessing.column_lines(where, self.state, unreadable)), file=sys.stderr)
        schema = {column: "left out" for column in frame.columns} | {label: "label"}
        schema |= {column["name"]: column["kind"] for column in self.state["columns"]}
        self.identity = base.data_identity(str(where), content, hashes, rule, schema, rows)
        if self.test_stream:
            self.identity["splits"]["test"] = self.test_stream.identity(list(frame.columns))
        elif self.hparams.test_path:
            test_rows = table_csv.row_hashes(self.raw["test"][0], read_as_text(self.hparams.test_path))
            self.identity["splits"]["test"] = {"digest": base.digest(test_rows), "rows": len(test_rows),
                                               "source": str(self.hparams.test_path)}  # fmt: skip

    def test_table(self, columns: list[str], index: dict[str, int]) -> tuple:
        """test_path's rows, in the training table's columns: (frame, row names, targets)."""
        path, label = self.hparams.test_path, self.hparams.label
        frame, row_name = read_table(path, "test_path")
        if absent := [column for column in columns if column not in frame.columns]:
            raise DataError(f"{path}: no column {absent[0]!r} of {self.hparams.csv_path}; give "
                            "data.init_args.test_path a table of the training table's columns")  # fmt: skip
        labels, _ = preprocessing.class_labels(frame[label], path, label, row_name)
        if unknown := next((name for name in labels if name not in index), None):
            raise DataError(f"{path}: label {unknown!r} is no class of {self.hparams.csv_path} ({', '.join(index)}); "
                            "give test rows of the training table's classes")  # fmt: skip
        targets = torch.tensor([index[name] for name in labels], dtype=torch.long)
        return frame[columns], [row_name(i) for i in range(len(frame))], targets

    def resplit(self, rule: dict) -> None:
        """The split by a checkpoint's rule (datamodules/split_check.py); its column state follows at load."""
        self.split(rule)

    def featurise(self) -> list[tuple[str, str, object]]:
        """Each split's network inputs from its raw rows and the state (the checkpoint's, once restored). A numeric or
        date column's cells that are none (the few the state tolerates, `inf`) are read as missing: returned as (row,
        column, value)."""
        self.splits, unreadable = {}, []
        for name, (frame, names, targets) in getattr(self, "raw", {}).items():
            cells = preprocessing.unreadable_cells(self.state, frame)
            if cells:
                frame = frame.copy()
                for column, bad in cells.items():
                    unreadable += [(names[i], column, frame[column].iloc[i]) for i in bad.nonzero()[0]]
                    frame[column] = frame[column].where(~bad, None)
            where = self.hparams.test_path if name == "test" and self.hparams.test_path else self.hparams.csv_path
            self.splits[name] = (self.features(frame, names, where), targets)
        return unreadable

    def features(self, frame, names: list[str], where: str, say_unseen: bool = False) -> torch.Tensor:
        if read_as_text(where):  # a CSV's numbers in a column of categories are the text they were written as
            frame = table_csv.categories_as_text(frame, self.state)
        return torch.from_numpy(preprocessing.serving_batch(self.state, frame, names, where, say_unseen))

    def load_state_dict(self, state: dict) -> None:
        # After setup, before the dataloaders: the inputs become what the checkpoint's network was trained on.
        super().load_state_dict(state)
        if state.get("serving"):
            self.state = state["serving"]
            self.featurise()

    def batches(self, split: str, shuffle: bool = False):
        if self.test_stream and split == "test":
            return self.test_stream.loader()
        if self.stream and split != "predict":  # the rows to predict are read whole
            return self.stream.loader(split)
        return super().batches(split, shuffle)

    def predict_dataloader(self):
        where = self.hparams.predict_path
        self.splits["predict"] = (self.features(self.predict_frame, self.predict_names, where, say_unseen=True),)
        return super().predict_dataloader()

    def serving_state(self) -> dict:
        return self.state or {}

    serving_preprocess = staticmethod(preprocessing.serving_batch)

    def trained_state(self) -> dict:
        state = getattr(self, "checkpoint_serving_state", None) or self.state
        if not state:
            self.split()
            state = self.state
        return state

    def serving_example(self):
        return preprocessing.example_row(self.trained_state())

    def serving_columns(self) -> list[str]:
        return [column["name"] for column in self.trained_state()["columns"]]

    def serving_column_kinds(self) -> dict[str, str]:
        return {column["name"]: column["kind"] for column in self.trained_state()["columns"]}

    def columns_record(self) -> dict[str, str]:
        """Each column's kind as read, or why it is left out: the run's `columns.json` (scripts/training/run_record)."""
        return preprocessing.describe_kinds(self.state) if self.state else {}
