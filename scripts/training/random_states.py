"""A resumed fit draws the random numbers the uninterrupted one would have: every checkpoint holds the process's random
generators (torch's, this device's CUDA one, NumPy's, Python's) as they were when it was written, at an epoch's end,
and a fit resumed from it sets them back before its first epoch. Dropout masks, a DataLoader's shuffled order and its
random crops and flips in the main process then go on as they would have (tests/test_checkpoint.py).

Lightning's Trainer saves none of them (Fabric's own checkpoints can). They are restored when Lightning restores the
callbacks, before the sanity check (which Lightning runs with its own generators put back afterwards) and before
the first training batch is drawn. Each process of a run restores rank 0's generators, the checkpoint's: those are
every rank's where seed_everything seeded each process alike and each drew the same numbers (DDP's steps of one
shape). Not restored: a DataLoader worker's own generator (persistent workers keep drawing from theirs, a resumed fit
starts new ones), and a module's or datamodule's own torch.Generator (MNIST seeds its warps anew every epoch instead).
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch


class RandomStates(L.Callback):
    """Installed in every Trainer by scripts.train (TemplateCLI.instantiate_trainer)."""

    def __init__(self) -> None:
        self.device: torch.device | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.device = trainer.strategy.root_device

    def state_dict(self) -> dict[str, Any]:
        # NumPy's as plain values and a tensor: checkpoints are read with torch.load(weights_only=True).
        _, key, position, has_gauss, gauss = np.random.get_state()
        numpy = {"key": torch.from_numpy(key.astype(np.int64)), "pos": position, "has_gauss": has_gauss, "gauss": gauss}
        state = {"torch": torch.get_rng_state(), "numpy": numpy, "python": random.getstate()}
        if self.device is not None and self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        numpy = state_dict["numpy"]
        key = numpy["key"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", key, numpy["pos"], numpy["has_gauss"], numpy["gauss"]))
        random.setstate(state_dict["python"])
        if "cuda" in state_dict and self.device is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state_dict["cuda"], self.device)
