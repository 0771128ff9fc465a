"""A file name as text any UTF-8 file or console holds, and a CSV line of such names: predict and scripts.score write
names alike through here. Standard library only (scripts.score runs without torch).

    python -m scripts.train predict --config configs/birds.yaml --ckpt_path CKPT --data.predict_path photos/
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence


def printable_name(name: str) -> str:
    """`name` with each byte that is not UTF-8 (os.fsdecode's surrogates, which no UTF-8 file can hold) as `\\xNN`, as
    `ls -b` shows it, and a backslash that would read as one as `\\x5c`: each `\\xNN` is the byte NN."""
    guarded = re.sub(r"\\(?=x[0-9a-f]{2})", r"\\x5c", name)
    return guarded.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def csv_line(cells: Sequence[object]) -> str:
    """One CSV line (ending in "\\n") of `cells`, each as str(); names made printable, quoted where the csv module
    needs it, the whole line where a cell holds a carriage return (left bare, a reader splits the row in two)."""
    texts = [printable_name(str(cell)) for cell in cells]
    buffer = io.StringIO()
    quoting = csv.QUOTE_ALL if any("\r" in text for text in texts) else csv.QUOTE_MINIMAL
    csv.writer(buffer, lineterminator="\n", quoting=quoting).writerow(texts)
    return buffer.getvalue()
