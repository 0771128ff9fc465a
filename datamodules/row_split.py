"""A table's split as a rule on rows, and what names the data a run saw. A row's split is a function of the row alone:
a 64-bit hash of its cells (or of its id column's), mixed with the seed, as a share of all 64-bit values: the first
`val_fraction` validation, the next `test_fraction` test, the rest training. Appending, removing or editing rows moves
no other row; exact copies share a split. The rule, the digests and the schema (`identity`) go in every checkpoint.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path FILE --data.init_args.label COLUMN
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

METHOD, SPLITS = "row hash", ("train", "val", "test")


def row_hashes(frame) -> np.ndarray:
    """One 64-bit hash per row of a pandas DataFrame, of its cells in its column order (not of its position); a
    number hashes as its text, so that a CSV's rows (cells read as text) and a Parquet file's hash alike."""
    import pandas as pd

    cells = frame.astype(object).where(frame.notna(), None)
    return pd.util.hash_pandas_object(cells, index=False).to_numpy(dtype=np.uint64)


def mixed(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: each bit of a value moves about half of the result's (uint64 wraps around)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def definition(seed: int, val_fraction: float, test_fraction: float, columns: list, id_column=None) -> dict:
    """The split's rule as a value: what a checkpoint keeps and a later command compares with its own."""
    return {"method": METHOD, "seed": int(seed), "val_fraction": float(val_fraction),
            "test_fraction": float(test_fraction), "id_column": id_column, "columns": list(columns)}  # fmt: skip


def split_rows(rule: dict, hashes: np.ndarray, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Row indices of train, validation and test by `rule`, `hashes` the rows' (`row_hashes` of its columns). A
    checkpoint older than the rule was split by a seeded permutation of each class's rows (permuted_split.py)."""
    fractions = (rule["val_fraction"], rule["test_fraction"])
    if rule["method"] != METHOD:
        from datamodules.permuted_split import stratified_split

        copies = torch.from_numpy(np.unique(hashes, return_inverse=True)[1].astype(np.int64))
        return stratified_split(labels, fractions, rule["seed"], copies)
    seed = mixed(np.array([rule["seed"] & (2**64 - 1)], dtype=np.uint64))
    share = (mixed(hashes ^ seed) >> np.uint64(11)).astype(np.float64) / 2.0**53  # uniform in [0, 1)
    val, held_out = share < fractions[0], share < sum(fractions)
    return tuple(torch.from_numpy(part.nonzero()[0]) for part in (~held_out, val, held_out & ~val))


def digest(hashes: np.ndarray) -> str:
    """The rows' digest, of their hashes sorted: the same rows in another order are the same data."""
    return hashlib.sha256(np.sort(hashes).tobytes()).hexdigest()[:16]


def identity(source: str, content: np.ndarray, keys: np.ndarray, rule: dict, schema: dict, parts: tuple) -> dict:
    """The data's source, digest (of `content`, the rows' hashes), rows, split rule, schema (column: kind), each split's
    digest and rows, and the rows' `keys` (the hashes split by, sorted: a later command counts rows added, removed)."""
    splits = {name: {"digest": digest(content[rows.numpy()]), "rows": len(rows)} for name, rows in zip(SPLITS, parts)}
    return {"source": source, "digest": digest(content), "rows": len(content), "split": rule, "schema": schema,
            "splits": splits, "row_hashes": torch.from_numpy(np.sort(keys).view(np.int64))}  # fmt: skip
