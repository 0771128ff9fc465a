"""A trial that crashes or hangs, for tests/test_sweep_isolation.py: a callback a test's config adds to every trial,
which acts only in the trial trained with the seed it names (a sweep's trial n trains with its seed plus n).

    trainer: {callbacks: [{class_path: tests.sweep_callbacks.Fault, init_args: {abort_seed: 8, hang_seed: 9}}]}
"""

from __future__ import annotations

import os
import resource
import signal
import time

import lightning as L


class Fault(L.Callback):
    """At the first training epoch's start: os.abort() (SIGABRT, as a crash in native code ends a process) in the fit
    seeded `abort_seed`; in the one seeded `hang_seed`, sleep for good, deaf to SIGTERM (only SIGKILL ends it)."""

    def __init__(self, abort_seed: int = -1, hang_seed: int = -1) -> None:
        self.abort_seed, self.hang_seed = abort_seed, hang_seed

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        seed = int(os.environ.get("PL_GLOBAL_SEED", "-1"))  # what seed_everything set
        if seed == self.abort_seed:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the repository
            os.abort()
        if seed == self.hang_seed:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)
