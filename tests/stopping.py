"""A callback that kills its own process at an exact point of a fit, for the resume tests (named by class path on the
command line: `--trainer.callbacks '[{class_path: tests.stopping.KillAt, init_args: {...}}]'`)."""

from __future__ import annotations

import os
import signal

import lightning as L


class KillAt(L.Callback):
    """SIGKILL in `hook` ("on_validation_end" or "on_train_epoch_end") of epoch `epoch`; at an epoch's end before the
    module's hook and the checkpoints (Lightning calls checkpoint callbacks last)."""

    def __init__(self, hook: str, epoch: int) -> None:
        self.hook, self.epoch = hook, epoch

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.maybe_kill("on_validation_end", trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.maybe_kill("on_train_epoch_end", trainer)

    def maybe_kill(self, hook: str, trainer: L.Trainer) -> None:
        if hook == self.hook and trainer.current_epoch == self.epoch and not trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGKILL)
