"""What every task's datamodule gives the rest of the template, stated once: `ClassificationDataModule`.

scripts.train parses `data:` as a subclass of it (a datamodule of your own must derive from it), links its
`class_names` to the model's, prints `predict_names` beside the answers, and the datamodules below use its batch size
and seed. `EvaluationShard` makes validation and test under several processes exact.

    python -m scripts.train fit --config configs/penguins.yaml --data.init_args.batch_size 32
"""

from __future__ import annotations

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
