"""Any table: a CSV or Parquet file (or an Azure ML MLTable folder naming one) and the name of its label column.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path FILE --data.init_args.label COLUMN

The split is a rule on rows, made before anything is learnt (70/15/15 by default): a seeded hash of each row's cells,
or of its `id_column`'s, decides its split (datamodules/base.py), so editing or appending rows moves no other row
into training; the rule, the content's digest and the schema are kept in every checkpoint. Which columns are numbers
and which categories, the missing-cell policy, the scaling statistics and the columns left out (IDs, constants: named on
stderr) come from the training split alone (datamodules/preprocessing/table.py), are kept in every checkpoint and in
the registered model, and decide the network's input width (TableNet's lazy first layer takes it from the first batch:
lightning_modules/classifier.py). Class names are the label column's values, sorted (whole
numbers by value).
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import numpy as np
import torch

from datamodules import base
from datamodules.base import InMemoryDataModule, check_fractions, say_copies
from datamodules.errors import DataError
from datamodules.preprocessing import table as preprocessing
from datamodules.preprocessing.csv_files import check_csv_layout, drop_blank_rows, not_utf8
from datamodules.preprocessing.penguins import SCHEMA_COLUMNS

CSV_SUFFIXES = {".csv": ",", ".tsv": "\t", ".txt": ","}
PARQUET_SUFFIXES = (".parquet", ".pq")
FILE_KINDS = "a CSV (.csv, .tsv) or Parquet (.parquet) file, or a folder holding an MLTable file that names one"


def mltable_file(folder: Path) -> tuple[Path, str | None]:
    """The data file an MLTable folder's `MLTable` names (one `file:` path, relative to the folder) and its delimiter
    (None: Parquet)."""
    import yaml

    spec_path = folder / "MLTable"
    if not spec_path.is_file():
        raise DataError(f"{folder}: a folder without an MLTable file; give {FILE_KINDS}")
    try:
        spec = yaml.safe_load(spec_path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise DataError(f"{spec_path}: not readable YAML ({str(error).splitlines()[0]})") from None
    files = [entry.get("file") for entry in spec.get("paths") or [] if isinstance(entry, dict)]
    if len(files) != 1 or not isinstance(files[0], str) or "://" in files[0]:
        raise DataError(
            f"{spec_path}: its paths name {files or 'no file'}; the table task reads an MLTable whose paths are one "
            "`file:` beside it (what `scripts.assets data ... --mltable true` writes)"
        )
    delimiter = ","
    for step in spec.get("transformations") or []:
        if isinstance(step, dict) and "read_parquet" in step:
            delimiter = None
        elif isinstance(step, dict) and isinstance(step.get("read_delimited"), dict):
            delimiter = step["read_delimited"].get("delimiter", ",")
    return (folder / files[0]).resolve(), delimiter


def read_table(path: str, option: str):
    """The file at `path` as a DataFrame (CSV cells as text, missing cells None) and a function naming its rows in
    messages ("line 7" of a CSV, "row 6" of a Parquet file)."""
    import pandas as pd

    source = Path(path)
    if not source.exists():
        raise DataError(f"{path}: no such file or folder; give data.init_args.{option} {FILE_KINDS}")
    delimiter: str | None
    if source.is_dir():
        source, delimiter = mltable_file(source)
        if not source.is_file():
            raise DataError(f"{path}: its MLTable names {source}, which is not there; put the file beside it")
    elif source.suffix.lower() in CSV_SUFFIXES:
        delimiter = CSV_SUFFIXES[source.suffix.lower()]
    elif source.suffix.lower() in PARQUET_SUFFIXES or source.read_bytes()[:4] == b"PAR1":
        delimiter = None
    else:
        raise DataError(f"{path}: not a CSV or Parquet file (by its name and first bytes); give {FILE_KINDS}")
    data = source.read_bytes()
    if delimiter is None:
        try:
            frame = pd.read_parquet(io.BytesIO(data))
        except Exception as error:  # pyarrow's many types
            raise DataError(f"{path}: not a readable Parquet file ({str(error).strip().splitlines()[0]})") from None
        return frame.reset_index(drop=True), lambda index: f"row {index + 1}"
    if what := not_utf8(data[:4]):
        raise DataError(f"{path}: {what}")
    try:
        text = data.decode("utf-8-sig")
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
        header, header_line, _ = check_csv_layout(reader, path, SCHEMA_COLUMNS)  # a penguin column twice, too
        if not header:
            raise DataError(f"{path}: empty; give a table whose first line names its columns")
        names = [name.strip() for name in header]
        if twice := next((name for name in names if names.count(name) > 1), None):
            raise DataError(f"{path}: column {twice!r} is named {names.count(twice)} times; give each column one name")
        frame = pd.read_csv(io.StringIO(text), sep=delimiter, dtype=str, keep_default_na=False,
                            na_values=preprocessing.MISSING, index_col=False, usecols=range(len(header)),
                            skip_blank_lines=False, skiprows=header_line - 1)  # fmt: skip
    except (pd.errors.ParserError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"{path}: not a readable CSV ({str(error).strip().splitlines()[0]})") from None
    frame = frame.set_axis(names, axis=1)
    frame = drop_blank_rows(frame, header_line)  # row i is line i + 2
    lines = frame.index.to_numpy()
    return frame.reset_index(drop=True), lambda index: f"line {int(lines[index]) + 2}"


def class_labels(values, where: str, label: str, row_name) -> tuple[list[str], list[str]]:
    """Each row's class name and the sorted class names (whole numbers sorted by value) of a label column."""
    text = preprocessing.as_text(values)
    if text.isna().any():
        row = int(text.isna().to_numpy().argmax())
        count = int(text.isna().sum())
        raise DataError(
            f"{where}: label column {label!r} is empty on {row_name(row)} ({count} row{'s' * (count > 1)} in all); "
            "fill in those rows' classes or remove them"
        )
    labels = text.tolist()
    classes = sorted(set(labels))
    numbers = preprocessing.as_numbers(text)[0]
    if not preprocessing.as_numbers(text)[1].any():  # every label a number
        if any(not float(number).is_integer() for number in numbers):
            raise DataError(
                f"{where}: label column {label!r} holds numbers that are not whole ({text[(numbers % 1 != 0)].iloc[0]})"
                "; a classifier needs classes (names or whole numbers): is it a measurement rather than the label?"
            )
        classes = sorted(classes, key=float)
    if len(classes) < 2:
        raise DataError(
            f"{where}: every row of label column {label!r} is {classes[0]!r}; a classifier needs rows of two classes "
            "or more"
        )
    return labels, classes


