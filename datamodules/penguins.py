"""Palmer penguins: five measurements -> one of three species, as the Microsoft Learn course.

    python -m scripts.train fit --config configs/penguins.yaml

Data comes from PyPI's `palmerpenguins` (the default) or from a CSV in either schema:
- palmerpenguins: species, island, bill_length_mm, bill_depth_mm, flipper_length_mm, body_mass_g
- the course:     Island, CulmenLength, CulmenDepth, FlipperLength, BodyMass, Species (0/1/2)
Preparation follows the course (drop incomplete rows, island as an index, flipper length / 10,
body mass / 100) or standardises every feature with statistics of the training split. The split
is stratified, seeded and made before anything else, so no test row is ever seen in training.
"""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path
from typing import Literal

import torch

from datamodules.base import InMemoryDataModule, check_fractions, copy_ids, say_copies, stratified_split
from datamodules.errors import DataError
from datamodules.preprocessing import penguins as preprocessing
from datamodules.preprocessing.penguins import (  # noqa: F401 (names of this module before they moved)
    COURSE_SCALE,
    FEATURE_COLUMNS,
    FEATURES,
    ISLANDS,
    MISSING,
    PLAUSIBLE,
    SAVE_AS,
    SCHEMA_COLUMNS,
    SCHEMAS,
    SPECIES,
    UNITS,
    check_ranges,
    penguin_table,
    scale_features,
    species_index,
)


def read_penguins(path: str | Path | None, need_species: bool = True):
    """The table in our column names, complete rows only; `path=None` reads `palmerpenguins`."""
    import pandas as pd

    if path is None:
        from palmerpenguins import load_penguins

        frame, where = load_penguins(), "palmerpenguins"
    else:
        where = str(path)
        if not Path(path).is_file():
            raise DataError(f"{where}: no such file; give an existing CSV")
        data = Path(path).read_bytes()  # read once: the layout checks and pandas both read these bytes
        if what := preprocessing.not_utf8(data[:4]):  # UTF-16 (a spreadsheet's "Unicode Text"), or a workbook
            raise DataError(f"{where}: {what}")
        columns, header_line = check_row_lengths(data, where)
        try:
            # Only the header's columns: a row's empty fields past them (a spreadsheet's trailing commas) are dropped,
            # rather than its first field taken as the row's index; pandas' warning of it is no news (checked).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", pd.errors.ParserWarning)
                frame = pd.read_csv(io.BytesIO(data), keep_default_na=False, na_values=MISSING, index_col=False,
                                    usecols=range(columns) if columns else None, skip_blank_lines=False,
                                    skiprows=header_line - 1)  # fmt: skip
            # A blank line is a row of nothing, dropped here rather than by pandas, which numbered the rows after it one
            # line too early: predict answered the penguin of line 4 as "line 3", and messages named the wrong line.
            # Row i is line i + 2 of the file, blank lines before the header counted too.
            frame = preprocessing.drop_blank_rows(frame, header_line)
        except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as error:
            raise DataError(f"{where}: not a readable CSV ({str(error).strip()})") from None
    return penguin_table(frame, where, need_species)


def check_row_lengths(data: bytes, where: str) -> tuple[int | None, int]:
    """How many columns the header of a CSV (`data`: the file's bytes) names (None when it cannot tell), and the line
    it is on (the first not blank). The layout checks themselves (columns separated by semicolons, a column the model
    reads named twice, a row with more values than the header) are preprocessing's check_csv_layout, which the scoring
    script's CSV reader (scripts/score.py) runs too."""
    import csv

    # Decoded as it is read, as the file was: a layout mistake before a byte that is not UTF-8 is still the one named.
    with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="") as file:
        try:
            header, header_line, _ = preprocessing.check_csv_layout(csv.reader(file), where)
        except (csv.Error, UnicodeDecodeError):
            return None, 1  # not a CSV of text: pandas says what is wrong
    return len(header), max(header_line, 1)


