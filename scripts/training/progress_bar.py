"""The progress bar of the fits, validations and tests scripts.train runs: Lightning's TQDM bar, redrawn at most every
REDRAW_S seconds (tqdm's own default interval) and at each loop's last batch, instead of at every batch.

    python -m scripts.train fit --config configs/mnist.yaml    # this bar: the config names none

Lightning's bar redraws at every batch (refresh_rate 1), twice in training (the count, then the metrics), and
tqdm's interval does not apply to it (Lightning calls refresh()): a share of every short step, larger into a file
(an Azure ML job's log) than on a terminal, and larger on a GPU (docs/measured.md has the figures). Only the
batch-end hooks are held back; when one is let through, Lightning's draws as it always does. A config that names a
progress bar in trainer.callbacks keeps its own (TemplateCLI.instantiate_trainer).
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

REDRAW_S = 0.1


class ThrottledProgressBar(TQDMProgressBar):
    def __init__(self, redraw_s: float = REDRAW_S, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.redraw_s = redraw_s
        self.drawn_at = float("-inf")  # the first batch is drawn

    def due(self, count: int, total: int | float | None) -> bool:
        """Whether a bar at `count` of `total` batches is to be drawn now."""
        now = time.monotonic()
        if count == total or now - self.drawn_at >= self.redraw_s:
            self.drawn_at = now
            return True
        return False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        if self.due(batch_idx + 1, self.train_progress_bar.total):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        if self.due(batch_idx + 1, self.val_progress_bar.total):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        if self.due(batch_idx + 1, self.test_progress_bar.total):
            super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        if self.due(batch_idx + 1, self.predict_progress_bar.total):
            super().on_predict_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
