"""Callbacks that kill their own process at an exact point of a fit (the resume tests), or hold it there (the tracking
outage tests); named by class path on the command line:
`--trainer.callbacks '[{class_path: tests.stopping.KillAt, init_args: {...}}]'`."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

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


class WaitAt(L.Callback):
    """At the end of each epoch in `epochs`: writes `folder/at-<epoch>`, then waits for `folder/go-<epoch>`, while a
    test changes the world around the fit (stops its tracking server, say). SIGUSR1 writes every thread's stack to
    stderr: what a test shows when the fit takes longer than it should."""

    def __init__(self, folder: str, epochs: list[int]) -> None:
        self.folder, self.epochs = Path(folder), epochs
        faulthandler.register(signal.SIGUSR1, all_threads=True, file=sys.stderr)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        if epoch in self.epochs:
            (self.folder / f"at-{epoch}").touch()
            while not (self.folder / f"go-{epoch}").exists():
                time.sleep(0.05)