def check_plausible(table, where: str) -> None:
    """Refuses a training row whose measurement no penguin has (PLAUSIBLE): a typo of a few orders of magnitude, or
    scaled units, would otherwise train the network and widen the ranges predict judges new penguins by."""
    columns = table.attrs["columns"]
    for name, (low, high) in PLAUSIBLE.items():
        values = table[name].to_numpy()  # in numpy: pandas deep-copies table.attrs (each row dropped) at each step
        outside = (values < low) | (values > high)
        if outside.any():
            row = int(table.index[outside.argmax()])
            raise DataError(
                f"{where}: line {row + 2}, column {columns[name]}: {table[name][row]:g} is no penguin's "
                f"({low:g} to {high:g} {UNITS[name]}); fix or remove that row"
            )


def check_splits(where: str, labels: torch.Tensor, split_rows: tuple[torch.Tensor, ...]) -> None:
    """Refuses data a test accuracy would mislead on: one species only, or a species missing from a split."""
    present = [SPECIES[i] for i in labels.unique().tolist()]
    if len(present) < 2:
        raise DataError(
            f"{where}: every complete row is {present[0]}; a classifier needs rows of at least two species "
            f"({', '.join(SPECIES)})"
        )
    for name, rows in zip(("training", "validation", "test"), split_rows):
        missing = sorted(set(present) - {SPECIES[i] for i in labels[rows].unique().tolist()})
        if missing:
            raise DataError(
                f"{where}: {len(labels)} complete rows leave no {', '.join(missing)} in the {name} split; give more "
                "rows of each species (or change data.init_args.val_fraction / test_fraction)"
            )


def check_varies(train_rows: torch.Tensor, columns: dict, where: str) -> None:
    """Refuses a feature of one value in every training row: the network learns nothing from it, and the model then
    refuses every row with another value as far outside the training data's."""
    for i, name in enumerate(FEATURES):
        values = train_rows[:, i]
        if bool((values == values[0]).all()):
            raise DataError(
                f"{where}: column {columns.get(name, name)} is {float(values[0]):g} in every training row (a "
                "constant); give rows where it varies"
            )


