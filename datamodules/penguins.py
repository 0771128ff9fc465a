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

import sys
from pathlib import Path
from typing import Literal

import torch

from datamodules.errors import DataError
from datamodules.in_memory import InMemoryDataModule

SPECIES = ("Adelie", "Gentoo", "Chinstrap")  # the course's label order: Species 0, 1, 2
ISLANDS = ("Torgersen", "Biscoe", "Dream")  # order of first appearance in the data
FEATURES = ("island", "culmen_length", "culmen_depth", "flipper_length", "body_mass")

# Each schema's column name for each of our names; species is optional (absent at predict time).
SCHEMAS = {
    "palmerpenguins": {
        "island": "island",
        "culmen_length": "bill_length_mm",
        "culmen_depth": "bill_depth_mm",
        "flipper_length": "flipper_length_mm",
        "body_mass": "body_mass_g",
        "species": "species",
    },
    "course": {
        "island": "Island",
        "culmen_length": "CulmenLength",
        "culmen_depth": "CulmenDepth",
        "flipper_length": "FlipperLength",
        "body_mass": "BodyMass",
        "species": "Species",
    },
}
# The course's scaling: brings flipper length (mm) and body mass (g) near the other features.
# Every column name of the features in either schema: a request's cells in these must all be given.
FEATURE_COLUMNS = {column for schema in SCHEMAS.values() for name, column in schema.items() if name in FEATURES}
COURSE_SCALE = torch.tensor([1.0, 1.0, 1.0, 10.0, 100.0])
# What a penguin can measure, generously (the 344 Palmer penguins span 32-60, 13-21.5, 172-231 mm and 2700-6300 g;
# docs/tasks.md): a training value outside is a typo or another unit, and would widen the ranges predict accepts.
PLAUSIBLE = {
    "culmen_length": (20.0, 80.0),
    "culmen_depth": (8.0, 30.0),
    "flipper_length": (120.0, 260.0),
    "body_mass": (1500.0, 9000.0),
}
UNITS = {"culmen_length": "mm", "culmen_depth": "mm", "flipper_length": "mm", "body_mass": "g"}
# Cells read as missing (the row is dropped, as the course does); pandas' other defaults, "nan" and its kin, are
# values that are not numbers, and refused where they stand.
MISSING = ["", "NA", "N/A", "n/a", "#N/A", "#NA", "<NA>", "NULL", "null", "None"]


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
        try:
            frame = pd.read_csv(path, keep_default_na=False, na_values=MISSING)
        except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as error:
            raise DataError(f"{where}: not a readable CSV ({error})") from None
    return penguin_table(frame, where, need_species)


