"""What a fit of several processes needs and a fit of one does not, installed by scripts.train's CLI when a launcher
started this process or the Trainer runs more than one:

- the launch checked against the Trainer (strategies/launch_check.py);
- SameStart, the one exchange at the start: same options, rank 0's own checks, same resume (same_start.py);
- StopTogether: SIGTERM stops every process at the same point (sigterm.py);
- the watch of torch.distributed's meeting, so that a process that stops before it ends the others (early_stops.py).

    torchrun --nproc_per_node 2 -m scripts.train fit --config configs/penguins.yaml --config configs/trainer/ddp.yaml \\
        --trainer.accelerator cpu --trainer.devices 2
"""

from __future__ import annotations

import lightning as L

from scripts.training.early_stops import watch
from scripts.training.same_start import SameStart
from scripts.training.sigterm import StopTogether
from strategies.launch_check import check_launch

__all__ = ["SameStart", "install"]


def install(trainer: L.Trainer, same_start: SameStart) -> None:
    check_launch(trainer.num_devices, trainer.num_nodes)
    trainer.callbacks.insert(0, same_start)  # first: before anything is restored, or the run's record touched
    trainer.callbacks.append(StopTogether())  # not in trainer.callbacks' option: a config's list would drop it
    watch()  # until the processes meet: one that stops before ends this one too
