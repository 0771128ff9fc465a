"""Training throughput per epoch (samples/s across all processes), as the Azure ML designer reports images/s."""

from __future__ import annotations

import time

import lightning as L


class EpochThroughput(L.Callback):
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.samples = 0
        self.started = self.last_batch_end = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.samples += len(batch[0])
        self.last_batch_end = time.perf_counter()  # so validation time is not counted

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        seconds = max(self.last_batch_end - self.started, 1e-9)
        # Every rank gets an equal share of the data, so the total is this rank's times world size.
        pl_module.log("train_samples_per_sec", self.samples * trainer.world_size / seconds)