class TableDataModule(InMemoryDataModule):
    """
    Args:
        csv_path: the table: a CSV (.csv, .tsv) or Parquet file, or a folder holding an MLTable file (an Azure ML data
            asset mounted as a folder) whose paths name one.
        label: the column holding each row's class; every other column is a candidate feature.
        predict_path: a CSV or Parquet file of rows to classify (the label column not needed).
        classes: class names in index order; None: the label column's values, sorted (whole numbers by value). At
            validate, test and predict the checkpoint's (then predict needs no training data).
        batch_size: rows per step and process.
        val_fraction, test_fraction: the shares of rows held out (each class's, on average), before anything is learnt.
        seed: the split's seed; every process computes the same split.
        id_column: a column naming each row (not learnt from): its value alone decides the row's split, so rows of
            one id share a split and editing a row's cells never moves it; None: the row's cells decide.
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
        id_column: str | None = None,
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
            labels, classes = class_labels(frame[label], path, label, row_name)
            self._table = frame, row_name, labels, classes
        return self._table

    @property
    def class_names(self) -> list[str]:
        if self.hparams.classes is not None:
            return list(self.hparams.classes)
        return self.table()[3]

    def setup(self, stage: str) -> None:
        predicting_alone = stage == "predict" and self.hparams.classes is not None
        if not predicting_alone and "train" not in self.splits:
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
        rule = rule or base.split_rule(self.seed, self.hparams.val_fraction, self.hparams.test_fraction, keys,
                                            id_column)  # fmt: skip
        if absent := [column for column in rule["columns"] if column not in frame.columns]:
            raise DataError(
                f"{where}: no column {absent[0]!r}, which the checkpoint's split was made by (it hashed "
                f"{', '.join(map(repr, rule['columns']))}); give the table it was trained on"
            )
        hashes = base.row_hashes(frame[rule["columns"]])
        content = hashes if rule["columns"] == list(frame.columns) else base.row_hashes(frame)
        say_copies(len(content) - len(np.unique(content)), where, self.trainer)
        rows = base.split_rows(rule, hashes, targets)
        self.raw = {
            name: (frame.iloc[part.numpy()], [row_name(int(i)) for i in part], targets[part])
            for name, part in zip(base.SPLITS, rows)
        }
        if len(self.raw["test"][2]) == 0:
            raise DataError(
                f"{where}: {len(frame)} rows leave no test rows at test_fraction {self.hparams.test_fraction}; give "
                "more rows or a larger data.init_args.test_fraction"
            )
        train = self.raw["train"][0].drop(columns=[rule["id_column"]] if rule["id_column"] else [])  # not learnt
        self.state = preprocessing.describe_columns(train, label, where)
        if self.trainer is None or self.trainer.is_global_zero:
            for column, reason in self.state["left_out"].items():
                print(f"{where}: column {column!r} left out: {reason}", file=sys.stderr)
        schema = {column: "left out" for column in frame.columns} | {label: "label"}
        schema |= {column["name"]: column["kind"] for column in self.state["columns"]}
        self.identity = base.data_identity(str(where), content, hashes, rule, schema, rows)
        self.featurise()

    def resplit(self, rule: dict) -> None:
        """The split by a checkpoint's rule (datamodules/split_check.py); its column state follows at load."""
        self.split(rule)

    def featurise(self) -> None:
        """Each split's network inputs from its raw rows and the state (the checkpoint's, once restored)."""
        self.splits = {
            name: (self.features(frame, names, self.hparams.csv_path), targets)
            for name, (frame, names, targets) in getattr(self, "raw", {}).items()
        }

    def features(self, frame, names: list[str], where: str) -> torch.Tensor:
        return torch.from_numpy(preprocessing.serving_batch(self.state, frame, names, where))

    def load_state_dict(self, state: dict) -> None:
        # After setup, before the dataloaders: the inputs become what the checkpoint's network was trained on.
        super().load_state_dict(state)
        if state.get("serving"):
            self.state = state["serving"]
            self.featurise()

    def predict_dataloader(self):
        where = self.hparams.predict_path
        self.splits["predict"] = (self.features(self.predict_frame, self.predict_names, where),)
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
