"""make bench-gpu (scripts/bench/gpu.sh) on a machine without an NVIDIA GPU: one line, exit status 1, nothing written.
Its steps themselves run only on a GPU machine (docs/measured.md, "On a GPU").

.venv/bin/python -m pytest -q tests/bench/test_bench_gpu.py
"""

from __future__ import annotations

import os
import subprocess

from tests.conftest import REPO


def test_without_a_gpu_it_says_so_in_one_line_and_writes_nothing(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no devices' >&2\nexit 9\n")
    (tools / "nvidia-smi").chmod(0o755)
    logs = tmp_path / "logs"
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "LOGS": str(logs)}
    result = subprocess.run(["bash", "scripts/bench/gpu.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == (
        "error: make bench-gpu needs an NVIDIA GPU, and nvidia-smi finds none here; run it on a GPU machine\n"
    )
    assert result.stdout == "" and not logs.exists()
