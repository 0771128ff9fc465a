"""last.ckpt is the end of the latest epoch (what a resumed run needs); best.ckpt the best monitored epoch."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules.checkpoint import BestAndLastCheckpoint

EPOCHS = 4


class WorseEveryEpoch(L.LightningModule):
    """Trains a real layer; its logged val_loss is the epoch number, so epoch 0 stays the best."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.epochs_trained: list[int] = []

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def on_train_epoch_start(self) -> None:
        self.epochs_trained.append(self.current_epoch)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(12, 2)), batch_size=4)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=4)


def fit(folder, callback: ModelCheckpoint, max_epochs: int = EPOCHS, ckpt_path=None) -> WorseEveryEpoch:
    module = WorseEveryEpoch()
    trainer = L.Trainer(
        max_epochs=max_epochs, callbacks=[callback], logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=folder,
    )  # fmt: skip
    trainer.fit(module, ckpt_path=ckpt_path)
    return module


def saved_epoch(path) -> int:
    return torch.load(path, weights_only=False)["epoch"]


def checkpoint(folder, **options) -> BestAndLastCheckpoint:
    return BestAndLastCheckpoint(dirpath=folder, monitor="val_loss", filename="best", save_last=True, **options)


def test_last_is_the_final_epoch_and_best_the_best_one(tmp_path):
    fit(tmp_path, checkpoint(tmp_path))
    assert saved_epoch(tmp_path / "best.ckpt") == 0
    assert saved_epoch(tmp_path / "last.ckpt") == EPOCHS - 1


class CountWrites(BestAndLastCheckpoint):
    def _save_checkpoint(self, trainer, filepath: str) -> None:
        self.written.append((Path(filepath).name, trainer.current_epoch))
        super()._save_checkpoint(trainer, filepath)


def test_last_every_s_writes_last_rarely_but_always_at_the_end(tmp_path):
    callback = CountWrites(dirpath=tmp_path, monitor="val_loss", filename="best", save_last=True, last_every_s=3600)
    callback.written = []
    fit(tmp_path, callback)
    # Epoch 0: the first best, and last.ckpt with it; then nothing until fit ends.
    assert callback.written == [("best.ckpt", 0), ("last.ckpt", 0), ("last.ckpt", EPOCHS)]
    resumed = fit(tmp_path, checkpoint(tmp_path), max_epochs=EPOCHS + 1, ckpt_path=tmp_path / "last.ckpt")
    assert resumed.epochs_trained == [EPOCHS]


def test_every_epoch_writes_last_once(tmp_path):
    callback = CountWrites(dirpath=tmp_path, monitor="val_loss", filename="best", save_last=True)
    callback.written = []
    fit(tmp_path, callback)
    assert callback.written == [("best.ckpt", 0)] + [("last.ckpt", epoch) for epoch in range(EPOCHS)]


def test_resuming_from_last_continues_after_the_final_epoch(tmp_path):
    fit(tmp_path, checkpoint(tmp_path))
    resumed = fit(tmp_path, checkpoint(tmp_path), max_epochs=EPOCHS + 2, ckpt_path=tmp_path / "last.ckpt")
    assert resumed.epochs_trained == [EPOCHS, EPOCHS + 1]
    assert saved_epoch(tmp_path / "best.ckpt") == 0  # the restored best score still stands


def test_lightnings_own_last_is_still_a_copy_of_the_best(tmp_path):
    """Why the subclass exists. When this fails, Lightning writes last.ckpt every epoch again: drop it."""
    fit(tmp_path, ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", filename="best", save_last=True))
    assert saved_epoch(tmp_path / "last.ckpt") == 0


@pytest.mark.parametrize("save_last", [False, None])
def test_no_last_checkpoint_unless_asked(tmp_path, save_last):
    fit(tmp_path, BestAndLastCheckpoint(dirpath=tmp_path, monitor="val_loss", filename="best", save_last=save_last))
    assert not (tmp_path / "last.ckpt").exists()
