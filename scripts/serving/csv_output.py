"""Predictions as CSV text that Python's csv module reads back cell for cell, and written to a file whole or not at all:
the output of `python -m scripts.score` and `python -m scripts.serving.batch_score`. Standard library only. Each line
is datamodules/printable.py's csv_line, as predict writes its own (which must not load this serving module).

    python -m scripts.score MODEL_DIR photos/ --output predictions.csv
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from datamodules.printable import csv_line


def csv_text(rows: Iterable[Sequence[object]]) -> str:
    """The CSV text of `rows` (the header first), a `csv_line` each."""
    return "".join(csv_line(row) for row in rows)


def write_whole(target: Path, text: str) -> None:
    """`text` in `target` (UTF-8), through a temporary file beside it renamed over it: a failure (a full disk, an
    interrupt) leaves what `target` held before. Raises OSError."""
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as file:
            file.write(text)
        os.chmod(temporary, 0o666 & ~current_umask())  # mkstemp's 0600 would differ from the file open() makes
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
