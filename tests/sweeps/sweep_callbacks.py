"""Callbacks the sweep tests add to every trial through a config of their own; each acts only in the trial trained
with a seed it names (a sweep's trial n trains with the sweep's seed plus n), never in the sweep's own check fit.

    trainer: {callbacks: [{class_path: tests.sweeps.sweep_callbacks.Fault, init_args: {abort_seed: 8, hang_seed: 9}}]}
"""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path

import lightning as L


def trial_seed() -> int:
    return int(os.environ.get("PL_GLOBAL_SEED", "-1"))  # what seed_everything set


class Fault(L.Callback):
    """At the first training epoch's start: os.abort() (SIGABRT, as a crash in native code ends a process) in the fit
    seeded `abort_seed`; in the one seeded `hang_seed`, sleep for good, deaf to SIGTERM (only SIGKILL ends it)."""

    def __init__(self, abort_seed: int = -1, hang_seed: int = -1) -> None:
        self.abort_seed, self.hang_seed = abort_seed, hang_seed

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trial_seed() == self.abort_seed:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the repository
            os.abort()
        if trial_seed() == self.hang_seed:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)


class Scripted(L.Callback):
    """Logs `val_score` at every validation's end: `scores[seed][epoch]` for the fit of that seed (its last value
    after its list ends), 1.0 for any other. The fit seeded with a key of `wait_for` holds at its first epoch until
    that file exists (a test decides when a trial may go on)."""

    def __init__(self, scores: dict[str, list[float]] | None = None, wait_for: dict[str, str] | None = None) -> None:
        self.scores, self.wait_for = scores or {}, wait_for or {}

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        hold = self.wait_for.get(str(trial_seed()))
        while hold and trainer.current_epoch == 0 and not Path(hold).exists():
            time.sleep(0.2)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        scores = self.scores.get(str(trial_seed()), [1.0])
        pl_module.log("val_score", scores[min(trainer.current_epoch, len(scores) - 1)])
