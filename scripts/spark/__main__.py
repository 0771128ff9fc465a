"""`python -m scripts.spark fit|score ...` (scripts/spark/__init__.py says what each does). A Databricks job's Python
script task runs this file by its path: the checkout is then put on sys.path and made the working directory, as
everywhere else code runs from the repository's root.

    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2
"""

import gc
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the checkout is the package root
    REPOSITORY = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(REPOSITORY))
    if Path.cwd() == Path(__file__).resolve().parent:  # Databricks runs a script from its own folder
        os.chdir(REPOSITORY)

from scripts.spark import main  # noqa: E402 (the checkout is on sys.path from here)

try:
    main()
finally:
    # Python's last collections at exit walked every object Lightning, pyspark and MLflow made: seconds after the
    # command's last line (docs/measured.md). Frozen, they are skipped.
    gc.freeze()
