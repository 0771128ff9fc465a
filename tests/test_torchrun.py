"""scripts.torchrun: torchrun whose end, when a process it started fails, is one line naming the rank and its exit
status, not torchrun's ChildFailedError traceback and summary (the failing rank's own line stays above it).

.venv/bin/python -m pytest -q tests/test_torchrun.py
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_a_failed_rank_ends_torchrun_in_one_line():
    # `false` as the program torchrun starts (--no-python): a process that exits 1 at once, as a refused rank does.
    command = [sys.executable, "-m", "scripts.torchrun", "--nproc_per_node", "1", "--no-python", "false"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: torchrun: rank 0 (local rank 0) ended with exit status 1, and torchrun stopped the others; that "
        "rank's own error is above"
    )
