"""SIGTERM stops every process of a fit together, within a batch, whichever processes got it: Azure ML sends it to
every process of a job it preempts or cancels (under mpirun, mpirun forwards its own), and a process can get it alone.

Lightning 2.6.6 answers SIGTERM with a broadcast from rank 0 inside the signal handler, which runs wherever the
process happens to be: the other processes meet it, if at all, inside another collective (DDP's gradient all-reduce,
say), and all of them wait for good. A process signalled alone stops at its next batch while the others wait for it.

Here the handler only takes note. Where every process passes in step (a training batch's start, the end of training,
of a validation, of a test), they reduce their notes (max: any process signalled) and all raise Lightning's
SIGTERMException there, together; scripts.train then exits 143. No epoch's checkpoints are cut short: last.ckpt is the
end of the last finished epoch, and the same command resumes from it (scripts/training/resume.py).
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException


class StopTogether(L.Callback):
    """Installed in every Trainer by scripts.train (TemplateCLI.instantiate_trainer)."""

    def __init__(self) -> None:
        self.signalled = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning registers its SIGTERM handler after this hook, at the start of each run, with this function: ours
        # instead. Private names; tests/test_sigterm.py fails if Lightning changes them.
        trainer._signal_connector._sigterm_notifier_fn = self.take_note

    def take_note(self, signum: int, frame: object) -> None:
        """The SIGTERM handler: a note, nothing else (it runs between any two bytecodes, even within a collective)."""
        self.signalled = True

    def stop_if_signalled(self, trainer: L.Trainer) -> None:
        """A collective: every process calls it at the same point."""
        if trainer.world_size == 1:  # no collective, and no device sync of a step's result on a GPU
            if self.signalled:
                raise SIGTERMException
            return
        signalled = torch.tensor(float(self.signalled), device=trainer.strategy.root_device)
        if trainer.strategy.reduce(signalled, reduce_op="max").item():
            raise SIGTERMException

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        self.stop_if_signalled(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stop_if_signalled(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stop_if_signalled(trainer)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stop_if_signalled(trainer)
