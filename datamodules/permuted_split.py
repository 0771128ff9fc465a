"""The splits before the hash rule (datamodules/base.py): of tables and penguins, a seeded permutation of each class's
rows, exact copies kept together; of an image folder without val/, of each class's files; of MNIST, of the training
file's rows. Loaded only to test or resume a checkpoint written before checkpoints kept their split's rule, so that it
is tested on the rows it was tested on then.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path FILE --data.init_args.label COLUMN
"""

from __future__ import annotations

from pathlib import Path

import torch

from datamodules.errors import DataError


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


def seeded_split(files: list[Path], fraction: float, seed: int, where: Path) -> tuple[list[Path], list[Path]]:
    """(kept, held out) of one class's files as an image folder's split was: `fraction` of them, at least one, drawn
    with `seed` (a generator of its own for each class)."""
    n_held = max(1, round(fraction * len(files)))
    if n_held >= len(files):
        raise DataError(
            f"{where}: {len(files)} image(s) cannot be split into training and validation with "
            f"data.init_args.val_fraction {fraction}; add images or give separate train/ and val/ folders"
        )
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    held = set(order[:n_held])
    return [f for i, f in enumerate(files) if i not in held], [f for i, f in enumerate(files) if i in held]


def permuted_rows(count: int, val_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(training rows, validation rows) of MNIST's training file as its split was: the first `val_size` of a seeded
    permutation of its `count` rows held out."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return order[val_size:], order[:val_size]
