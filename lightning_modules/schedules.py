"""The classification module's own learning-rate schedule: linear warm-up, then polynomial decay, stepped every
optimizer step. Loaded only when model.warmup_steps or model.poly_decay_power is set (configs/mnist.yaml).

    python -m scripts.train fit --config configs/mnist.yaml --model.warmup_steps 300 --model.poly_decay_power 1.0
"""

from __future__ import annotations

from functools import partial

import torch


def warmup_poly_factor(step: int, warmup_steps: int, total_steps: int, power: float) -> float:
    """Multiplier of the base lr at optimizer step `step`: 0 -> 1 over `warmup_steps`, then (1 - progress)^power (0:
    constant; 1: linear decay to zero at the end)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if power == 0 or total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return (1.0 - progress) ** power


def warmup_poly_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, power: float) -> dict:
    """Lightning's lr_scheduler configuration of `warmup_poly_factor` over `total_steps` optimizer steps."""
    factor = partial(warmup_poly_factor, warmup_steps=warmup_steps, total_steps=total_steps, power=power)
    return {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, factor), "interval": "step"}
