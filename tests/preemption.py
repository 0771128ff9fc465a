"""SIGTERM to a running fit, as Azure ML sends it at preemption or cancel: wait for a checkpoint, find the processes of
each rank under a launcher (torchrun, mpirun), signal some, wait for all of them with a deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import torch

# Every process must have ended this long after the signal (issue 25); it is the requirement, not a measured time.
GRACE_S = 30


def epoch_of(path: Path) -> int:
    """The epoch of the checkpoint at `path`, or -1 while there is none (or it is being written)."""
    try:
        return torch.load(path, weights_only=False, map_location="cpu")["epoch"]
    except (OSError, RuntimeError, EOFError, KeyError):
        return -1


def wait_for_epoch(last: Path, epoch: int, processes: list[subprocess.Popen], timeout_s: float = 180) -> None:
    """Returns once `last` holds `epoch` (or a later one), plus a moment to be into the next epoch."""
    deadline = time.monotonic() + timeout_s
    while epoch_of(last) < epoch:
        assert time.monotonic() < deadline, f"no epoch {epoch} in {last} after {timeout_s} s"
        assert all(p.poll() is None for p in processes), "a process ended before the signal"
        time.sleep(0.05)
    time.sleep(0.1)


def rank_processes(launcher: subprocess.Popen, variable: str, count: int, timeout_s: float = 120) -> dict[int, int]:
    """{rank: pid} of the `count` processes that `launcher` started (its descendants whose environment has
    `variable`: RANK for torchrun, OMPI_COMM_WORLD_RANK for mpirun). Linux: read from /proc."""
    deadline = time.monotonic() + timeout_s
    while True:
        parents = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            # "pid (name) state ppid ...": the name may hold spaces, so split after its closing parenthesis
            with contextlib.suppress(OSError, IndexError, ValueError):  # a process that ended meanwhile
                parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        ranks = {}
        for pid in parents:
            ancestor = parents.get(pid)
            while ancestor not in (None, 0, 1, launcher.pid):
                ancestor = parents.get(ancestor)
            if ancestor != launcher.pid:
                continue
            try:
                environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            prefix = f"{variable}=".encode()
            values = [entry[len(prefix) :] for entry in environ if entry.startswith(prefix)]
            if values and b"scripts.train" in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                ranks[int(values[0])] = pid
        if len(ranks) == count:
            return ranks
        assert time.monotonic() < deadline and launcher.poll() is None, f"found ranks {sorted(ranks)} of {count}"
        time.sleep(0.2)


def signal_pids(pids: list[int]) -> float:
    """SIGTERM to each of `pids`; returns when it was sent."""
    sent = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    return sent


def wait_all(processes: list[subprocess.Popen], sent: float) -> list[int]:
    """The exit statuses of `processes`, each of which must end within GRACE_S of `sent`; none is killed here unless
    one has not ended by then (then the test fails, and nothing is left running)."""
    try:
        for process in processes:
            process.wait(timeout=max(0.1, sent + GRACE_S - time.monotonic()))
    except subprocess.TimeoutExpired:
        alive = [process.args for process in processes if process.poll() is None]
        for process in processes:
            process.kill()
        raise AssertionError(f"{len(alive)} process(es) still running {GRACE_S} s after SIGTERM") from None
    return [process.returncode for process in processes]