def penguin_table(frame, where: str, need_species: bool = True, row_name=lambda index: f"line {index + 2}"):
    """`frame` (a pandas DataFrame in either schema) in our column names, complete rows only, island as an index;
    what `read_penguins` makes of a file and the scoring script (scripts/score.py) of a request's rows. `where` names
    the source in messages, `row_name(index)` a row of it (a CSV's line: +1 for the header, +1 for counting from 1)."""
    import pandas as pd

    wanted = [name for name in SCHEMAS["course"] if need_species or name != "species"]
    schema = next((s for s in SCHEMAS.values() if all(s[name] in frame.columns for name in wanted)), None)
    if schema is None:
        options = " or ".join(", ".join(s[n] for n in wanted) for s in SCHEMAS.values())
        raise DataError(f"{where}: missing columns; a penguin CSV needs {options}")
    table = frame[[schema[name] for name in wanted]].set_axis(wanted, axis=1)
    table.attrs["columns"] = schema  # the file's own column names, for messages

    for column in FEATURES[1:]:
        numbers = pd.to_numeric(table[column], errors="coerce")
        given = table[column].notna()
        spelled = table[column].astype(str).str.strip().str.lower().str.lstrip("+-")
        bad = given & numbers.isna() & ~spelled.isin(NOT_A_NUMBER)
        if bad.any():
            raise DataError(
                f"{where}: column {schema[column]} has a non-numeric value "
                f"{table[column][bad.idxmax()]!r} on {row_name(int(bad.idxmax()))}; fix or remove that row"
            )
        infinite = given & (numbers.isna() | numbers.abs().eq(float("inf")))
        if infinite.any():
            row = infinite.idxmax()
            value = str(table[column][row]).strip()
            raise DataError(
                f"{where}: {row_name(int(row))}, column {schema[column]}: {value!r} is not a finite number; give the "
                "measurement, or leave the cell empty to drop the row"
            )
        table[column] = numbers
    gaps = table.isna()
    # Each row dropped, with the columns it lacks: predict names them, rather than answering one row fewer.
    table.attrs["incomplete"] = {
        int(row): [schema[name] for name in wanted if gaps.loc[row, name]] for row in gaps.index[gaps.any(axis=1)]
    }
    table = table.dropna()  # keeps the index: row i is line i + 2 of the file
    if table.empty:
        raise DataError(f"{where}: no row has all of {', '.join(schema[n] for n in wanted)}")

    unknown = sorted(set(table["island"]) - set(ISLANDS))
    if unknown:
        raise DataError(
            f"{where}: unknown island {unknown[0]!r} in column {schema['island']}; the model knows {', '.join(ISLANDS)}"
        )
    table["island"] = table["island"].map(ISLANDS.index)
    if need_species:
        table["species"] = table["species"].map(species_index)
        if (table["species"] < 0).any():
            row = int((table["species"] < 0).idxmax())
            value = frame[schema["species"]][row]
            raise DataError(
                f"{where}: line {row + 2}: {schema['species']} '{value}' is none of {', '.join(SPECIES)} or 0/1/2; "
                "fix or remove that row"
            )
    return table


NOT_A_NUMBER = {"nan", "inf", "infinity", "1.#qnan", "1.#ind"}  # what pandas and Python read as a float that is none


def check_plausible(table, where: str) -> None:
    """Refuses a training row whose measurement no penguin has (PLAUSIBLE): a typo of a few orders of magnitude, or
    scaled units, would otherwise train the network and widen the ranges predict judges new penguins by."""
    columns = table.attrs["columns"]
    for name, (low, high) in PLAUSIBLE.items():
        outside = (table[name] < low) | (table[name] > high)
        if outside.any():
            row = int(outside.idxmax())
            raise DataError(
                f"{where}: line {row + 2}, column {columns[name]}: {table[name][row]:g} is no penguin's "
                f"({low:g} to {high:g} {UNITS[name]}); fix or remove that row"
            )


def species_index(value) -> int:
    """0, 1 or 2 for a species named (palmerpenguins) or numbered (the course; pandas reads 1 as 1.0 in a column
    with an empty cell); -1 for anything else."""
    if isinstance(value, str):
        value = value.strip()
        return SPECIES.index(value) if value in SPECIES else int(value) if value in ("0", "1", "2") else -1
    try:
        return int(value) if float(value) in (0.0, 1.0, 2.0) else -1
    except (TypeError, ValueError):
        return -1


