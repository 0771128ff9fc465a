"""Palmer penguins: five measurements -> one of three species, as the Microsoft Learn course, from PyPI's
`palmerpenguins` or a CSV. The split is a seeded hash of each row (datamodules/base.py), made before anything
else: no test row is ever trained, and rows added to the CSV move no other row.

    python -m scripts.train fit --config configs/penguins.yaml
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch

from datamodules import base
from datamodules.base import InMemoryDataModule, LazyFunction, check_fractions, say_copies
from datamodules.errors import DataError
from datamodules.preprocessing import penguins as preprocessing
from datamodules.preprocessing.penguins import FEATURES, KINDS, SPECIES, read_penguins, scale_features


def check_plausible(table, where: str) -> None:
    """Refuses a training row whose measurement no penguin has (PLAUSIBLE): a typo of a few orders of magnitude, or
    scaled units, would otherwise train the network and widen the ranges predict judges new penguins by."""
    columns = table.attrs["columns"]
    for name, (low, high) in preprocessing.PLAUSIBLE.items():
        values = table[name].to_numpy()  # in numpy: pandas deep-copies table.attrs (each row dropped) at each step
        outside = (values < low) | (values > high)
        if outside.any():
            row = int(table.index[outside.argmax()])
            raise DataError(
                f"{where}: line {row + 2}, column {columns[name]}: {table[name][row]:g} is no penguin's "
                f"({low:g} to {high:g} {preprocessing.UNITS[name]}); fix or remove that row"
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
        val_fraction, test_fraction: the shares of rows held out (each species', on average), before any training.
        preprocessing: "course" scales as the course did; "standardize" by the training split's mean and deviation.
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
        self.stage, where = stage, self.hparams.csv_path or "palmerpenguins"
        self.table = read_penguins(self.hparams.csv_path)
        check_plausible(self.table, where)
        self.resplit(base.split_rule(self.seed, self.hparams.val_fraction, self.hparams.test_fraction,
                                          [*FEATURES, "species"]))  # fmt: skip

    def resplit(self, rule: dict) -> None:
        """The split by `rule` (this config's, or a checkpoint's: datamodules/split_check.py) and what it gives."""
        table, where = self.table, self.hparams.csv_path or "palmerpenguins"
        labels = torch.tensor(table["species"].to_numpy(), dtype=torch.long)
        hashes = base.row_hashes(table[rule["columns"]])
        say_copies(len(hashes) - len(np.unique(hashes)), where, self.trainer)
        self.split_rows = base.split_rows(rule, hashes, labels)
        check_splits(where, labels, self.split_rows)
        self.identity = base.data_identity(where, hashes, hashes, rule, KINDS | {"species": "label"}, self.split_rows)
        raw = torch.tensor(table[list(FEATURES)].to_numpy(dtype="float32"))
        train_rows = raw[self.split_rows[0]]
        self.seen = {  # what the training split looks like: the model's inputs are scaled by it and judged against it
            "mean": train_rows.mean(0), "std": train_rows.std(0).clamp_min(1e-6),
            "low": train_rows.min(0).values, "high": train_rows.max(0).values,
        }  # fmt: skip
        if self.stage == "fit":
            check_varies(train_rows, table.attrs.get("columns", {}), where)
        self.raw = {name: (raw[rows], labels[rows]) for name, rows in zip(base.SPLITS, self.split_rows)}
        if self.stage == "predict":
            from datamodules.preprocessing.new_penguins import read_new

            self.predict_table, self.predict_names = read_new(self.hparams.predict_path)
            self.raw["predict"] = (torch.tensor(self.predict_table[list(FEATURES)].to_numpy(dtype="float32")),)
        self.scale()

    def scale(self) -> None:
        self.splits = {name: (self.features(raw), *labels) for name, (raw, *labels) in self.raw.items()}

    def state_dict(self) -> dict:  # the training split's statistics, for predict, test and export
        return {**super().state_dict(), "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        # Lightning calls it after setup, before the dataloaders: inputs are scaled as the checkpoint's model was.
        super().load_state_dict(state)
        self.seen = state["seen"]
        if hasattr(self, "raw"):
            self.scale()

    def seen_arrays(self) -> dict | None:
        seen = getattr(self, "seen", None)  # the course's scaling needs none
        return None if seen is None else {key: torch.as_tensor(value).numpy() for key, value in seen.items()}

    def features(self, raw: torch.Tensor) -> torch.Tensor:
        """The serving code's scaling, so that predict and the registered model see the same numbers."""
        return torch.from_numpy(scale_features(raw.numpy(), self.seen_arrays(), self.hparams.preprocessing))

    def predict_dataloader(self):
        from datamodules.preprocessing.new_penguins import check_ranges

        columns = self.predict_table.attrs["columns"]  # against the checkpoint's training data, restored by now
        check_ranges(self.raw["predict"][0].numpy(), self.seen_arrays(), self.hparams.predict_path, self.predict_names,
                     columns)  # fmt: skip
        return super().predict_dataloader()

    def serving_state(self) -> dict:
        seen = {key: value.tolist() for key, value in self.seen.items()}  # float32 values, exact as floats
        return {"preprocessing": self.hparams.preprocessing, "seen": seen}

    # What the registered model ships: new_penguins.py, loaded only to predict, serve or register.
    serving_preprocess = LazyFunction("datamodules.preprocessing.new_penguins:serving_batch")
    serving_example = LazyFunction("datamodules.preprocessing.new_penguins:serving_example")
    serving_columns = LazyFunction("datamodules.preprocessing.new_penguins:serving_columns")
    serving_column_kinds = LazyFunction("datamodules.preprocessing.new_penguins:serving_column_kinds")
