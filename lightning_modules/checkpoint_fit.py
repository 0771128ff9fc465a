"""A checkpoint whose weights do not fit the network as today's code builds it, as one line naming the checkpoint, the
network's class and what differs, not torch's load_state_dict error over dozens. Loaded only then (`weights_fit` in
ClassificationModule.on_load_checkpoint).

    python -m scripts.train test --config configs/penguins.yaml --ckpt_path old.ckpt   # one line if it does not fit
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch
from torch.nn.parameter import is_lazy

SHOWN = 3  # keys of each kind the line names; the others are counted


class NetworkMismatchError(ValueError):
    """A checkpoint whose weights the network of today's code cannot take."""


def differences(code: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor]) -> list[str]:
    """What keeps the state dict `saved` from loading into one shaped as `code`: its keys the code lacks, the code's
    it lacks, and the shapes that differ. A lazy layer's weights (TableNet's first) take any shape until loaded."""
    missing = [key for key in code if key not in saved]
    unexpected = [key for key in saved if key not in code]
    shapes = [
        f"shape of {key}: checkpoint {list(saved[key].shape)}, code {list(tensor.shape)}"
        for key, tensor in code.items()
        if key in saved and not is_lazy(tensor) and saved[key].shape != tensor.shape
    ]
    found = [
        f"{kind}: {', '.join(keys[:SHOWN])}" + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")
        for kind, keys in (("missing", missing), ("unexpected", unexpected)) if keys
    ]  # fmt: skip
    return found + shapes[:SHOWN] + ([f"{len(shapes) - SHOWN} more shapes"] if len(shapes) > SHOWN else [])


def check_network_fits(module: L.LightningModule, checkpoint: Mapping) -> None:
    """Raises NetworkMismatchError when `checkpoint`'s state dict would not load into `module` (strictly, as Lightning
    loads it); naming the file when a Trainer loads it (load_from_checkpoint's callers name it themselves)."""
    found = differences(module.state_dict(keep_vars=True), checkpoint.get("state_dict", {}))
    if not found or not module.strict_loading:
        return
    network = type(getattr(module, "network", module))
    try:
        where = f"{module.trainer.ckpt_path}: "
    except RuntimeError:  # not attached to a Trainer: load_from_checkpoint
        where = ""
    raise NetworkMismatchError(
        f"{where}its network does not fit {network.__module__}.{network.__qualname__} as the code builds it now "
        f"({'; '.join(found)}); give a checkpoint trained by this version of the code, or the code it was trained with"
    )
