"""Learning-rate shapes applied per optimizer step: linear warm-up, then polynomial decay."""

from __future__ import annotations


def warmup_poly_factor(step: int, warmup_steps: int, total_steps: int, power: float) -> float:
    """Multiplier of the base lr at `step`: 0 -> 1 over `warmup_steps`, then (1 - progress)^power.

    `power=0` keeps the lr constant after warm-up; `power=1` is linear decay to zero at the end.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if power == 0 or total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return (1.0 - progress) ** power
