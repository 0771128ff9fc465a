"""Shared test fixtures: the repository root and a runner for the real CLI in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def run_module(module: str, *args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m <module> args...` from the repository root, as a user types it."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.fixture
def train_cli(tmp_path):
    """Runs `python -m scripts.train SUBCOMMAND ...` with outputs (MLflow store, checkpoints) under tmp_path."""

    def run(subcommand: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return run_module(
            "scripts.train", subcommand, *args, "--trainer.default_root_dir", str(tmp_path / "outputs"), env=env
        )

    return run
