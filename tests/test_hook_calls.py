"""scripts/training/hook_calls.py: Lightning's hook calls without profiling call the same hooks in the same order with
the same `_current_fx_name`, profile as Lightning's do when a profiler is set, and are still copies of Lightning's.

.venv/bin/python -m pytest -q tests/test_hook_calls.py
"""

from __future__ import annotations

import hashlib
import inspect

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.trainer import call

from scripts.training import hook_calls

# SHA-256 (first 16 hex digits) of the source of each function hook_calls replaces, in Lightning 2.6.6. A new hash:
# Lightning changed the function; bring hook_calls' copy in line with it (or drop it), then record the new hash.
LIGHTNING_SOURCES = {
    "_call_lightning_module_hook": "558a87d04c4680e1",
    "_call_lightning_datamodule_hook": "2c4500edeedd95c0",
    "_call_callback_hooks": "c413fb9a6a9ce1a3",
    "_call_strategy_hook": "ff429e3ac60d2a80",
}


def test_the_functions_replaced_are_still_lightnings_as_copied():
    found = {
        name: hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
        for name, function in hook_calls.LIGHTNING.items()
    }
    assert found == LIGHTNING_SOURCES, f"Lightning changed {[n for n in found if found[n] != LIGHTNING_SOURCES[n]]}"
    assert set(hook_calls.LEAN) == set(LIGHTNING_SOURCES)


@pytest.fixture
def restored():
    """Whatever this process had (a CLI run by another test installs the lean calls) comes back after the test."""
    before = {name: getattr(call, name) for name in hook_calls.LIGHTNING}
    yield
    for name, function in before.items():
        setattr(call, name, function)


class Recorder(L.Callback):
    """Each callback hook it sees, with the module's `_current_fx_name` at the time."""

    def __init__(self, calls: list, label: str) -> None:
        self.calls, self.label = calls, label

    @property
    def state_key(self) -> str:
        return self.label

    def __getattribute__(self, name: str):
        if name.startswith("on_") and name not in ("on_save_checkpoint", "on_load_checkpoint"):
            calls, label = object.__getattribute__(self, "calls"), object.__getattribute__(self, "label")
            return lambda trainer, module, *args: calls.append((label, name, module._current_fx_name))
        return object.__getattribute__(self, name)


class Data(L.LightningDataModule):
    def __init__(self, calls: list) -> None:
        super().__init__()
        self.calls = calls
        generator = torch.Generator().manual_seed(0)
        self.inputs, self.labels = (
            torch.randn(48, 4, generator=generator),
            torch.randint(0, 3, (48,), generator=generator),
        )

    def loader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(self.inputs, self.labels), batch_size=16)

    train_dataloader = val_dataloader = test_dataloader = loader

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.calls.append(("datamodule", "on_after_batch_transfer", self.trainer.lightning_module._current_fx_name))
        return batch


class Model(L.LightningModule):
    def __init__(self, calls: list) -> None:
        super().__init__()
        self.calls = calls
        self.layer = torch.nn.Linear(4, 3)

    def note(self, hook: str) -> None:
        self.calls.append(("module", hook, self._current_fx_name))

    def training_step(self, batch, batch_idx):
        self.note("training_step")
        loss = F.cross_entropy(self.layer(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.note("validation_step")
        self.log("val_loss", F.cross_entropy(self.layer(batch[0]), batch[1]))

    def test_step(self, batch, batch_idx):
        self.note("test_step")

    def on_before_backward(self, loss):
        self.note("on_before_backward")

    def on_before_optimizer_step(self, optimizer):
        self.note("on_before_optimizer_step")

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)  # the closure: training_step, backward and their hooks, nested
        self.note("after the nested calls of optimizer_step")

    def on_validation_epoch_end(self):
        self.note("on_validation_epoch_end")

    def configure_optimizers(self):
        self.note("configure_optimizers")
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_and_test(tmp_path, profiler=None) -> tuple[list, L.Trainer]:
    calls: list = []
    torch.manual_seed(0)
    callbacks = [Recorder(calls, "first"), Recorder(calls, "second"), ModelCheckpoint(monitor="val_loss"),
                 EarlyStopping(monitor="val_loss")]  # fmt: skip
    trainer = L.Trainer(
        max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False, profiler=profiler,
        default_root_dir=tmp_path, callbacks=callbacks,
    )  # fmt: skip
    model, data = Model(calls), Data(calls)
    trainer.fit(model, datamodule=data)
    trainer.test(model, datamodule=data, verbose=False)
    calls.append(("weights", [round(float(w), 6) for w in model.layer.weight.detach().flatten()], None))
    return calls, trainer


def test_lean_calls_call_what_lightnings_call_in_the_same_order(tmp_path, restored):
    hook_calls.uninstall()
    stock, _ = fit_and_test(tmp_path / "stock")
    hook_calls.install()
    lean, _ = fit_and_test(tmp_path / "lean")
    assert call._call_callback_hooks is hook_calls.callback_hooks
    assert len(stock) > 100 and lean == stock
    assert ("module", "after the nested calls of optimizer_step", "optimizer_step") in lean
    fx_names = {fx for kind, _, fx in stock if kind != "weights"}
    assert {"on_train_batch_end", "training_step", "batch_to_device", "validation_step"} <= fx_names
    assert ("module", "test_step", "test_step") in lean


def test_a_profiler_set_profiles_every_hook_as_lightning_does(tmp_path, restored):
    hook_calls.install()
    _, trainer = fit_and_test(tmp_path, profiler="simple")
    actions = set(trainer.profiler.recorded_durations)
    assert "[Callback]first.on_train_batch_end" in actions
    assert "[LightningModule]Model.on_before_backward" in actions
    assert "[Strategy]SingleDeviceStrategy.training_step" in actions
    assert "[LightningDataModule]Data.on_after_batch_transfer" in actions
