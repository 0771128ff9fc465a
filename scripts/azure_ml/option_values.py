"""The Azure ML commands' options that are text of a given form, parsed: a time limit (--timeout), the container's
shared memory (--shm_size, by default from the DataLoader workers) and a registered asset (azureml:NAME:VERSION).

    python -m scripts.submit configs/birds.yaml --compute gpu-cluster --tier spot --timeout 1h30m --shm_size 8g
"""

from __future__ import annotations

import re

from scripts.azure_ml.errors import SubmitError

TIERS = ("spot", "standard")  # Azure ML's queue settings' job tiers a job here takes: preemptible, or not
# --timeout: seconds, or a duration of days, hours, minutes and seconds in that order (90m, 4h, 1h30m, 2d).
DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
SHM_SIZE = re.compile(r"[1-9][0-9]*[bkmg]")  # Docker's --shm-size, as Azure ML takes it
# DataLoader workers hand every batch to their training process through /dev/shm (prefetch_factor batches each), and
# Docker's default /dev/shm (64 MB) ends a fit with a bus error; 1 GB a worker of each process on the node is ample
# for these tasks' batches (birds: 16 x 3 x 224 x 224 float32, 10 MB), 2 GB at least.
SHM_GB_PER_WORKER, SHM_GB_MIN = 1, 2
REFERENCE = re.compile(r"(?:azureml:)?([A-Za-z0-9][A-Za-z0-9_.-]*):([0-9]+)")


def parse_duration(text: str) -> int:
    """--timeout's seconds: `3600`, or days, hours, minutes, seconds in that order: `90m`, `4h`, `1h30m`, `2d`."""
    plain = str(text).strip().lower()
    found = DURATION.fullmatch(plain + "s" if plain.isdigit() else plain)
    if not plain or found is None:
        raise SubmitError(f"--timeout {text!r}: give seconds (3600) or a duration such as 90m, 4h, 1h30m or 2d")
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total < 1:
        raise SubmitError(f"--timeout {text!r}: give a limit of 1 second or more")
    return total


def parse_reference(text: str, option: str, example: str) -> str:
    """azureml:NAME:VERSION (or NAME:VERSION) of a registered asset, as azureml:NAME:VERSION."""
    found = REFERENCE.fullmatch(text)
    if found is None:
        raise SubmitError(f"{option} {text!r}: give a registered one as azureml:NAME:VERSION, e.g. {example}")
    return f"azureml:{found.group(1)}:{found.group(2)}"


def shm_size_of(given: str | None, workers: int, processes_per_node: int) -> str | None:
    """The container's /dev/shm: as given, else one that follows the DataLoader workers (None: Azure ML's own)."""
    if given is not None:
        if not SHM_SIZE.fullmatch(given):
            raise SubmitError(f"--shm_size {given!r}: give a number and a unit of b, k, m or g, e.g. 8g")
        return given
    if workers < 1:
        return None
    return f"{max(SHM_GB_MIN, SHM_GB_PER_WORKER * workers * processes_per_node)}g"
