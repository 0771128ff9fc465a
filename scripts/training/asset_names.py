"""Azure ML's rule for the names of assets: data, environments and registered models. A module of its own, importing
nothing, so that a fit (`scripts.train fit --register_model NAME`, the serving extra) and the Azure ML commands (the
azure extra) check a name alike, each without the other.

    python -m scripts.train fit --config configs/penguins.yaml --register_model penguins-classifier
"""

from __future__ import annotations

import re

# Letters, digits, '-', '_' and '.', from a letter or digit; no ':' or '/', which would break the azureml:NAME:VERSION
# that jobs name assets by.
ASSET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")


def name_problem(name: str, option: str = "name") -> str | None:
    """The one line for a name Azure ML refuses, naming `option`; None for a name it takes."""
    if ASSET_NAME.fullmatch(name or ""):
        return None
    return (
        f"{option} {name!r}: Azure ML refuses it; give 1-255 letters, digits, '-', '_' or '.', starting with a letter "
        "or digit, e.g. penguins"
    )
