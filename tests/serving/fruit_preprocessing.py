"""The serving preprocessing of tests/serving/test_own_datamodule.py's FruitDataModule, in a module of its own that
imports only numpy, pandas and datamodules.errors, as the README's "Add your own dataset" says: the registered model
ships this file and runs it where there is no torch.

    python -m pytest tests/serving/test_own_datamodule.py
"""

from __future__ import annotations

import numpy as np

from datamodules.errors import DataError

COLUMNS = ("weight_g", "width_mm")


def serving_batch(state: dict, inputs, names: list[str]) -> np.ndarray:
    """Rows with both columns (a pandas DataFrame) standardised with the training split's statistics."""
    missing = [column for column in COLUMNS if column not in inputs.columns]
    if missing:
        raise DataError(f"request: no column {', '.join(missing)}; send {', '.join(COLUMNS)}")
    raw = inputs[list(COLUMNS)].to_numpy(dtype="float32")
    return (raw - np.asarray(state["mean"], dtype=np.float32)) / np.asarray(state["std"], dtype=np.float32)
