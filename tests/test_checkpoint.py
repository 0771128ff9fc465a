"""last.ckpt is the end of the latest epoch (what a resumed run needs); best.ckpt the best monitored epoch;
with write_every_s each file is rewritten at most that often, and exact when fit ends or fails."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import Strategy
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules.checkpoint import BestAndLastCheckpoint

EPOCHS = 4


class ScriptedLoss(L.LightningModule):
    """Trains a real layer; the val_loss it logs in epoch e is `losses[e]`. Keeps the weights of every epoch's
    end and sets `clock.now` to 10 s per epoch, so a test decides which epochs are new bests and when."""

    def __init__(self, losses, fail_in_epoch: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.losses = list(losses)
        self.fail_in_epoch = fail_in_epoch
        self.epochs_trained: list[int] = []
        self.weights: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        if self.current_epoch == self.fail_in_epoch:
            raise RuntimeError("fails on purpose")
        return self.layer(batch[0]).pow(2).mean()

    def on_train_epoch_start(self) -> None:
        self.epochs_trained.append(self.current_epoch)
        Clock.now = 10.0 * self.current_epoch

    def on_train_epoch_end(self) -> None:  # Lightning runs it before the checkpoint callback's
        self.weights.append(self.layer.weight.detach().clone())

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", float(self.losses[self.current_epoch]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(12, 2)), batch_size=4)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=4)


class Clock:
    now = 0.0

    @staticmethod
    def read() -> float:
        return Clock.now


WORSE_EVERY_EPOCH = range(100)  # epoch 0 stays the best
BETTER_EVERY_EPOCH = range(100, 0, -1)


def fit(folder, callback: ModelCheckpoint, losses=WORSE_EVERY_EPOCH, max_epochs=EPOCHS, ckpt_path=None, **options):
    module = ScriptedLoss(losses, **options)
    trainer = L.Trainer(
        max_epochs=max_epochs, callbacks=[callback], logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=folder,
    )  # fmt: skip
    trainer.fit(module, ckpt_path=ckpt_path)
    return module


def saved(path) -> dict:
    return torch.load(path, weights_only=False)


def checkpoint(folder, **options) -> BestAndLastCheckpoint:
    callback = BestAndLastCheckpoint(dirpath=folder, monitor="val_loss", filename="best", save_last=True, **options)
    callback.clock = Clock.read
    return callback


@pytest.fixture
def writes(monkeypatch) -> list[tuple[str, int]]:
    """(file name, epoch in the checkpoint) of every file the strategy writes, in order."""
    written: list[tuple[str, int]] = []
    save = Strategy.save_checkpoint

    def recording_save(self, checkpoint, filepath, storage_options=None):
        written.append((Path(filepath).name, checkpoint["epoch"]))
        save(self, checkpoint, filepath, storage_options)

    monkeypatch.setattr(Strategy, "save_checkpoint", recording_save)
    return written


def test_last_is_the_final_epoch_and_best_the_best_one(tmp_path):
    fit(tmp_path, checkpoint(tmp_path))
    assert saved(tmp_path / "best.ckpt")["epoch"] == 0
    assert saved(tmp_path / "last.ckpt")["epoch"] == EPOCHS - 1


def test_without_interval_every_best_and_every_last_is_written_at_once(tmp_path, writes):
    fit(tmp_path, checkpoint(tmp_path), losses=BETTER_EVERY_EPOCH)
    assert writes == [(name, epoch) for epoch in range(EPOCHS) for name in ("best.ckpt", "last.ckpt")]


def test_without_interval_last_is_written_once_an_epoch(tmp_path, writes):
    fit(tmp_path, checkpoint(tmp_path))
    assert writes == [("best.ckpt", 0)] + [("last.ckpt", epoch) for epoch in range(EPOCHS)]


def test_each_file_is_written_at_most_once_an_interval_and_exactly_at_the_end(tmp_path, writes):
    # Epochs start 10 s apart; a file is due again 15 s after its last write: epochs 0, 2, 4.
    module = fit(tmp_path, checkpoint(tmp_path, write_every_s=15), losses=BETTER_EVERY_EPOCH, max_epochs=6)
    due = [(name, epoch) for epoch in (0, 2, 4) for name in ("best.ckpt", "last.ckpt")]
    # Fit's end writes the newest of both (a checkpoint written then counts the finished epoch too).
    assert writes == due + [("last.ckpt", 6), ("best.ckpt", 5)]
    best = saved(tmp_path / "best.ckpt")
    assert torch.equal(best["state_dict"]["layer.weight"], module.weights[5])


def test_a_best_kept_in_memory_is_written_when_due_with_its_own_weights(tmp_path, writes):
    # Epoch 1 is the best; it is too soon to write it then (10 s after epoch 0's), and due at epoch 2's end.
    module = fit(tmp_path, checkpoint(tmp_path, write_every_s=15), losses=[2, 1, 3, 4])
    assert writes[:4] == [("best.ckpt", 0), ("last.ckpt", 0), ("last.ckpt", 2), ("best.ckpt", 1)]
    best = saved(tmp_path / "best.ckpt")
    assert best["epoch"] == 1 and best["callbacks"]  # the whole checkpoint, not just weights
    assert torch.equal(best["state_dict"]["layer.weight"], module.weights[1])
    assert not torch.equal(module.weights[1], module.weights[2])  # training went on after the copy


def test_a_best_kept_in_memory_is_written_when_fit_fails(tmp_path):
    with pytest.raises(RuntimeError, match="fails on purpose"):
        fit(tmp_path, checkpoint(tmp_path, write_every_s=3600), losses=[2, 1, 0], fail_in_epoch=2)
    assert saved(tmp_path / "best.ckpt")["epoch"] == 1
    assert saved(tmp_path / "last.ckpt")["epoch"] == 0  # skipped in epoch 1: not due, and no copy kept


def test_resuming_from_last_written_rarely_continues_after_the_final_epoch(tmp_path, writes):
    fit(tmp_path, checkpoint(tmp_path, write_every_s=3600))
    assert writes == [("best.ckpt", 0), ("last.ckpt", 0), ("last.ckpt", EPOCHS)]
    resumed = fit(tmp_path, checkpoint(tmp_path), max_epochs=EPOCHS + 2, ckpt_path=tmp_path / "last.ckpt")
    assert resumed.epochs_trained == [EPOCHS, EPOCHS + 1]
    assert saved(tmp_path / "best.ckpt")["epoch"] == 0  # the restored best score still stands


def test_lightnings_own_last_is_still_a_copy_of_the_best(tmp_path):
    """Why the subclass exists. When this fails, Lightning writes last.ckpt every epoch again: drop that part."""
    fit(tmp_path, ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", filename="best", save_last=True))
    assert saved(tmp_path / "last.ckpt")["epoch"] == 0


@pytest.mark.parametrize("save_last", [False, None])
def test_no_last_checkpoint_unless_asked(tmp_path, save_last):
    fit(tmp_path, BestAndLastCheckpoint(dirpath=tmp_path, monitor="val_loss", filename="best", save_last=save_last))
    assert not (tmp_path / "last.ckpt").exists()


def test_linking_last_to_a_file_not_written_yet_is_refused(tmp_path):
    with pytest.raises(ValueError, match="save_last 'link'"):
        BestAndLastCheckpoint(dirpath=tmp_path, save_last="link", write_every_s=60)
