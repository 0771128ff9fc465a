"""Which files of a folder are no one's data: training's image folders (datamodules/image_folder.py) and batch
scoring (scripts/score.py, which loads this file by its path: the serving environment has no torch) skip the same ones.
Standard library only."""

from __future__ import annotations

from pathlib import Path

# Windows Explorer's thumbnail caches and folder settings, left in every folder of photos it has shown.
WINDOWS_FILES = ("thumbs.db", "ehthumbs.db", "ehthumbs_vista.db", "desktop.ini")


def ignored(name: str) -> bool:
    """Dot files (.DS_Store, macOS's `._x.jpg` resource forks too), macOS zip debris (`__MACOSX/`) and Windows
    Explorer's files (Thumbs.db, desktop.ini) are no one's data."""
    return name.startswith(".") or name == "__MACOSX" or name.lower() in WINDOWS_FILES


def hidden(path: Path, root: Path) -> bool:
    """Whether `path` or a folder between it and `root` is `ignored`."""
    return any(ignored(part) for part in path.relative_to(root).parts)
