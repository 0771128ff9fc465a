"""The sweep's trial launcher forked from the sweep process itself, where that is as good as a fresh one: the sweep
imports what the launcher preloads (it needs torch and Lightning for its own checks anyway) and forks before it does
anything else, so the launcher does not import them a second time (~5 s of CPU a sweep: docs/measured.md).

    python -m scripts.sweep configs/sweeps/penguins.yaml    # its Launcher (scripts/sweeps/launcher.py) forks it

Forking is only as good as a fresh `python -m scripts.sweeps.launcher` while this process runs one thread and has
opened nothing (no study, no store: the launcher's own rule, see scripts/sweeps/launcher.py), and while the launcher's
environment differs from this process's only where nothing read it at start-up (MLflow's run variables, which the
sweep keeps from its trials). Otherwise, and for a launcher started again after one died, the launcher is a fresh
interpreter as before.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

# What the sweep keeps from its launcher (scripts.sweep): MLflow reads them when a run starts, not at an import.
RUN_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID")


class ForkedLauncher:
    """The forked launcher, as much of subprocess.Popen as scripts.sweeps.launcher.Launcher uses: pid, stdin, stdout,
    stderr, poll, wait, kill."""

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.stdin, self.stdout, self.stderr = os.fdopen(stdin, "wb"), os.fdopen(stdout, "rb"), os.fdopen(stderr, "rb")
        self.returncode: int | None = None
        self._lock = threading.Lock()  # the reader thread waits while the sweep polls: one of them reaps it

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.05)
        return self.returncode

    def kill(self) -> None:
        with self._lock:  # a reaped launcher's pid is never signalled (it could be another process's)
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)


def can_fork(env: dict[str, str]) -> bool:
    """Whether a fork of this process now is the launcher a fresh interpreter with `env` would be."""
    differs = {key for key in {*env, *os.environ} if env.get(key) != os.environ.get(key)}
    return threading.active_count() == 1 and differs <= set(RUN_VARIABLES)


def fork_launcher(env: dict[str, str], preload: tuple[str, ...], serve: Callable[[], None]) -> ForkedLauncher | None:
    """The launcher as a fork of this process after it has imported `preload`, in a session of its own, `serve`
    running in it (scripts.sweeps.launcher's main: what `python -m scripts.sweeps.launcher` with `env` runs); None
    where a fork would not be that launcher (can_fork)."""
    if not can_fork(env):
        return None
    before = dict(os.environ)
    gc.disable()  # their objects live as long as the sweep: no collections while they are made (scripts/train.py)
    for name in preload:
        importlib.import_module(name)
    gc.freeze()
    gc.enable()
    if threading.active_count() > 1:  # an import started a thread
        return None
    # What the imports set in the environment (torch's and Lightning's defaults, MLflow's session) they would set in
    # a fresh launcher too.
    env = {**env, **{key: value for key, value in os.environ.items() if before.get(key) != value}}
    for key in set(before) - set(os.environ):
        env.pop(key, None)
    pipes = [os.pipe() for _ in range(3)]  # (read, write): its stdin, stdout, stderr
    sys.stdout.flush()  # nothing buffered here is written twice, by the launcher too
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        serve_in_child(env, pipes, serve)
    for theirs in (pipes[0][0], pipes[1][1], pipes[2][1]):
        os.close(theirs)
    return ForkedLauncher(pid, pipes[0][1], pipes[1][0], pipes[2][0])


def serve_in_child(env: dict[str, str], pipes: list[tuple[int, int]], serve: Callable[[], None]) -> NoReturn:
    """`serve` in the forked child: its standard streams the pipes, nothing else of the sweep's open, the environment
    `env`. Never returns into the sweep's code."""
    status = 1
    try:
        os.setsid()  # as Popen(start_new_session=True): a Ctrl-C in the terminal reaches the sweep alone
        for fd, pipe_end in ((0, pipes[0][0]), (1, pipes[1][1]), (2, pipes[2][1])):
            os.dup2(pipe_end, fd)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.environ.clear()
        os.environ.update(env)
        serve()
        status = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(status)
