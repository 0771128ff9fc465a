"""The batches of a streamed table (datamodules/table_stream.py): which row groups each process and DataLoader worker
reads (`plan`), each row group's rows of one split as the network's inputs (`unit_rows`, the same numbers
datamodules/preprocessing/table.py's serving_batch gives, in Arrow's vectorised kernels where a column's type allows)
and the IterableDataset that yields them (`StreamedRows`), in batches: views of each row group's arrays, the next row
group read and featurised in a thread (`read_ahead`) while the loop trains on the one before.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path lake/big/ \\
        --data.init_args.label outcome --data.init_args.memory_budget_mb 256 --data.init_args.num_workers 2
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from datamodules.errors import DataError
from datamodules.preprocessing import table as preprocessing

CODES = {"train": 0, "val": 1, "test": 2}  # each row's split, as the scan writes it (a uint8 a row, on disk)
READ_AHEAD = "table-read-ahead"  # the name of the thread that reads the next row group


def shares(counts: list[int], parts: int) -> list[list[int]]:
    """Indices of `counts` dealt into `parts` lists of near-equal sums: the largest first, each to the part that holds
    the fewest rows so far (ties: the lower part, the lower index); the same in every process."""
    dealt: list[list[int]] = [[] for _ in range(parts)]
    sums = [0] * parts
    for index in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        if counts[index]:
            part = min(range(parts), key=lambda p: (sums[p], p))
            dealt[part].append(index)
            sums[part] += counts[index]
    return [sorted(part) for part in dealt]


def plan(counts: list[int], world_size: int, workers: int, batch_size: int, pad: bool) -> list[list[tuple]]:
    """Per process, per worker: (units, rows, batches). Units (row groups, by `counts` of the split's rows) go to
    processes, then to each process's workers, by `shares`. `pad` (training): every process makes as many batches as
    the one with most (its first worker repeats its rows for the rest), since each step's gradients are averaged over
    all; evaluation is not padded: each row once over all processes."""
    result = []
    for units in shares(counts, world_size):
        per_worker = shares([counts[i] for i in units], workers)
        result.append([([units[i] for i in part], sum(counts[units[i]] for i in part)) for part in per_worker])
    batches = [[math.ceil(rows / batch_size) for _, rows in ranks] for ranks in result]
    most = max(sum(rank) for rank in batches)
    planned = []
    for rank, rank_batches in zip(result, batches):
        extra = most - sum(rank_batches) if pad else 0
        planned.append([(units, rows, count + (extra if worker == 0 else 0))
                        for worker, ((units, rows), count) in enumerate(zip(rank, rank_batches))])  # fmt: skip
    return planned


def categories_of(values: pa.ChunkedArray, categories: list[str]) -> np.ndarray:
    """Each cell's position in `categories` (len(categories): missing or another), as preprocessing.as_text names
    cells: text stripped, MISSING's spellings missing; cells of other types through as_text itself."""
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        text = pc.utf8_trim_whitespace(values)
        text = pc.if_else(pc.is_in(pc.utf8_lower(text), pa.array(sorted(preprocessing.MISSING_TEXT))), None, text)
        index = pc.index_in(text, value_set=pa.array(categories, text.type))
        return pc.fill_null(index, len(categories)).to_numpy()
    named = {category: i for i, category in enumerate(categories)}
    text = preprocessing.as_text(values.to_pandas())
    return np.array([named.get(value, len(categories)) for value in text], dtype=np.int64)


def numbers_of(values: pa.ChunkedArray, kind: str) -> np.ndarray:
    """A numeric or date column's cells as float64, NaN where missing or not of its kind (the training split's few
    unreadable cells and `inf` are read as missing, as the in-memory table reads them)."""
    numbers = None
    if kind == "numeric" and (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        numbers = values.cast(pa.float64())
    elif kind == "numeric" and (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        text = pc.utf8_trim_whitespace(values)
        text = pc.if_else(pc.is_in(pc.utf8_lower(text), pa.array(sorted(preprocessing.MISSING_TEXT))), None, text)
        try:
            numbers = text.cast(pa.float64())
        except pa.ArrowInvalid:  # a cell Arrow does not read as a number: pandas' reading, cell by cell, tells
            numbers = None
    if numbers is None:
        found, bad = preprocessing.cell_numbers(values.to_pandas(), kind)
        return np.where(bad, np.nan, found)
    found = pc.fill_null(numbers, np.nan).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    return np.where(np.isfinite(found), found, np.nan)


def features(state: dict, table: pa.Table) -> np.ndarray:
    """`table`'s rows as the network's input (rows, width(state)), float32: serving_batch's numbers."""
    parts = []
    for column in state["columns"]:
        values = table.column(column["name"])
        if column["kind"] == "categorical":
            index = categories_of(values, column["categories"])
            one_hot = np.zeros((len(index), len(column["categories"]) + 1), dtype=np.float32)
            one_hot[np.arange(len(index)), index] = 1
            parts.append(one_hot)
            continue
        numbers = numbers_of(values, column["kind"])
        missing = np.isnan(numbers)
        parts.append(((np.where(missing, column["median"], numbers) - column["mean"]) / column["std"])[:, None])
        if column["indicator"]:
            parts.append(missing[:, None])
    return np.concatenate(parts, axis=1, dtype=np.float32) if parts else np.zeros((table.num_rows, 0), np.float32)


class StreamedRows(IterableDataset):
    """One split's rows of row groups (`units`, pyarrow fragments read with `schema`), in batches of `batch_size`
    (inputs, class indices): this process's share by `planned` (`plan`), each DataLoader worker its own part of it.
    `shuffle`: each epoch the worker's row groups in a seeded order and each one's rows permuted (rows mix within a
    row group, not across). Codes under `codes` (one .npy file a unit) say each row's split."""

    def __init__(self, units: list, schema: pa.Schema, codes: Path, split: str, state: dict, labels: tuple,
                 planned: list[tuple], batch_size: int, shuffle: bool, seed: int, rank: int) -> None:  # fmt: skip
        self.units, self.schema, self.codes, self.split, self.state = units, schema, codes, split, state
        self.label_values, self.label_index = labels  # the label column's values, and each one's class index
        self.planned, self.batch_size, self.shuffle, self.seed, self.rank = planned, batch_size, shuffle, seed, rank
        self.epoch = 0
        self.columns = [column["name"] for column in state["columns"]] + [state["label"]]

    def __len__(self) -> int:
        return sum(batches for _, _, batches in self.planned)

    def unit_rows(self, unit: int, order: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        """Unit `unit`'s rows of this split (permuted by `order`), as inputs and class indices."""
        table = self.units[unit].to_table(schema=self.schema, columns=self.columns)
        table = table.filter(pa.array(np.load(self.codes / f"{unit}.npy") == CODES[self.split]))
        position = pc.index_in(table.column(self.state["label"]), value_set=self.label_values).to_numpy()
        inputs, targets = features(self.state, table), self.label_index[position]
        if order is None:
            return inputs, targets
        permuted = order.permutation(len(targets))  # the numbers, not the table's cells (its text): a fifth the time
        return inputs[permuted], targets[permuted]

    def unit_arrays(self, worker: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Worker `worker`'s rows of an epoch, a row group's at a time (inputs, class indices): as many as `planned`
        says, its row groups (and each one's rows) in the epoch's seeded order when shuffled."""
        units, rows, batches = self.planned[worker]
        order = np.random.default_rng([self.seed, self.epoch, self.rank, worker]) if self.shuffle else None
        wanted = rows + max(0, batches - math.ceil(rows / self.batch_size)) * self.batch_size  # padded: whole batches
        # A process of no row group of its own (fewer units than processes) pads with the others'.
        cycle = units or list(range(len(self.units)))
        while wanted > 0:
            for unit in order.permutation(cycle) if order is not None else cycle:
                inputs, targets = self.unit_rows(int(unit), order)
                yield inputs[:wanted], targets[:wanted]
                wanted -= min(wanted, len(targets))
                if wanted == 0:
                    return

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches as views of each row group's arrays; one across two row groups is the one copied."""
        info = get_worker_info()
        size, held = self.batch_size, None  # held: rows short of a batch, finished by the next row group's
        for inputs, targets in read_ahead(self.unit_arrays(info.id if info is not None else 0)):
            start = 0
            if held is not None:
                start = size - len(held[1])
                held = np.concatenate([held[0], inputs[:start]]), np.concatenate([held[1], targets[:start]])
                if len(held[1]) < size:  # a row group of fewer rows than the batch lacks
                    continue
                yield torch.from_numpy(held[0]), torch.from_numpy(held[1])
            while len(targets) - start >= size:
                yield torch.from_numpy(inputs[start : start + size]), torch.from_numpy(targets[start : start + size])
                start += size
            held = (inputs[start:], targets[start:]) if start < len(targets) else None
        if held is not None:
            yield torch.from_numpy(held[0]), torch.from_numpy(held[1])


def read_ahead(items: Iterator) -> Iterator:
    """`items`, each next one made in a thread while the caller works on the one before (Arrow's reading and numpy's
    arithmetic release the GIL): one ahead at most. Stopped early (an exception, a loop that breaks, the iterator
    dropped), nothing more is asked of `items`; the one in the making is finished by the thread, which then ends. Not
    waited for: the iterator may be dropped, and this closed, in the thread itself (the garbage collector)."""
    done, pool = object(), ThreadPoolExecutor(1, thread_name_prefix=READ_AHEAD)
    try:
        coming = pool.submit(next, items, done)
        while (item := coming.result()) is not done:
            coming = pool.submit(next, items, done)
            yield item
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


class EpochLoader(DataLoader):
    """A DataLoader of a StreamedRows that tells it the epoch as each epoch's iteration starts: `epoch()`, Lightning's
    current one (a resumed fit shuffles as an uninterrupted one), or without a Trainer (None) the iterations so far;
    workers get their copy after it."""

    def __init__(self, dataset: StreamedRows, epoch: Callable[[], int | None], num_workers: int = 0) -> None:
        super().__init__(dataset, batch_size=None, num_workers=num_workers)
        self.epoch_of, self.iterations = epoch, 0

    def __iter__(self):
        epoch = self.epoch_of()
        self.dataset.epoch = self.iterations if epoch is None else epoch
        self.iterations += 1
        return super().__iter__()


def check_every_process_has_rows(split: str, planned: list[list[tuple]], units: int) -> None:
    """Evaluation: each process needs rows of its own (`planned` is every process's plan), if the split has any."""
    empty = [rank for rank, workers in enumerate(planned) if not sum(rows for _, rows, _ in workers)]
    if empty and units:
        raise DataError(
            f"{split} split: its rows lie in {units} row group(s), too few for {len(planned)} processes, each of which "
            f"evaluates whole row groups of its own; write the table in more row groups or files (Spark: "
            f"repartition), or run on fewer processes (--trainer.devices, --trainer.num_nodes)"
        )
