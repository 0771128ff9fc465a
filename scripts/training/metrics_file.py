"""--metrics_file: the metrics at the end of a fit (the last validation's and the test's) or a test, as one JSON
object of numbers, for a pipeline's next step or a script. Loaded only with --metrics_file.

    python -m scripts.train fit --config configs/penguins.yaml --metrics_file outputs/metrics.json
"""

from __future__ import annotations

import json
from pathlib import Path

from scripts.training.checkpoints import write_whole


def write_metrics(metrics: dict, path: Path) -> None:
    """Written whole, by global rank 0 (the CLI's after_fit, after_test)."""
    values = {name: float(value) for name, value in sorted(metrics.items())}
    write_whole(path, (json.dumps(values, indent=1) + "\n").encode())
    print(f"wrote metrics: {path}")
