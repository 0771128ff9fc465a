"""scripts/training/progress_bar.py: the bar scripts.train installs draws at most every redraw_s seconds and at each
loop's last batch, where Lightning's draws at every batch; a config's own bar is kept; no bar where none is asked for.

.venv/bin/python -m pytest -q tests/test_progress_bar.py
"""

from __future__ import annotations

import contextlib
import io
import re
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch.utils.data import DataLoader, TensorDataset

from scripts.training import progress_bar
from scripts.training.cli import cli_main
from scripts.training.progress_bar import ThrottledProgressBar


class TenBatches(L.LightningModule):
    """10 training batches and 4 validation batches an epoch; the loss on the bar."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.linear(batch[0]).pow(2).mean()
        self.log("loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx) -> None:
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(20, 2)), batch_size=2)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)


def drawn(bar: TQDMProgressBar) -> tuple[set[int], set[int], str]:
    """The batch counts the training and validation bars showed over a 2-epoch fit, and the whole output."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):  # Lightning's bars write to stdout
        trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_model_summary=False,
                            num_sanity_val_steps=0, callbacks=[bar])  # fmt: skip
        trainer.fit(TenBatches())
    text = output.getvalue()
    training = {int(count) for count in re.findall(r"Epoch \d+: .*?\| (\d+)/10 ", text)}
    validation = {int(count) for count in re.findall(r"Validation DataLoader 0: .*?\| (\d+)/4 ", text)}
    return training, validation, text


def test_lightnings_bar_draws_every_batch_and_ours_the_first_and_each_loops_last():
    assert drawn(TQDMProgressBar())[:2] == (set(range(11)), set(range(5)))
    training, validation, text = drawn(ThrottledProgressBar(redraw_s=3600))
    assert training == {0, 1, 10}  # the bar's start, the first batch, each epoch's last
    assert validation == {0, 4}
    assert re.search(r"Epoch 1: 100%.*loss=", text)  # the epoch's metrics still reach the bar
    assert drawn(ThrottledProgressBar(redraw_s=0))[:2] == (set(range(11)), set(range(5)))


def test_a_batch_is_drawn_once_redraw_s_has_passed_since_the_last_draw(monkeypatch):
    clock = iter([100.0, 100.05, 100.12, 100.15, 100.23, 100.25, 100.26])
    monkeypatch.setattr(progress_bar.time, "monotonic", lambda: next(clock))
    bar = ThrottledProgressBar(redraw_s=0.1)
    assert [bar.due(count, 50) for count in (1, 2, 3, 4, 5, 6)] == [True, False, True, False, True, False]
    assert bar.due(50, 50)  # a loop's last batch, however soon


BAR_ON = ["--trainer.enable_progress_bar", "true"]
OWN_BAR = ["--trainer.callbacks+=lightning.pytorch.callbacks.TQDMProgressBar", "--trainer.callbacks.refresh_rate", "5"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (BAR_ON, (ThrottledProgressBar, 1)),
        ([*BAR_ON, *OWN_BAR], (TQDMProgressBar, 5)),
        ([], None),  # configs/penguins.yaml: enable_progress_bar false
    ],
    ids=["the-trainers-default", "a-configs-own", "none"],
)
def test_scripts_train_installs_the_bar_where_the_config_names_none(tmp_path, monkeypatch, options, expected):
    monkeypatch.setattr(sys, "argv", ["scripts.train"])  # as `python -m scripts.train` has it, not pytest's
    fit = ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "1", "--trainer.logger", "false"]
    cli = cli_main([*fit, "--test_after_fit", "false", "--trainer.default_root_dir", str(tmp_path), *options])
    bar = cli.trainer.progress_bar_callback
    assert ((type(bar), bar.refresh_rate) == expected) if expected else bar is None
