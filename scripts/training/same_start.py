"""Every process of a job must start alike, and some cannot know alone whether they do: on nodes that share no disk
each finds its own --checkpoint_dir/last.ckpt (or none), reads its own --config files, and only global rank 0 reads a
--ckpt_path's hyperparameters (LightningCLI gives the module a checkpoint's own) or checks the folders it alone
writes. Processes that differ hang in their first mismatched collective, or train replicas that drift apart.

SameStart checks it once the processes have met, in one exchange, before anything is restored or the run's config
recorded: rank 0 sends what it has (its module's and datamodule's options, the error of a check only it makes), and
every process sends back whether it differs from that and whether it resumes. A difference is one line in every
process. Installed by scripts.train as the Trainer's first callback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch

from scripts.training.checkpoints import CheckpointError, flatten
from strategies.launch_check import launched_first, launched_processes


class SameStart(L.Callback):
    def __init__(self) -> None:
        self.error: Exception | None = None  # of a check rank 0 alone makes (check_on_rank_zero)
        self.ckpt_path: str | None = None  # --ckpt_path, whose hyperparameters only rank 0 may have read
        self.checkpoint_dir: str | None = None  # fit: --checkpoint_dir, which each process looks in on its own disk
        self.resumes = False  # fit: from --checkpoint_dir's last.ckpt, as this process found it

    def check_on_rank_zero(self, check: Callable[..., None], *args: Any) -> None:
        """Runs `check(*args)` in global rank 0 alone (its own disk: --checkpoint_dir, --model_dir). Its error is
        raised at once unless a launcher started other processes, which would wait for this one until
        torch.distributed's timeout (30 minutes): then in every process, once they meet."""
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
        if trainer.world_size == 1:
            if self.error is not None:
                raise self.error
            return
        mine = flatten({"model": dict(pl_module.hparams), "data": dict(getattr(trainer.datamodule, "hparams", {}))})
        mine = {key: value for key, value in mine.items() if "_instantiator" not in key}
        first = trainer.strategy.broadcast({"hyperparameters": mine, "error": self.error}, src=0)
        differ = [key for key in dict.fromkeys([*first["hyperparameters"], *mine])
                  if str(first["hyperparameters"].get(key)) != str(mine.get(key))]  # fmt: skip
        # One-hot flags summed (not all_gather: Lightning's warns of a deprecated torch function in every process):
        # which ranks resume, and how many differ from rank 0.
        flags = torch.zeros(trainer.world_size + 1, device=trainer.strategy.root_device)
        flags[trainer.global_rank] = float(self.resumes)
        flags[-1] = float(bool(differ))
        *resume, differing = trainer.strategy.reduce(flags, reduce_op="sum").tolist()
        if stage == "fit" and self.checkpoint_dir:
            self.check_resume([bool(value) for value in resume])
        if differing:
            self.check_hyperparameters(differ, first["hyperparameters"], mine, trainer.global_rank)
        if first["error"] is not None:
            raise first["error"]

    def check_resume(self, found: list[bool]) -> None:
        """Every process looks for last.ckpt on its own node's disk: some resume and others start anew where nodes
        share no disk (a --checkpoint_dir that is not a shared mount)."""
        if len(set(found)) == 1:
            return
        last = Path(self.checkpoint_dir) / "last.ckpt"
        have = ", ".join(str(rank) for rank, resumes in enumerate(found) if resumes)
        lack = ", ".join(str(rank) for rank, resumes in enumerate(found) if not resumes)
        fix = (
            f"or resume with --ckpt_path {last}, which rank 0 reads for every process"
            if found[0]
            else f"or remove {last} from the nodes of rank(s) {have} to train anew"
        )
        raise CheckpointError(
            f"--checkpoint_dir {last.parent}: the processes of rank(s) {have} find {last} to resume from, those of "
            f"rank(s) {lack} do not (nodes that share no disk); give a --checkpoint_dir that every node sees (on Azure "
            f"ML, scripts.submit's checkpoints output), {fix}"
        )

    def check_hyperparameters(self, differ: list[str], first: dict, mine: dict, rank: int) -> None:
        """Every process must build the same module and datamodule: a --config file may differ between nodes, and a
        --ckpt_path's hyperparameters reach only the processes that can read it."""
        if not differ:
            raise CheckpointError(
                "another process builds the model or the data with other options than rank 0 (its own line names "
                "them); give every process the same options"
            )
        key = differ[0]
        if self.ckpt_path and not Path(self.ckpt_path).is_file():
            raise CheckpointError(
                f"--{key} {mine.get(key)}: rank 0 takes {first.get(key)} from the hyperparameters of --ckpt_path "
                f"{self.ckpt_path} (LightningCLI gives the model a checkpoint's own), which rank {rank} cannot read "
                f"(nodes that share no disk); give --{key} {first.get(key)}, as it was trained"
            )
        raise CheckpointError(
            f"--{key} {mine.get(key)}: rank 0 has {first.get(key)} (a --config file that differs between nodes?); "
            "give every process the same options"
        )
