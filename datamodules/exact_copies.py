"""Rows that are exact copies of others (every column and the label: scraped or merged tables have them), kept
together in one split by `stratified_split` (datamodules/base.py): a test row that is also a training row would
measure memory, not the model. Loaded only for data that has such rows.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path FILE --data.init_args.label COLUMN
"""

from __future__ import annotations

import torch


def copies_together(rows: torch.Tensor, ids: torch.Tensor, n_val: int, n_test: int) -> tuple[torch.Tensor, int, int]:
    """`rows` (shuffled) reordered so that copies sit together, in the order each first appears, and the validation
    and test counts moved to the nearest boundary between groups of copies."""
    first = {}
    for position, copy_id in enumerate(ids.tolist()):
        first.setdefault(copy_id, []).append(position)
    ordered = [position for positions in first.values() for position in positions]
    sizes = [len(positions) for positions in first.values()]
    ends = torch.tensor(sizes).cumsum(0).tolist()
    val = next((end for end in ends if end >= n_val), 0) if n_val else 0
    test = next((end for end in ends if end >= val + n_test), val) - val if n_test else 0
    return rows[ordered], val, test
