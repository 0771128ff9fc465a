"""What every task's datamodule gives the rest of the template: `ClassificationDataModule`; `InMemoryDataModule`, whose
batches are slices of tensors in memory (penguins, MNIST, any table); and a split by a seeded hash of each row, so that
editing rows moves no other row and exact copies share a split, with the data's identity every checkpoint keeps.

    python -m scripts.train fit --config configs/penguins.yaml --data.init_args.batch_size 32
"""

from __future__ import annotations

import hashlib
import importlib
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal

import lightning as L
import numpy as np
import torch

from datamodules.errors import DataError


class LazyFunction:
    """A class attribute that is the function `module:name`, imported when first read: serving code out of a fit."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __get__(self, instance: object, owner: type) -> Callable:
        module, _, name = self.path.partition(":")
        return getattr(importlib.import_module(module), name)


class ClassificationDataModule(L.LightningDataModule):
    """The CLI parses `data:` as a subclass of this one; docs/tasks.md ("a datamodule of your own") says what each
    member is for. Batches are `(inputs, labels)`, `(inputs,)` to predict. `batch_size`: per step and process; `seed`:
    of the data's own randomness (the split; shuffling is Lightning's seed_everything), alike in every process."""

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
            from datamodules.preprocessing.images import example_png

            return [example_png()]
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
        if getattr(self, "identity", None):  # the data the fit saw (`data_identity`)
            state["identity"] = self.identity
        return state

    def load_state_dict(self, state: dict) -> None:
        # After setup, before the dataloaders are made (or when Lightning builds a datamodule from a checkpoint).
        self.checkpoint_serving_state: dict | None = state.get("serving")
        for name, trained in state.get("preprocessing", {}).items():
            if self.hparams[name] != trained and (self.trainer is None or self.trainer.is_global_zero):
                print(
                    f"data.init_args.{name}: {trained!r} as the checkpoint's network was trained, not the config's "
                    f"{self.hparams[name]!r}",
                    file=sys.stderr,
                )
            self.hparams[name] = trained
        trained, given = state.get("identity") or {}, getattr(self, "identity", None) or {}
        same_data = (trained.get("split"), trained.get("digest")) == (given.get("split"), given.get("digest"))
        if hasattr(self, "resplit") and given and not same_data:
            from datamodules.split_check import check_trained  # split by the checkpoint's rule; what differs said

            check_trained(self, state.get("identity"))

    @property
    def rank_and_world_size(self) -> tuple[int, int]:  # (0, 1) without a Trainer
        return (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    if not (val_fraction >= 0 and test_fraction >= 0 and val_fraction + test_fraction < 1):
        raise DataError(
            f"data.init_args.val_fraction {val_fraction} + test_fraction {test_fraction}: give fractions of 0 or "
            "more that leave rows to train on (a sum below 1)"
        )


METHOD, SPLITS = "row hash", ("train", "val", "test")


def row_hashes(frame) -> np.ndarray:
    """One 64-bit hash per row of a pandas DataFrame, of its cells in its column order (not of its position); a
    number hashes as its text, so that a CSV's rows (cells read as text) and a Parquet file's hash alike: pandas'
    hashing of the cells as Python objects, without its leak (datamodules/row_hash.py)."""
    from datamodules.row_hash import frame_hashes

    return frame_hashes(frame)


def mixed(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: each bit of a value moves about half of the result's (uint64 wraps around)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def split_rule(seed: int, val_fraction: float, test_fraction: float, columns: list, id_column=None) -> dict:
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
    share = hash_shares(rule["seed"], hashes)
    val, held_out = share < fractions[0], share < sum(fractions)
    return tuple(torch.from_numpy(part.nonzero()[0]) for part in (~held_out, val, held_out & ~val))


def hash_shares(seed: int, hashes: np.ndarray) -> np.ndarray:
    """Each 64-bit hash mixed with the seed, as a share of all 64-bit values: uniform in [0, 1)."""
    mix = mixed(np.array([seed & (2**64 - 1)], dtype=np.uint64))
    return (mixed(hashes ^ mix) >> np.uint64(11)).astype(np.float64) / 2.0**53


def digest(hashes: np.ndarray) -> str:
    """The rows' digest, of their hashes sorted: the same rows in another order are the same data."""
    return hashlib.sha256(np.sort(hashes).tobytes()).hexdigest()[:16]


