"""ModelCheckpoint whose last.ckpt is the state to resume from: recent during fit, the final one after it.

Lightning 2.6 writes last.ckpt only in a step that also wrote a top-k checkpoint, so with
`save_top_k: 1` last.ckpt was a copy of best.ckpt, and resuming from it silently dropped every
epoch since the best one (up to EarlyStopping's patience). Here last.ckpt is written at the end
of an epoch once `last_every_s` seconds have passed since it was last written, and always when
fit ends (also when EarlyStopping ends it). The CLI adds it as `checkpoint`:

    python -m scripts.train fit --config configs/penguins.yaml --ckpt_path outputs/<exp>/<run>/checkpoints/last.ckpt
"""

from __future__ import annotations

import time

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class BestAndLastCheckpoint(ModelCheckpoint):
    """
    Args:
        last_every_s: least seconds between two writes of last.ckpt during fit; 0 writes it every
            epoch. What a killed run (a preempted node) can lose; a checkpoint write costs a few
            ms for small nets (as much as a whole penguin epoch), seconds for large ones.
        *args, **kwargs: Lightning's `ModelCheckpoint` (monitor, filename, save_last, ...).
    """

    def __init__(self, *args, last_every_s: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.last_every_s = last_every_s
        self._last_written_at = float("-inf")
        self._last_written_step = -1

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict, final: bool = False) -> None:
        # Lightning calls this right after writing a new best; the hooks below at epoch and fit end.
        recent = time.monotonic() - self._last_written_at < self.last_every_s
        # Every rank must agree: Trainer.save_checkpoint waits at a barrier. Rank 0's clock decides.
        recent = trainer.strategy.broadcast(recent)
        if not self.save_last or self._last_written_step == trainer.global_step or (recent and not final):
            return
        super()._save_last_checkpoint(trainer, monitor_candidates)
        self._last_written_at, self._last_written_step = time.monotonic(), trainer.global_step

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.fast_dev_run:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer), final=True)
