"""What every task's datamodule gives the rest of the template, stated once: `ClassificationDataModule`.

scripts.train parses `data:` as a subclass of it (a datamodule of your own must derive from it), links its
`class_names` to the model's, prints `predict_names` beside the answers, and the datamodules below use its batch size
and seed. `EvaluationShard` makes validation and test under several processes exact. For splits that are tensors
already in memory (penguins, MNIST, any table), `InMemoryDataModule` and its `InMemoryBatches` stand in for
DataLoaders: every epoch a seeded permutation, this rank's share of it, and slices of the permuted tensors (one gather
a batch instead of `batch_size` calls to `__getitem__`); `stratified_split` splits rows by class.

    python -m scripts.train fit --config configs/penguins.yaml --data.init_args.batch_size 32
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Sized
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from torch.utils.data import DistributedSampler

from datamodules.errors import DataError


class ClassificationDataModule(L.LightningDataModule):
    """
    Args:
        batch_size: samples per step and process.
        seed: of the data's own randomness (the validation split; shuffling is Lightning's seed_everything), the same
            on every process.

    Subclasses also provide:
        class_names: label names in index order (logit i is class i), read by the CLI right after `__init__` (it gives
            them to the model before `setup`): a class attribute, or a property that reads them from the data (the
            table's label column, birds' class folders); at validate, test and predict the checkpoint's (a datamodule
            that takes a `classes` argument is given them, and needs no training data to name them).
        predict_names: after `setup("predict")`, one name per input, in order (a file, a CSV line).
        preprocessing_options: the names of the `__init__` arguments that decide what the network sees (a scaling,
            a crop size): every checkpoint keeps their values, and validate, test, predict and a resumed fit use the
            checkpoint's, saying so on stderr where the config gives others. A subclass that keeps more state
            extends `state_dict` and `load_state_dict`.
    Batches are `(inputs, labels)`, `(inputs,)` to predict.

    Serving (`fit --register_model`, scripts.serve, scripts.score, `mlflow models serve`, Azure ML endpoints, Spark)
    runs the registered model, an MLflow pyfunc that needs neither torch nor Lightning; it asks the datamodule how a raw
    input becomes the network's input, so that it answers as predict does:
        serving_kind: "rows" (a table: a pandas DataFrame, JSON objects or CSV rows) or "images" (encoded image files);
            None: the network registers without a pyfunc and cannot be served.
        serving_state(): after `setup`, the JSON-able values the preprocessing needs (training statistics, a crop
            size); saved in every checkpoint and in the registered model, so a checkpoint serves without its data
            (`checkpoint_serving_state`).
        serving_preprocess: a plain function `(state, inputs, names) -> numpy float32 batch`, set as
            `staticmethod(function)`: given that state, rows as a pandas DataFrame (in the source's own column names)
            or images as a list of encoded bytes, and one name per input for messages, it returns the network's input
            batch, or raises DataError naming the input and what to send. It must live in a module that imports only
            numpy, pandas, Pillow, datamodules.errors and datamodules.preprocessing (never torch or Lightning): the
            registered model ships that module and runs it where there is no torch. A state holding
            `"fills_missing_cells": True` says that it answers rows with empty cells (by a policy of its own): batch
            scoring then gives it every row, where it otherwise skips a row with an empty cell, naming it.
        serving_example(): raw inputs for the model's input example (rows: a DataFrame; images: a list of encoded
            images; the default makes one PNG).
        serving_columns(): rows: every column a request may hold (the model's signature; others are dropped); the
            default is the example's.
        serving_column_kinds(): rows: "numeric" or "categorical" by column, as the preprocessing reads them (the
            registered model's metadata `columns`); the default, {}, says nothing.
        Both are called on the datamodule after `setup` (or on one rebuilt from a checkpoint, whose serving state
        `checkpoint_serving_state` holds), so columns that come from the data (the table task's) can be stated: a
        classmethod does as well where they are fixed.
    `serving_batch` gives serving_preprocess's batch as a tensor, for a datamodule's own predict.
    """

    serving_kind: ClassVar[Literal["rows", "images"] | None] = None

    class_names: list[str]
    predict_names: list[str]
    preprocessing_options: tuple[str, ...] = ()

    def __init__(self, batch_size: int, seed: int) -> None:
        super().__init__()
        if batch_size < 1:
            raise DataError(f"data.init_args.batch_size {batch_size}: give 1 or more (samples per step and process)")
        self.batch_size, self.seed = batch_size, seed

    def serving_state(self) -> dict:
        return {}

    serving_preprocess: ClassVar[Callable[[dict, Any, list[str]], Any] | None] = None

    def serving_example(self) -> Any:
        if self.serving_kind == "images":
            import io

            import numpy as np
            from PIL import Image

            y, x = np.mgrid[0:64, 0:64]
            picture = np.stack([x * 4, y * 4, (x + y) * 2], -1).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(picture).save(buffer, format="PNG")
            return [buffer.getvalue()]
        raise NotImplementedError(f"{type(self).__name__}: give serving_example(), a DataFrame of raw rows")

    def serving_columns(self) -> list[str]:
        return list(self.serving_example().columns) if self.serving_kind == "rows" else ["image"]

    def serving_column_kinds(self) -> dict[str, str]:
        return {}

    @classmethod
    def serving_batch(cls, state: dict, inputs: Any, names: list[str]) -> torch.Tensor:
        if cls.serving_preprocess is None:
            raise NotImplementedError(f"{cls.__name__} does not say how to serve its inputs (serving_preprocess)")
        return torch.from_numpy(cls.serving_preprocess(state, inputs, names))

    def state_dict(self) -> dict:
        state = {"preprocessing": {name: self.hparams[name] for name in self.preprocessing_options}}
        if self.serving_kind is not None:  # Lightning saves it while fitting, after setup
            state["serving"] = self.serving_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        # Lightning calls it with the checkpoint's state after setup, before the dataloaders are made (and when it
        # builds a datamodule from a checkpoint).
        self.checkpoint_serving_state: dict | None = state.get("serving")
        for name, trained in state.get("preprocessing", {}).items():
            if self.hparams[name] != trained and (self.trainer is None or self.trainer.is_global_zero):
                print(
                    f"data.init_args.{name}: {trained!r} as the checkpoint's network was trained, not the config's "
                    f"{self.hparams[name]!r}",
                    file=sys.stderr,
                )
            self.hparams[name] = trained

    def images_to_show(self, inputs: torch.Tensor) -> torch.Tensor:
        """Image inputs (N, C, H, W) as the network takes them, back in [0, 1] for a person to look at (the evaluation's
        most confident mistakes: scripts/training/run_record.py). A datamodule that normalises its images undoes it
        here; this default stretches each image's values over [0, 1]."""
        low = inputs.amin(dim=(1, 2, 3), keepdim=True)
        high = inputs.amax(dim=(1, 2, 3), keepdim=True)
        return (inputs - low) / (high - low).clamp_min(1e-12)

    @property
    def rank_and_world_size(self) -> tuple[int, int]:
        """This process's rank and the number of processes (0, 1 without a Trainer)."""
        return (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)


def check_shardable(split: str, size: int, world_size: int) -> None:
    """A DataError when an evaluation split of `size` items would leave a process of `world_size` without one item:
    Lightning stops every process with "`DataLoader` within local rank has zero length" otherwise. Every process
    knows both numbers, so all of them stop with this line, none waits in a collective for the others."""
    if 0 < size < world_size:
        raise DataError(
            f"{split} split: {size} item{'s' if size > 1 else ''} for {world_size} processes, each of which evaluates "
            f"its own share (one item at least); give the {split} split {world_size} items or more, or run on "
            f"{size} process{'es' if size > 1 else ''} (--trainer.devices, --trainer.num_nodes)"
        )


class EvaluationShard(DistributedSampler):
    """Rank r of n evaluates items r, r + n, r + 2n, ... of `dataset`: each item once over all processes, so validation
    and test metrics count every item exactly once. Lightning's own DistributedSampler repeats items to even out the
    shards; these may differ by one item, which evaluation allows (no step of it waits for the other processes).
    Being a DistributedSampler, Lightning leaves it in place. `split` ("val", "test") names the dataset in the DataError
    about a split of fewer items than processes."""

    def __init__(self, dataset: Sized, rank: int, world_size: int, split: str = "evaluation") -> None:
        check_shardable(split, len(dataset), world_size)
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=False)
        self.num_samples = len(range(rank, len(dataset), world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """A DataError unless the validation and test fractions are 0 or more and leave rows to train on."""
    if not (val_fraction >= 0 and test_fraction >= 0 and val_fraction + test_fraction < 1):
        raise DataError(
            f"data.init_args.val_fraction {val_fraction} + test_fraction {test_fraction}: give fractions of 0 or "
            "more that leave rows to train on (a sum below 1)"
        )


def stratified_split(
    labels: torch.Tensor, fractions: tuple[float, float], seed: int, copies: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row indices of train, validation and test: disjoint, each class in proportion, seeded. `copies` (one id per
    row, equal for rows that are exact copies of each other: `copy_ids`) keeps every copy of a row in one split: a
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


def say_copies(count: int, where: str, trainer) -> None:
    """One line on stderr (global rank 0) for rows that are exact copies of others, which the split keeps together."""
    if count and (trainer is None or trainer.is_global_zero):
        print(
            f"{where}: {count} row{'s are exact copies' if count > 1 else ' is an exact copy'} of others (every column "
            "and the label): each kept in one split with its copies, so none is both trained and tested on",
            file=sys.stderr,
        )


def copy_ids(frame) -> torch.Tensor:
    """One id per row of a pandas DataFrame, equal for rows equal in every column (an exact copy)."""
    import pandas as pd

    return torch.from_numpy(pd.util.hash_pandas_object(frame, index=False).factorize()[0].astype("int64"))


class InMemoryBatches:
    def __init__(
        self,
        *tensors: torch.Tensor,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        pad: bool = True,
    ) -> None:
        if not tensors or any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError("InMemoryBatches needs one or more tensors of the same length")
        self.tensors = tensors
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.pad = pad
        self.epoch = 0

    batch_sampler = None  # what Lightning inspects on DataLoaders: there is none here

    @property
    def sampler(self) -> InMemoryBatches:
        # Lightning calls `loader.sampler.set_epoch(epoch)` on whatever it iterates, so resumed
        # runs draw the same permutations as uninterrupted ones.
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def samples_per_rank(self) -> int:
        n = len(self.tensors[0])
        if self.pad:
            # Like DistributedSampler(drop_last=False): every rank gets the same count, padding by repeating the
            # first indices, so the gradient all-reduce of a training step never waits on a missing batch.
            return math.ceil(n / self.world_size)
        return len(range(self.rank, n, self.world_size))  # evaluation: each row once, shards differ by one at most

    def __len__(self) -> int:
        if self.drop_last:
            return self.samples_per_rank // self.batch_size
        return math.ceil(self.samples_per_rank / self.batch_size)

    def _indices(self) -> torch.Tensor | None:
        n = len(self.tensors[0])
        if not self.shuffle and self.world_size == 1:
            return None  # plain slices of the originals: zero copies
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator)
        else:
            order = torch.arange(n)
        padded = math.ceil(n / self.world_size) * self.world_size
        if self.pad and padded > n:
            order = torch.cat([order, order[: padded - n]])
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        indices = self._indices()
        self.epoch += 1  # the next epoch reshuffles even where nobody calls set_epoch
        if indices is None:
            data = self.tensors
        else:
            indices = indices.to(self.tensors[0].device)
            # index_select copies whole rows; `t[indices]` gathers element by element: the same bytes, about three
            # times the time on MNIST's images (docs/measured.md).
            data = tuple(t.index_select(0, indices) for t in self.tensors)
        for i in range(len(self)):
            start = i * self.batch_size
            yield tuple(t[start : start + self.batch_size] for t in data)


class InMemoryDataModule(ClassificationDataModule):
    """A datamodule whose `setup` puts each split's tensors in `self.splits[name]` ("train", "val", "test",
    "predict"); its dataloaders are `InMemoryBatches` of them, sharded by rank."""

    evaluate_in_one_batch = False  # True: validation, test and predict each take one slice of the whole split

    def __init__(self, batch_size: int, seed: int) -> None:
        super().__init__(batch_size, seed)
        self.splits: dict[str, tuple[torch.Tensor, ...]] = {}

    def batches(self, split: str, shuffle: bool = False) -> InMemoryBatches:
        training = split == "train"
        rank, world_size = self.rank_and_world_size
        if not training:  # evaluation shards are not padded: each process needs a row of its own
            check_shardable(split, len(self.splits[split][0]), world_size)
        return InMemoryBatches(
            *self.splits[split],
            batch_size=self.batch_size if training or not self.evaluate_in_one_batch else len(self.splits[split][0]),
            shuffle=shuffle,
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            pad=training,
        )

    def train_dataloader(self) -> InMemoryBatches:
        return self.batches("train", shuffle=True)

    def val_dataloader(self) -> InMemoryBatches:
        return self.batches("val")

    def test_dataloader(self) -> InMemoryBatches:
        return self.batches("test")

    def predict_dataloader(self) -> InMemoryBatches:
        return self.batches("predict")