def data_identity(source: str, content: np.ndarray, keys: np.ndarray | None, rule: dict, schema: dict,
                  parts: tuple) -> dict:  # fmt: skip
    """The data's source, digest (of `content`, the rows' hashes), rows, split rule, schema (column: kind), each split's
    digest and rows, and the rows' `keys` (the hashes split by, sorted: a later command counts rows added, removed;
    None: not kept, image folders keep their files' instead)."""
    splits = {name: {"digest": digest(content[rows.numpy()]), "rows": len(rows)} for name, rows in zip(SPLITS, parts)}
    kept = {} if keys is None else {"row_hashes": torch.from_numpy(np.sort(keys).view(np.int64))}
    return {"source": source, "digest": digest(content), "rows": len(content), "split": rule, "schema": schema,
            "splits": splits, **kept}  # fmt: skip


COPIES_SAID: set[tuple[str, int]] = set()  # (table, count) already said in this process


def say_copies(count: int, where: str, trainer) -> None:
    """One line on stderr (global rank 0) for rows that are exact copies of others, which the split keeps together:
    once per table and process, where a datamodule's setup runs again for each stage (fit, test, registration)."""
    if count and (trainer is None or trainer.is_global_zero) and (where, count) not in COPIES_SAID:
        COPIES_SAID.add((where, count))
        print(
            f"{where}: {count} row{'s are exact copies' if count > 1 else ' is an exact copy'} of others (every column "
            "and the label): each kept in one split with its copies, so none is both trained and tested on",
            file=sys.stderr,
        )


class InMemoryBatches:
    """Batches of `tensors` (of one length), this rank's share of a seeded permutation (`shuffle`) or of their order;
    `pad`: every rank the same number of batches (training's gradient all-reduce waits for each)."""

    def __init__(self, *tensors: torch.Tensor, batch_size: int, shuffle: bool = False, seed: int = 0, rank: int = 0,
                 world_size: int = 1, pad: bool = True) -> None:  # fmt: skip
        if not tensors or any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError("InMemoryBatches needs one or more tensors of the same length")
        self.tensors, self.batch_size, self.shuffle, self.seed = tensors, batch_size, shuffle, seed
        self.rank, self.world_size, self.pad, self.epoch = rank, world_size, pad, 0

    batch_sampler = None  # what Lightning inspects on DataLoaders: there is none here

    @property
    def sampler(self) -> InMemoryBatches:
        # Lightning calls `loader.sampler.set_epoch(epoch)`: a resumed fit draws an uninterrupted one's permutations.
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def samples_per_rank(self) -> int:
        n = len(self.tensors[0])
        if self.pad:
            return math.ceil(n / self.world_size)  # as DistributedSampler pads: repeating the first indices
        return len(range(self.rank, n, self.world_size))  # evaluation: each row once, shards differ by one at most

    def __len__(self) -> int:
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
            # index_select copies whole rows: a third of `t[indices]`'s time on MNIST's images (docs/measured.md).
            data = tuple(t.index_select(0, indices) for t in self.tensors)
        for i in range(len(self)):
            start = i * self.batch_size
            yield tuple(t[start : start + self.batch_size] for t in data)


class InMemoryDataModule(ClassificationDataModule):
    """Its `setup` puts each split's tensors in `self.splits` ("train", "val", "test", "predict")."""

    evaluate_in_one_batch = False  # True: validation, test and predict each take one slice of the whole split

    def __init__(self, batch_size: int, seed: int) -> None:
        super().__init__(batch_size, seed)
        self.splits: dict[str, tuple[torch.Tensor, ...]] = {}

    def batches(self, split: str, shuffle: bool = False) -> InMemoryBatches:
        training = split == "train"
        rank, world_size = self.rank_and_world_size
        if not training and world_size > 1:  # evaluation shards are not padded: each process needs a row of its own
            from datamodules.evaluation_shard import check_shardable

            check_shardable(split, len(self.splits[split][0]), world_size)
        batch_size = self.batch_size if training or not self.evaluate_in_one_batch else len(self.splits[split][0])
        return InMemoryBatches(*self.splits[split], batch_size=batch_size, shuffle=shuffle, seed=self.seed, rank=rank,
                               world_size=world_size, pad=training)  # fmt: skip

    def train_dataloader(self) -> InMemoryBatches:
        return self.batches("train", shuffle=True)

    def val_dataloader(self) -> InMemoryBatches:
        return self.batches("val")

    def test_dataloader(self) -> InMemoryBatches:
        return self.batches("test")

    def predict_dataloader(self) -> InMemoryBatches:
        return self.batches("predict")
