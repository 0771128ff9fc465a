"""Lightning's hook calls without the profiling work they do when no profiler is set.

Lightning calls each hook of the callbacks, the module, the datamodule and the strategy through
`lightning.pytorch.trainer.call` (~25 calls a training step). Each call formats a debug line and a profiler action
name (for ModelCheckpoint and EarlyStopping that is a repr of their arguments, their `state_key`), enters the
profiler's context and writes the module's `_current_fx_name` twice through nn.Module.__setattr__: with the default
PassThroughProfiler, all of it for nothing. On a penguin epoch (12 steps of a 5-10-10-3 net with the configs'
callbacks) that is 18% of the training time. `install()` puts in their place functions that do what Lightning's do
minus the profiling while the trainer's profiler is the PassThroughProfiler, and call Lightning's own otherwise
(`--trainer.profiler simple` profiles as before). scripts.training.cli installs them for every run:

    python -m scripts.train fit --config configs/penguins.yaml                              # these calls
    python -m scripts.train fit --config configs/penguins.yaml --trainer.profiler simple    # Lightning's, profiled

The functions replaced are private to Lightning: tests/test_hook_calls.py fails when Lightning changes them.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.trainer import call

LIGHTNING = {
    name: getattr(call, name)
    for name in (
        "_call_lightning_module_hook",
        "_call_lightning_datamodule_hook",
        "_call_callback_hooks",
        "_call_strategy_hook",
    )
}
# _current_fx_name is a plain attribute (never a parameter, buffer or module): object's setter does what
# nn.Module.__setattr__ ends with, without its isinstance checks.
set_attribute = object.__setattr__


def profiled(trainer: L.Trainer) -> bool:
    return type(trainer.profiler) is not PassThroughProfiler


def module_hook(trainer: L.Trainer, hook_name: str, *args: Any, pl_module: L.LightningModule | None = None,
                **kwargs: Any) -> Any:  # fmt: skip
    if profiled(trainer):
        return LIGHTNING["_call_lightning_module_hook"](trainer, hook_name, *args, pl_module=pl_module, **kwargs)
    pl_module = pl_module or trainer.lightning_module
    if pl_module is None:
        raise TypeError("No `LightningModule` is available to call hooks on.")
    fn = getattr(pl_module, hook_name)
    if not callable(fn):
        return None
    previous = pl_module._current_fx_name
    set_attribute(pl_module, "_current_fx_name", hook_name)
    output = fn(*args, **kwargs)
    set_attribute(pl_module, "_current_fx_name", previous)  # restored for nested calls
    return output


def datamodule_hook(trainer: L.Trainer, hook_name: str, *args: Any, **kwargs: Any) -> Any:
    if profiled(trainer):
        return LIGHTNING["_call_lightning_datamodule_hook"](trainer, hook_name, *args, **kwargs)
    if trainer.datamodule is None:
        raise TypeError("No `LightningDataModule` is available to call hooks on.")
    fn = getattr(trainer.datamodule, hook_name)
    return fn(*args, **kwargs) if callable(fn) else None


def callback_hooks(trainer: L.Trainer, hook_name: str, *args: Any, monitoring_callbacks: bool | None = None,
                   **kwargs: Any) -> None:  # fmt: skip
    if monitoring_callbacks is not None or profiled(trainer):  # a filtered list: once an epoch, Lightning's own
        lightning = LIGHTNING["_call_callback_hooks"]
        lightning(trainer, hook_name, *args, monitoring_callbacks=monitoring_callbacks, **kwargs)
        return
    pl_module = trainer.lightning_module
    if pl_module:
        previous = pl_module._current_fx_name
        set_attribute(pl_module, "_current_fx_name", hook_name)
    for callback in trainer.callbacks:
        fn = getattr(callback, hook_name)
        if callable(fn):
            fn(trainer, trainer.lightning_module, *args, **kwargs)
    if pl_module:
        set_attribute(pl_module, "_current_fx_name", previous)


def strategy_hook(trainer: L.Trainer, hook_name: str, *args: Any, **kwargs: Any) -> Any:
    if profiled(trainer):
        return LIGHTNING["_call_strategy_hook"](trainer, hook_name, *args, **kwargs)
    pl_module = trainer.lightning_module
    previous = pl_module._current_fx_name
    set_attribute(pl_module, "_current_fx_name", hook_name)
    fn = getattr(trainer.strategy, hook_name)
    if not callable(fn):
        return None
    output = fn(*args, **kwargs)
    set_attribute(pl_module, "_current_fx_name", previous)
    return output


LEAN = {
    "_call_lightning_module_hook": module_hook,
    "_call_lightning_datamodule_hook": datamodule_hook,
    "_call_callback_hooks": callback_hooks,
    "_call_strategy_hook": strategy_hook,
}


def install() -> None:
    """Every Lightning loop calls hooks through these from now on, in this process."""
    for name, function in LEAN.items():
        setattr(call, name, function)


def uninstall() -> None:
    """Lightning's own again (the benches' bare-Lightning variants)."""
    for name, function in LIGHTNING.items():
        setattr(call, name, function)
