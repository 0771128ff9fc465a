"""A note on stderr when a later `--config` (an overlay) replaces the callbacks an earlier one named: LightningCLI
replaces a list that a later config gives (jsonargparse's rule for every option), so a task's EarlyStopping would go
without a word; `--trainer.callbacks+ CLASS` on the command line adds to them instead (docs/tasks.md). Loaded only
when a command names more than one --config.

    python -m scripts.train fit --config configs/penguins.yaml --config my_callbacks.yaml   # the note, then the fit
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml


def config_paths(words: list[str]) -> list[str]:
    """The --config files in `words`, in the order given."""
    paths = [value for option, value in zip(words, words[1:]) if option == "--config"]
    return paths + [word.split("=", 1)[1] for word in words if word.startswith("--config=")]


def callbacks_of(path: str) -> list[str] | None:
    """The class paths of the trainer.callbacks a YAML file names; None when it names none (or cannot be read:
    the CLI says why)."""
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    trainer = config.get("trainer") if isinstance(config, dict) else None
    if not isinstance(trainer, dict) or "callbacks" not in trainer:
        return None
    named = trainer["callbacks"] or []
    named = named if isinstance(named, list) else [named]
    return [str(c.get("class_path", c)) if isinstance(c, dict) else str(c) for c in named]


def note_replaced_callbacks(words: list[str]) -> None:
    """One stderr line for each overlay that drops callbacks an earlier --config named."""
    earlier: tuple[str, list[str]] | None = None
    for path in config_paths([str(word) for word in words]):
        named = callbacks_of(path)
        if named is None:
            continue
        if earlier is not None and (dropped := [c for c in earlier[1] if c not in named]):
            print(
                f"note: --config {path} names trainer.callbacks, which replaces those of {earlier[0]}: "
                f"{', '.join(name.rsplit('.', 1)[-1] for name in dropped)} dropped; to add callbacks to a task's, "
                "give --trainer.callbacks+ CLASS on the command line instead",
                file=sys.stderr,
            )
        earlier = (path, named)
