"""Shared test fixtures: the repository root, a runner for the real CLI in a subprocess, a loopback HTTP server."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def run_module(
    module: str, *args: str, env: dict | None = None, timeout: int = 600, launcher: list[str] = ()
) -> subprocess.CompletedProcess:
    """`[launcher] python -m <module> args...` from the repository root, as a user types it."""
    return subprocess.run(
        [*launcher, sys.executable, "-m", module, *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def train_cli(tmp_path):
    """Runs `python -m scripts.train SUBCOMMAND ...` with outputs (MLflow store, checkpoints) under tmp_path."""

    def run(subcommand: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return run_module(
            "scripts.train", subcommand, *args, "--trainer.default_root_dir", str(tmp_path / "outputs"), env=env
        )

    return run


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def serve():
    """Serves folders over loopback HTTP, as a download mirror would; yields a function folder -> base URL."""
    servers = []

    def start(folder: Path) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(folder)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
