"""What a fit of several processes needs and a fit of one does not, installed by scripts.train's CLI when a launcher
started this process or the Trainer runs more than one:

- the launch checked against the Trainer (strategies/launch_check.py);
- checkpoints read once, by global rank 0, for every process: nodes share no disk (`RankZeroCheckpointIO`);
- SameStart, the one exchange at the start: same options, rank 0's own checks, same resume (same_start.py);
- StopTogether: SIGTERM stops every process at the same point (sigterm.py);
- the watch of torch.distributed's meeting, so that a process that stops before it ends the others (early_stops.py).

    torchrun --nproc_per_node 2 -m scripts.train fit --config configs/penguins.yaml --config configs/trainer/ddp.yaml \\
        --trainer.accelerator cpu --trainer.devices 2
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.strategies import Strategy

from scripts.training.checkpoints import WholeCheckpointIO
from scripts.training.early_stops import watch
from scripts.training.from_checkpoint import check_checkpoint_file
from scripts.training.same_start import SameStart
from scripts.training.sigterm import StopTogether
from strategies.launch_check import check_launch


class RankZeroCheckpointIO(WholeCheckpointIO):
    """Global rank 0 reads a checkpoint for every process (which need not have the file) and broadcasts it."""

    def __init__(self, strategy: Strategy) -> None:
        super().__init__()
        self.strategy = strategy

    def load_checkpoint(
        self,
        path: str | Path,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if self.strategy.world_size == 1:
            return super().load_checkpoint(path, map_location, weights_only)
        loaded: tuple[dict | None, BaseException | None] = (None, None)
        if self.strategy.is_global_zero:
            try:  # on the CPU: the broadcast pickles it, and Lightning moves the state to each process's device
                check_checkpoint_file(path)  # a missing --ckpt_path: check_ckpt_path leaves it to this read
                loaded = (super().load_checkpoint(path, "cpu", weights_only), None)
            except Exception as error:
                loaded = (None, error)
        checkpoint, error = self.strategy.broadcast(loaded, src=0)
        if error is not None:
            raise error
        return checkpoint


def made_same_start(cli) -> SameStart:
    """The TemplateCLI `cli`'s SameStart (scripts/training/cli.py), made the first time a command needs it."""
    if cli.same_start is None:
        cli.same_start = SameStart()
    return cli.same_start


def check_on_rank_zero(cli, check: Callable, *args) -> None:
    """TemplateCLI.check_on_rank_zero under a launcher: `check(*args)` in global rank 0 alone (SameStart)."""
    made_same_start(cli).check_on_rank_zero(check, *args)


def install(trainer: L.Trainer, cli) -> None:
    """Into `trainer`, of the TemplateCLI `cli`."""
    same_start, config = made_same_start(cli), cli.config[cli.subcommand]
    same_start.ckpt_path, same_start.checkpoint_dir = config.get("ckpt_path"), config.get("checkpoint_dir")
    same_start.resumes = cli.resumes
    check_launch(trainer.num_devices, trainer.num_nodes)
    if type(trainer.strategy.checkpoint_io) is WholeCheckpointIO:  # a user's own plugin is left alone
        trainer.strategy.checkpoint_io = RankZeroCheckpointIO(trainer.strategy)
    trainer.callbacks.insert(0, same_start)  # first: before anything is restored, or the run's record touched
    trainer.callbacks.append(StopTogether())  # not in trainer.callbacks' option: a config's list would drop it
    watch()  # until the processes meet: one that stops before ends this one too
