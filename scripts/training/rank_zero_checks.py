"""What only global rank 0 can check, its own disk (--checkpoint_dir, --model_dir), in one of several processes that
a launcher started (torchrun, Azure ML): rank 0 stopping alone before the processes meet left the others waiting for
it until torch.distributed's timeout (30 minutes). Its error waits instead, and once the processes meet, before
anything of the run is touched, every process raises it: one line in each. Installed by scripts.train."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L

from strategies.launch_check import launched_first, launched_processes


class RankZeroChecks(L.Callback):
    def __init__(self) -> None:
        self.error: Exception | None = None

    def check(self, check: Callable[..., None], *args: Any) -> None:
        """Runs `check(*args)` in global rank 0 alone; its error is raised at once unless a launcher started others."""
        if not launched_first():
            return
        if launched_processes() == 1:  # alone, or Lightning starts the others after this: nobody waits yet
            check(*args)
            return
        try:
            check(*args)
        except Exception as error:
            self.error = self.error or error

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        error = trainer.strategy.broadcast(self.error, src=0) if trainer.world_size > 1 else self.error
        if error is not None:
            raise error
