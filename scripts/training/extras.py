"""An option of the core that needs an extra (`--register_model` needs serving; `scripts.submit --sweep` needs sweeps)
loads the extra's module through `load`: where this checkout dropped the extra (`make drop`) or this environment lacks
its packages, the command ends in one line naming the extra and what to do, not in an ImportError's traceback.

    python -m scripts.train fit --config configs/penguins.yaml --register_model penguins-classifier
"""

from __future__ import annotations

import importlib
from types import ModuleType

PROJECT = ("scripts", "datamodules", "lightning_modules", "strategies")


class ExtraMissing(Exception):
    """An option needs an extra this checkout or environment does not have; the message says which and what to do."""


def load(module: str, extra: str, option: str) -> ModuleType:
    """`module`, which `option` needs, of the extra `extra` (pyproject.toml's name for it)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing.split(".")[0] in PROJECT:  # the extra's own folder is gone
            raise ExtraMissing(
                f"{option} needs the {extra} extra ({missing.replace('.', '/')}), which this checkout dropped (make "
                f"drop EXTRA={extra}); leave {option} out, or bring the extra back from git"
            ) from None
        raise ExtraMissing(
            f"{option} needs the {extra} extra's packages ({missing} is not installed here); install them with "
            f"`uv sync --extra {extra}` (`make install` installs every extra)"
        ) from None
