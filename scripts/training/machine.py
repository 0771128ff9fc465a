"""The cores this process may run on, which scripts.serve, scripts.sweep and scripts.spark hold their workers,
threads, trials and task slots to.

    python -m scripts.sweep configs/sweeps/penguins.yaml --n_jobs 2
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (a container's or `taskset`'s share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
