"""Penguins to classify, with pandas and numpy only: predict's rows and the registered model's requests checked
against the training split's ranges, and a request's rows as the network's input batch (`serving_batch`, which
scripts/serving/pyfunc_model.py runs: the model ships this file). Loaded only to predict, serve or register.

    python -m scripts.train predict --config configs/penguins.yaml --ckpt_path CKPT --data.predict_path new.csv
"""

from __future__ import annotations

import sys

import numpy as np

from datamodules.errors import DataError
from datamodules.preprocessing.penguins import FEATURES, KINDS, SCHEMAS, penguin_table, read_penguins, scale_features

# Every column name of the features in either schema: a request's cells in these must all be given.
FEATURE_COLUMNS = {column for schema in SCHEMAS.values() for name, column in schema.items() if name in FEATURES}
# The course's example penguin (a Gentoo), in palmerpenguins' schema: the registered model's input example.
EXAMPLE = {"island": ["Biscoe"], "bill_length_mm": [50.4], "bill_depth_mm": [15.3], "flipper_length_mm": [200.0],
           "body_mass_g": [5000.0]}  # fmt: skip


def serving_example():
    """The registered model's input example: EXAMPLE as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(EXAMPLE)


def serving_columns() -> list[str]:
    """Every feature's column in either schema: what a request may name."""
    return [column for schema in SCHEMAS.values() for name, column in schema.items() if name in FEATURES]


def serving_column_kinds() -> dict[str, str]:
    return {column: KINDS[name] for schema in SCHEMAS.values() for name, column in schema.items() if name in KINDS}


def read_new(path: str | None):
    """predict's CSV: its complete rows (pandas), each named by its line in the file; a line on stderr for each row
    dropped, naming what it lacks."""
    if path is None:
        raise DataError("predict needs data.init_args.predict_path: a CSV of penguins")
    table = read_penguins(path, need_species=False)
    for row, missing in table.attrs["incomplete"].items():
        print(f"{path}: line {row + 2} has no {', '.join(missing)}: skipped, no answer for it", file=sys.stderr)
    return table, [f"line {i + 2}" for i in table.index]


def check_ranges(raw: np.ndarray, seen: dict[str, np.ndarray], where, row_names, columns: dict) -> None:
    """Refuses measurements far outside the training split's (most likely another unit, as the course's scaled example:
    flipper 20, mass 50): the model would answer with confidence, and wrongly. `row_names` name the rows of `raw`,
    `columns` maps our names to the source's."""
    low, high = seen["low"], seen["high"]
    margin = (high - low) / 2
    outside = (raw < low - margin) | (raw > high + margin)
    outside[:, 0] = False  # the island index is checked by name when read
    if outside.any():
        row, column = (int(i) for i in np.argwhere(outside)[0])
        name = columns[FEATURES[column]]
        raise DataError(
            f"{where}: {row_names[row]}: {name} {float(raw[row, column]):g} is far "
            f"outside what the model was trained on ({float(low[column]):g} to {float(high[column]):g}); "
            "give millimetres and grams, as in the training data"
        )


def serving_batch(state: dict, inputs, names: list[str]) -> np.ndarray:
    """Rows (a pandas DataFrame in either CSV schema's columns; one name each, for messages) read, range-checked and
    scaled as predict reads a CSV, as the network's input batch (N, 5). A row with a value missing is refused rather
    than dropped (predict skips it), so that every answer has its row."""
    frame = inputs.reset_index(drop=True)
    known = [column for column in frame.columns if column in FEATURE_COLUMNS]
    # A list or a dict in a cell (JSON's wrong type) would otherwise fail deep in pandas; true/false, read as 1/0, was
    # refused as a measurement far outside the training data's (a column of them only is bool, not object).
    for column in [column for column in known if frame[column].dtype in (object, bool)]:
        odd = frame[column].map(lambda value: isinstance(value, bool) or not isinstance(value, str | int | float))
        odd &= frame[column].notna()
        if odd.any():
            row = int(odd.to_numpy().argmax())
            value = frame[column][row]
            raise DataError(
                f"request: {names[row]}, column {column}: a {type(value).__name__} ({str(value)[:40]}); give one "
                "string or number per cell (island: a name, the measurements: numbers)"
            )
    gaps = frame[known].isna()
    if gaps.to_numpy().any():
        row = int(gaps.any(axis=1).to_numpy().argmax())
        missing = ", ".join(column for column in known if gaps.loc[row, column])
        raise DataError(f"request: {names[row]} has no value for {missing}; give every column")
    needs = "each row (a JSON object's fields, or a CSV's columns) needs"
    table = penguin_table(frame, "request", need_species=False, row_name=lambda index: names[index], needs=needs)
    raw = table[list(FEATURES)].to_numpy(dtype="float32")
    seen = {key: np.asarray(value, dtype=np.float32) for key, value in state["seen"].items()}
    check_ranges(raw, seen, "request", names, table.attrs["columns"])
    return scale_features(raw, seen, state["preprocessing"])
