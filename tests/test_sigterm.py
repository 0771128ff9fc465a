"""SIGTERM in a fit stops at the next point every process passes in step (scripts/training/sigterm.py), in one
process here; several processes, under each launcher: tests/test_azure_world.py and tests/test_distributed.py."""

from __future__ import annotations

import os
import signal

import lightning as L
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import SIGTERMException

from scripts.training.sigterm import StopTogether


class SigtermAt(L.Callback):
    """SIGTERM to this process at the end of training batch `batch`."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_stops_at_the_next_batch_start_and_lightning_s_own_handler_never_runs(tmp_path):
    """The canary of the private names StopTogether replaces Lightning's handler through (Trainer._signal_connector,
    _SignalConnector._sigterm_notifier_fn): if Lightning renames them, its own handler runs again, with its
    broadcast, and `received_sigterm` turns True here."""
    trainer = L.Trainer(
        default_root_dir=tmp_path, max_epochs=1, limit_train_batches=10, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, callbacks=[StopTogether(), SigtermAt(batch=2)],
    )  # fmt: skip
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SIGTERMException):
        trainer.fit(BoringModel())
    assert trainer.global_step == 3  # batches 0, 1 and 2 trained; stopped at the start of batch 3
    assert not trainer.received_sigterm  # Lightning's handler did not run: ours did
    assert signal.getsignal(signal.SIGTERM) == before  # Lightning's teardown put back what was there
