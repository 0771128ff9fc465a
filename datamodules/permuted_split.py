"""The split of tables and penguins before the row-hash rule (datamodules/base.py): a seeded permutation of each
class's rows, exact copies kept together. Loaded only to test or resume a checkpoint written before checkpoints kept
their split's rule, so that it is tested on the rows it was tested on then.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path FILE --data.init_args.label COLUMN
"""

from __future__ import annotations

import torch


def stratified_split(
    labels: torch.Tensor, fractions: tuple[float, float], seed: int, copies: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row indices of train, validation and test: disjoint, each class in proportion, seeded. `copies` (one id per
    row, equal for rows that are exact copies of each other) keeps every copy of a row in one split: a
    test row that is also a training row would measure memory, not the model."""
    generator = torch.Generator().manual_seed(seed)
    parts: list[list[torch.Tensor]] = [[], [], []]
    for label in labels.unique():
        rows = (labels == label).nonzero().flatten()
        rows = rows[torch.randperm(len(rows), generator=generator)]
        n_val, n_test = (round(f * len(rows)) for f in fractions)
        if copies is not None and copies[rows].unique().numel() < len(rows):
            rows, n_val, n_test = copies_together(rows, copies[rows], n_val, n_test)
        parts[0].append(rows[n_val + n_test :])
        parts[1].append(rows[:n_val])
        parts[2].append(rows[n_val : n_val + n_test])
    train, val, test = (torch.cat(p).sort().values for p in parts)
    return train, val, test


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
