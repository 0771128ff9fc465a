"""The one exception type for mistakes in a user's data (and its kind about one image): `scripts.train` prints it as
one line. And a user's file name as text any UTF-8 file or console holds, in a message or a CSV row: predict's CSV
(scripts/training/cli.py) and scripts.score's (scripts/serving/csv_output.py) write names alike through here, the one
torch-free module every predict already loads. Standard library only: the registered model ships it.

A file name may hold what a CSV line cannot carry bare: a comma or quote (quoted by the csv module), a carriage return
(the csv module leaves it unquoted when lines end in "\\n", and a reader then splits the row in two: such a row is
quoted whole), or bytes that are not UTF-8 (Python holds them as surrogates, which no UTF-8 file or console can
encode: written as `\\xNN`, as `ls -b` shows them).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence


class DataError(Exception):
    """Bad input data (missing file, wrong columns, unreadable image...); the message names the culprit and the fix."""


class ImageError(DataError):
    """A DataError about one image: "<name>: <reason>". Code that holds only its pixels (a crop) calls it "an image",
    and the code that read the file says "<path>: <reason>" instead."""

    def __init__(self, reason: str, name: str = "an image") -> None:
        super().__init__(f"{name}: {reason}")
        self.reason, self.name = reason, name

    def __reduce__(self) -> tuple:  # pickled (a process pool's result), it keeps its two parts
        return type(self), (self.reason, self.name)


def printable_name(name: str) -> str:
    """`name` with each byte that is not UTF-8 (a surrogate of os.fsdecode) as the text `\\xNN`, and a backslash that
    would read as such an escape (`\\xe9` in the name itself) as `\\x5c`, so that the name can be had back: each
    `\\xNN` is the byte NN (`os.fsdecode(re.sub(rb"\\\\x([0-9a-f]{2})", byte, text.encode()))`)."""
    guarded = re.sub(r"\\(?=x[0-9a-f]{2})", r"\\x5c", name)
    return guarded.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def csv_line(cells: Sequence[object]) -> str:
    """One CSV line (ending in "\\n") of `cells`, each as str(); names made printable, quoted where the csv module
    needs it, the whole line where a cell holds a carriage return."""
    texts = [printable_name(str(cell)) for cell in cells]
    buffer = io.StringIO()
    quoting = csv.QUOTE_ALL if any("\r" in text for text in texts) else csv.QUOTE_MINIMAL
    csv.writer(buffer, lineterminator="\n", quoting=quoting).writerow(texts)
    return buffer.getvalue()
