"""Predictions as CSV text that Python's csv module reads back cell for cell, and written to a file whole or not at all:
the output of `python -m scripts.score` (and of predict's CSV on stdout). Standard library only.

    python -m scripts.score MODEL_DIR photos/ --output predictions.csv

A file name may hold what a CSV line cannot carry bare: a comma or quote (quoted by the csv module), a carriage return
(the csv module leaves it unquoted when lines end in "\\n", and a reader then splits the row in two: such a row is
quoted whole), or bytes that are not UTF-8 (Python holds them as surrogates, which no UTF-8 file or console can
encode: written as `\\xNN`, as `ls -b` shows them).
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path


def printable_name(name: str) -> str:
    """`name` with each byte that is not UTF-8 (a surrogate of os.fsdecode) as the text `\\xNN`."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def csv_line(cells: Sequence[object]) -> str:
    """One CSV line (ending in "\\n") of `cells`, each as str(); names made printable, quoted where the csv module
    needs it, the whole line where a cell holds a carriage return."""
    texts = [printable_name(str(cell)) for cell in cells]
    buffer = io.StringIO()
    quoting = csv.QUOTE_ALL if any("\r" in text for text in texts) else csv.QUOTE_MINIMAL
    csv.writer(buffer, lineterminator="\n", quoting=quoting).writerow(texts)
    return buffer.getvalue()


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