def stratified_split(
    labels: torch.Tensor, fractions: tuple[float, float], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row indices of train, validation and test: disjoint, each class in proportion, seeded."""
    generator = torch.Generator().manual_seed(seed)
    parts: list[list[torch.Tensor]] = [[], [], []]
    for label in labels.unique():
        rows = (labels == label).nonzero().flatten()
        rows = rows[torch.randperm(len(rows), generator=generator)]
        n_val, n_test = (round(f * len(rows)) for f in fractions)
        parts[0].append(rows[n_val + n_test :])
        parts[1].append(rows[:n_val])
        parts[2].append(rows[n_val : n_val + n_test])
    train, val, test = (torch.cat(p).sort().values for p in parts)
    return train, val, test


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
        if not (val_fraction >= 0 and test_fraction >= 0 and val_fraction + test_fraction < 1):
            raise DataError(
                f"data.init_args.val_fraction {val_fraction} + test_fraction {test_fraction}: give fractions of 0 or "
                "more that leave rows to train on (a sum below 1)"
            )
        for option, path in (("csv_path", csv_path), ("predict_path", predict_path)):
            if path is not None and not Path(path).is_file():  # fail before any run is created
                raise DataError(f"{path}: no such file; give data.init_args.{option} an existing CSV")
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        table = read_penguins(self.hparams.csv_path)
        check_plausible(table, self.hparams.csv_path or "palmerpenguins")
        labels = torch.tensor(table["species"].to_numpy(), dtype=torch.long)
        fractions = (self.hparams.val_fraction, self.hparams.test_fraction)
        self.split_rows = stratified_split(labels, fractions, self.seed)
        check_splits(self.hparams.csv_path or "palmerpenguins", labels, self.split_rows)
        raw = torch.tensor(table[list(FEATURES)].to_numpy(dtype="float32"))
        train_rows = raw[self.split_rows[0]]
        self.seen = {  # what the training split looks like: the model's inputs are scaled by it and judged against it
            "mean": train_rows.mean(0), "std": train_rows.std(0).clamp_min(1e-6),
            "low": train_rows.min(0).values, "high": train_rows.max(0).values,
        }  # fmt: skip
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
        return scale_features(raw, getattr(self, "seen", None), self.hparams.preprocessing)  # course: needs no seen

    def predict_dataloader(self):
        self.check_ranges(self.raw["predict"][0])  # against the checkpoint's training data, restored by now
        return super().predict_dataloader()

    def check_ranges(self, raw: torch.Tensor) -> None:
        check_ranges(raw, self.seen, self.hparams.predict_path, self.predict_names, self.predict_table.attrs["columns"])

    def serving_state(self) -> dict:
        seen = {key: value.tolist() for key, value in self.seen.items()}  # float32 values, exact as floats
        return {"preprocessing": self.hparams.preprocessing, "seen": seen}

    @classmethod
    def serving_batch(cls, state: dict, inputs, names: list[str]) -> torch.Tensor:
        """Rows in either CSV schema's columns, read, range-checked and scaled as predict reads a CSV. A row with a
        value missing is refused rather than dropped (predict skips it), so that every answer has its row."""
        frame = inputs.reset_index(drop=True)
        known = [column for column in frame.columns if column in FEATURE_COLUMNS]
        gaps = frame[known].isna()
        if gaps.to_numpy().any():
            row = int(gaps.any(axis=1).to_numpy().argmax())
            missing = ", ".join(column for column in known if gaps.loc[row, column])
            raise DataError(f"request: {names[row]} has no value for {missing}; give every column")
        table = penguin_table(frame, "request", need_species=False, row_name=lambda index: names[index])
        raw = torch.tensor(table[list(FEATURES)].to_numpy(dtype="float32"))
        seen = {key: torch.tensor(value, dtype=torch.float32) for key, value in state["seen"].items()}
        check_ranges(raw, seen, "request", names, table.attrs["columns"])
        return scale_features(raw, seen, state["preprocessing"])


def scale_features(raw: torch.Tensor, seen: dict[str, torch.Tensor] | None, preprocessing: str) -> torch.Tensor:
    """The model's inputs from raw measurements (FEATURES order, island as an index): the course's scaling, or
    standardised with the training split's statistics `seen` (what a checkpoint's datamodule state holds)."""
    if preprocessing == "course":
        return raw / COURSE_SCALE
    return (raw - seen["mean"]) / seen["std"]


def check_ranges(raw: torch.Tensor, seen: dict[str, torch.Tensor], where, row_names, columns: dict) -> None:
    """Refuses measurements far outside the training split's (most likely another unit, as the course's
    scaled example: flipper 20, mass 50): the model would answer with confidence, and wrongly. `row_names` name the
    rows of `raw` in the message, `columns` maps our names to the source's column names."""
    low, high = seen["low"], seen["high"]
    margin = (high - low) / 2
    outside = (raw < low - margin) | (raw > high + margin)
    outside[:, 0] = False  # the island index is checked by name when read
    if outside.any():
        row, column = (int(i) for i in outside.nonzero()[0])
        name = columns[FEATURES[column]]
        raise DataError(
            f"{where}: {row_names[row]}: {name} {raw[row, column].item():g} is far "
            f"outside what the model was trained on ({low[column].item():g} to {high[column].item():g}); "
            "give millimetres and grams, as in the training data"
        )
