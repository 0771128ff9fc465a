"""The benches' clock: training samples/s of an epoch across all processes, the same for every Lightning variant a
bench compares (the template's module logs its own `train_samples_per_sec` alike: lightning_modules/classifier.py);
and their command lines: `count`, the whole numbers their options take, and `BenchParser`, whose mistakes are one
line.

    python -m scripts.bench.mnist --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import lightning as L
import torch


class EpochThroughput(L.Callback):
    """Logs `bench_samples_per_sec`: the epoch's training samples over the time from its start to its last batch's
    end (validation is not counted)."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.samples, self.seconds, self.started = 0, 0.0, time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx == trainer.num_training_batches - 1 and pl_module.device.type == "cuda":
            # Nothing in a step waits for the GPU: without this the clock would stop while the GPU still works on
            # the last steps queued, which over a short epoch (a bench's few batches) flatters the rate.
            torch.cuda.synchronize(pl_module.device)
        self.samples += len(batch[0]) * trainer.world_size  # every rank gets an equal share of the data
        self.seconds = time.perf_counter() - self.started

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.samples:
            pl_module.log("bench_samples_per_sec", self.samples / max(self.seconds, 1e-9))


def count(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high` (None: no bound above); anything else is argparse's
    error naming the option, before the bench starts anything."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            wanted = f"{low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"{value}: give {wanted}")
        return value

    return parse


class BenchParser(argparse.ArgumentParser):
    """argparse, but a mistake is one line and exit status 1, as every command of the template says it."""

    def error(self, message: str):
        sys.exit(f"error: {message}")
