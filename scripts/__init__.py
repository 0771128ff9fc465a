"""The commands a person or a job runs (`python -m scripts.<verb>`) and, in the subpackages, their plumbing."""

import atexit
import gc

# Registered before torch, Lightning or MLflow is imported, so it runs after their exit handlers: Python's last
# collections would otherwise walk every object they made, seconds per process on busy cores (docs/measured.md).
atexit.register(gc.freeze)
