"""The exception type for mistakes in a user's data: `scripts.train` prints it as one line. Standard library only: the
registered model ships it.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path my.csv --data.init_args.label y
"""

from __future__ import annotations


class DataError(Exception):
    """Bad input data (missing file, wrong columns, unreadable image...); the message names the culprit and the fix."""