class PenguinDataModule(InMemoryDataModule):
    """
    Args:
        csv_path: a CSV in either schema; None uses the 344 penguins of PyPI's palmerpenguins.
        predict_path: CSV of penguins to classify (no species column needed).
        batch_size: rows per step (the course: 20).
        val_fraction, test_fraction: shares of each species held out, before any training.
        preprocessing: "course" scales as the course did; "standardize" uses training-split
            mean and standard deviation for every feature.
        seed: the split's seed; every rank computes the same split.
    """

    class_names = list(SPECIES)
    preprocessing_options = ("preprocessing",)
    serving_kind = "rows"
    evaluate_in_one_batch = True  # evaluation does not learn from batches: one slice of a split is cheapest

    def __init__(
        self,
        csv_path: str | None = None,
        predict_path: str | None = None,
        batch_size: int = 20,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        preprocessing: Literal["course", "standardize"] = "course",
        seed: int = 42,
    ) -> None:
        super().__init__(batch_size, seed)
        check_fractions(val_fraction, test_fraction)
        for option, path in (("csv_path", csv_path), ("predict_path", predict_path)):
            if path is not None and not Path(path).is_file():  # fail before any run is created
                raise DataError(f"{path}: no such file; give data.init_args.{option} an existing CSV")
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        table = read_penguins(self.hparams.csv_path)
        check_plausible(table, self.hparams.csv_path or "palmerpenguins")
        labels = torch.tensor(table["species"].to_numpy(), dtype=torch.long)
        fractions = (self.hparams.val_fraction, self.hparams.test_fraction)
        copies = copy_ids(table[[*FEATURES, "species"]])
        say_copies(len(labels) - copies.unique().numel(), self.hparams.csv_path or "palmerpenguins", self.trainer)
        self.split_rows = stratified_split(labels, fractions, self.seed, copies)
        check_splits(self.hparams.csv_path or "palmerpenguins", labels, self.split_rows)
        raw = torch.tensor(table[list(FEATURES)].to_numpy(dtype="float32"))
        train_rows = raw[self.split_rows[0]]
        self.seen = {  # what the training split looks like: the model's inputs are scaled by it and judged against it
            "mean": train_rows.mean(0), "std": train_rows.std(0).clamp_min(1e-6),
            "low": train_rows.min(0).values, "high": train_rows.max(0).values,
        }  # fmt: skip
        if stage == "fit":
            check_varies(train_rows, table.attrs.get("columns", {}), self.hparams.csv_path or "palmerpenguins")
        self.raw = {name: (raw[rows], labels[rows]) for name, rows in zip(("train", "val", "test"), self.split_rows)}
        if stage == "predict":
            if self.hparams.predict_path is None:
                raise DataError("predict needs data.init_args.predict_path: a CSV of penguins")
            table = read_penguins(self.hparams.predict_path, need_species=False)
            self.raw["predict"] = (torch.tensor(table[list(FEATURES)].to_numpy(dtype="float32")),)
            self.predict_table = table
            # read_penguins drops incomplete rows: name each kept row by its line in the file, and each dropped one.
            self.predict_names = [f"line {i + 2}" for i in table.index]
            for row, missing in table.attrs["incomplete"].items():
                print(
                    f"{self.hparams.predict_path}: line {row + 2} has no {', '.join(missing)}: skipped, no answer "
                    "for it",
                    file=sys.stderr,
                )
        self.scale()

    def scale(self) -> None:
        """Each split's inputs as the model takes them, from its raw measurements and `seen`."""
        self.splits = {name: (self.features(raw), *labels) for name, (raw, *labels) in self.raw.items()}

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the scaling and the training split's statistics, which predict, test and export
        then use."""
        return {**super().state_dict(), "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        # Lightning calls it after setup, before the dataloaders: inputs are scaled as the checkpoint's model was.
        super().load_state_dict(state)
        self.seen = state["seen"]
        if hasattr(self, "raw"):
            self.scale()

    def features(self, raw: torch.Tensor) -> torch.Tensor:
        """The serving code's scaling (datamodules/preprocessing/penguins.py), so that predict and the registered model
        see the same numbers."""
        seen = getattr(self, "seen", None)  # the course's scaling needs none
        seen = None if seen is None else {key: torch.as_tensor(value).numpy() for key, value in seen.items()}
        return torch.from_numpy(scale_features(raw.numpy(), seen, self.hparams.preprocessing))

    def predict_dataloader(self):
        self.check_ranges(self.raw["predict"][0])  # against the checkpoint's training data, restored by now
        return super().predict_dataloader()

    def check_ranges(self, raw: torch.Tensor) -> None:
        seen = {key: torch.as_tensor(value).numpy() for key, value in self.seen.items()}
        where, columns = self.hparams.predict_path, self.predict_table.attrs["columns"]
        check_ranges(raw.numpy(), seen, where, self.predict_names, columns)

    def serving_state(self) -> dict:
        seen = {key: value.tolist() for key, value in self.seen.items()}  # float32 values, exact as floats
        return {"preprocessing": self.hparams.preprocessing, "seen": seen}

    serving_preprocess = staticmethod(preprocessing.serving_batch)

    @classmethod
    def serving_example(cls):
        import pandas as pd

        return pd.DataFrame(preprocessing.EXAMPLE)

    @classmethod
    def serving_columns(cls) -> list[str]:
        return [column for schema in SCHEMAS.values() for name, column in schema.items() if name in FEATURES]

    @classmethod
    def serving_column_kinds(cls) -> dict[str, str]:
        return {
            column: "categorical" if name == "island" else "numeric"
            for schema in SCHEMAS.values()
            for name, column in schema.items()
            if name in FEATURES
        }
