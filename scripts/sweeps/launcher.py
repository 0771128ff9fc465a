"""Trials started from a warm process: a local sweep's launcher imports torch, Lightning and MLflow once, then forks
one child per trial, which runs `python -m scripts.train fit ...` as a fresh interpreter would, without those imports
(docs/measured.md: the sweep bench).

    python -m scripts.sweep configs/sweeps/penguins.yaml    # scripts.sweep starts and feeds the launcher itself

Isolation is a process's: each trial is a child of its own (its own pid, session, exit status, crash, memory), with
the trial's working directory, environment, stdin (empty), and stdout and stderr appended to its trial.log; it ends
as the interpreter ends (atexit handlers, an uncaught exception's exit status 1, `sys.exit`'s status). A child that
dies of a signal (a segfault, an abort, the OOM killer) or hangs takes nothing else down.

Why a launcher process and not a fork of the sweep itself: by the time trials start, the sweep has trained (its
check of the objective), holds sqlite connections (the study, the MLflow store) and runs threads (Optuna's
heartbeat, parallel trials); a fork carries all of that into the child, half-done. The launcher is started before
any of it, by the sweep, in a session of its own (a Ctrl-C in the terminal reaches the sweep, which stops the trials
itself): forked from the sweep once it has imported PRELOAD (scripts/sweeps/launcher_fork.py), else as `python -m
scripts.sweeps.launcher`. It imports libraries and the project's training modules and parses a trial's command as
the CLI does (jsonargparse then keeps the parsers of the classes it names), opens no connection or store and starts
no Python thread; the only threads it has when it forks are the idle pools of numpy's and SciPy's OpenBLAS and
pyarrow's jemalloc, which their libraries re-create in a child (pthread_atfork). A trial's fit then does everything
else itself, as in a fresh process: its MLflow run, the study's storage, torch's thread pool, the seeds.

Protocol, JSON lines: the sweep writes {"id", "module", "args", "cwd", "env", "log"}; the launcher answers {"id",
"pid"} at the fork and {"id", "status"} (os.waitstatus_to_exitcode's: -6 for SIGABRT) when the child has ended. When
the sweep is gone (its end of the pipe closes, SIGKILL included), the launcher exits; a running fit then sees its
parent gone and stops (scripts.sweeps.trial.SweepTrial). Needs os.fork and pidfd_open (Linux); elsewhere each trial is
a fresh `python -m` process, as before.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import weakref
from collections import deque
from pathlib import Path
from typing import NoReturn

# What every trial's fit imports (found by listing the modules a forked fit imported that its launcher had not): the
# libraries, MLflow's sqlite store, run and tracing pieces, the project's training modules. The classes the sweep's
# configs name (network, datamodule) are added by the sweep (config_modules).
PRELOAD = (
    "torch",
    "torch.utils.serialization",
    "lightning.pytorch",
    "lightning.pytorch.cli",
    "torchmetrics",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.tracking.sqlalchemy_workspace_store",
    "mlflow.store.workspace.utils",
    "mlflow.tracing.processor.base_mlflow",
    "mlflow.tracing.processor.otel",
    "mlflow.tracing.utils.environment",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.mysql",
    "sqlalchemy.dialects.mssql",
    "alembic.command",
    "alembic.config",
    "opentelemetry.sdk.metrics",
    "git",
    "filelock",
    "optuna",
    "optuna.storages._rdb.models",
    "scripts.training.cli",
    "scripts.sweeps.space",
    "scripts.sweeps.trial",
)
READY_S = 600  # the launcher's imports, on busy cores: a launcher not ready by then is reported as broken


def available() -> bool:
    """Whether trials can be forked here (Linux: fork and pidfds)."""
    return hasattr(os, "fork") and hasattr(os, "pidfd_open") and sys.platform.startswith("linux")


class LauncherError(Exception):
    """The launcher process could not start a trial (it failed to import, or died)."""


class Child:
    """A trial forked by the launcher, as much of subprocess.Popen as the sweep uses: pid, returncode, wait,
    send_signal, terminate, kill."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.pid: int | None = None
        self.returncode: int | None = None
        self.lost = False  # the launcher died before reporting how the child ended
        self.launcher: subprocess.Popen | None = None  # the launcher process that forked it
        self._started = threading.Event()
        self._ended = threading.Event()
        self._lock = threading.Lock()

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"trial {self.number}", timeout)
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        # Under the lock that `ended` takes: a reaped child's pid is never signalled (it could be another process's).
        with self._lock:
            if self.pid is not None and not self._ended.is_set():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def started(self, pid: int) -> None:
        self.pid = pid
        self._started.set()

    def wait_started(self, timeout: float | None = None) -> bool:
        """Whether the launcher has forked it (or has said it never will: `ended`) within `timeout`."""
        return self._started.wait(timeout)

    def ended(self, status: int | None) -> None:
        with self._lock:
            self.returncode, self.lost = status, status is None
            self._started.set()
            self._ended.set()


class Launcher:
    """The sweep's side: starts the launcher process (its imports run while the sweep checks its file) and asks it
    for one child per trial. Thread-safe: parallel trials (--n_jobs) share it. `modules`: what to import besides
    PRELOAD; `command`: a training command like the trials' (`fit --config ...`) to parse before the first fork."""

    def __init__(self, env: dict[str, str], modules: list[str] = (), command: list[str] = ()) -> None:
        self.env, self.modules, self.command = env, list(modules), list(command)
        self.process: subprocess.Popen | None = None
        self.errors: deque[str] = deque(maxlen=5)  # the launcher's last lines on stderr, for a launcher that failed
        self.children: dict[int, Child] = {}
        self.lock = threading.Lock()
        self.next_id = 0
        self.start_process()

    def start_process(self) -> None:
        """The launcher: the first forked from this process where a fork is as good (scripts.sweeps.launcher_fork),
        else, and after one died, `python -m scripts.sweeps.launcher`."""
        from scripts.sweeps.launcher_fork import fork_launcher

        argv = [*self.modules, *(["--", *self.command] if self.command else [])]
        forked = fork_launcher(self.env, PRELOAD, lambda: main(argv)) if self.process is None else None
        self.process = forked or subprocess.Popen(
            [sys.executable, "-m", "scripts.sweeps.launcher", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        threading.Thread(target=self.read, args=(self.process,), name="sweep-launcher", daemon=True).start()
        threading.Thread(target=self.read_errors, args=(self.process,), name="sweep-launcher-err", daemon=True).start()

    def read_errors(self, process: subprocess.Popen) -> None:
        for line in process.stderr:
            if line.strip():
                self.errors.append(line.decode(errors="replace").strip())

    def read(self, process: subprocess.Popen) -> None:
        """The launcher's answers; at its end, every child it did not report is lost."""
        for line in process.stdout:
            message = json.loads(line)
            with self.lock:
                child = self.children.get(message["id"])
            if child is None:
                continue
            if "pid" in message:
                child.started(message["pid"])
            else:
                with self.lock:
                    self.children.pop(message["id"], None)
                child.ended(message["status"])
        process.wait()
        with self.lock:  # this launcher's children only: a new launcher may have started others meanwhile
            lost = {key: child for key, child in self.children.items() if child.launcher is process}
            for key in lost:
                del self.children[key]
        for child in lost.values():
            child.ended(None)

    def start(self, number: int, module: str, args: list[str], env: dict[str, str], log: Path) -> Child:
        """`python -m module args` with `env` in this process's working directory, output appended to `log`."""
        child = Child(number)
        with self.lock:
            if self.process.poll() is not None:  # died (killed, out of memory): a new one for the next trials
                self.start_process()
            self.next_id += 1
            self.children[self.next_id] = child
            child.launcher = self.process
            request = {"id": self.next_id, "module": module, "args": args, "cwd": os.getcwd(), "env": env}
            request["log"] = str(log)
            try:
                self.process.stdin.write((json.dumps(request) + "\n").encode())
                self.process.stdin.flush()
            except BrokenPipeError:
                pass  # the reader reports the child lost
        child.wait_started(READY_S)
        if child.pid is None:
            child.ended(None)
            said = f": {self.errors[-1]}" if self.errors else ""
            raise LauncherError(f"the trial launcher (python -m scripts.sweeps.launcher) did not start the fit{said}")
        return child

    def close(self) -> None:
        """Ends the launcher: it holds nothing to save (a child still running stops by itself, its parent gone)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# ---- the launcher process ----


def config_modules(configs: list[str]) -> list[str]:
    """The modules of the classes that configs name (class_path anywhere in them), for the launcher to import."""
    import yaml

    found: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            path = node.get("class_path")
            if isinstance(path, str) and "." in path:
                found.append(path.rsplit(".", 1)[0])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for config in configs:
        with contextlib.suppress(OSError, yaml.YAMLError):
            walk(yaml.safe_load(Path(config).read_text()))
    return sorted(set(found))


def serve(argv: list[str]) -> dict | None:
    """Imports PRELOAD and the modules in `argv`, parses the training command after its `--` (if any), then forks a
    child per request; returns in the child (its request), None at the end."""
    requests, answers = take_pipes()
    modules, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    gc.disable()  # no collections while the preloaded libraries' objects are made (scripts/train.py)
    for name in PRELOAD:
        importlib.import_module(name)
    for name in modules:  # a config's own class that fails to import fails its trial, with its message, not this
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if command:  # jsonargparse then has the parsers of the classes the trials name (preflight.parse_only)
        from scripts.sweeps.preflight import parse_only

        parse_only(command)
    leave_finalizers_to_teardown()
    gc.freeze()  # what the children share stays out of their collections, at their exit too
    gc.enable()
    return fork_on_request(requests, answers)


def leave_finalizers_to_teardown() -> None:
    """The finalizers registered so far (the preloaded libraries': torch.library's operator registrations, each
    undone at exit) belong to the interpreter's teardown, which a child skips (run_module_and_exit); at its
    exit a child runs the exit handlers and finalizers registered in it, its own (weakref.finalize._registry: CPython's,
    tests/sweeps/test_sweep_isolation.py checks it)."""
    for finalizer in list(weakref.finalize._registry):
        finalizer.atexit = False


def take_pipes() -> tuple[int, int]:
    """This process's stdin and stdout (the pipes from and to the process that asks for children), moved aside:
    0 reads nothing and 1 writes to stderr, so nothing printed here or in a child reaches the answers."""
    requests, answers = os.dup(0), os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    return requests, answers


def fork_on_request(requests: int, answers: int) -> dict | None:
    """Forks a child per JSON line read from `requests` (it needs an "id"), answering {"id", "pid"} at the fork and
    {"id", "status"} when the child has ended, any number at once. Returns in the child (its request), None when
    `requests` closes (the asking process has gone)."""
    children: dict[int, tuple[int, int]] = {}  # pidfd -> (request id, pid)
    pending = b""

    def answer(message: dict) -> None:
        os.write(answers, (json.dumps(message) + "\n").encode())

    while True:
        ready, _, _ = select.select([requests, *children], [], [])
        for fd in ready:
            if fd != requests:
                request_id, pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                answer({"id": request_id, "status": os.waitstatus_to_exitcode(status)})
                continue
            data = os.read(requests, 1 << 16)
            if not data:
                return None
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()  # nothing buffered here is written twice, by the child too
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    for inherited in (requests, answers, *children):
                        os.close(inherited)
                    return request
                children[os.pidfd_open(pid)] = (request["id"], pid)
                answer({"id": request["id"], "pid": pid})


def run_child(request: dict) -> None:
    """The trial's command in this (forked) process, as `python -m` runs it."""

    os.setsid()  # as the sweep's Popen(start_new_session=True) did: the sweep alone decides what signals a trial gets
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.path[0] = os.getcwd()  # where `python -m` looks first (the launcher's was its own working directory)
    sys.argv = [request["module"], *request["args"]]
    run_module_and_exit(request["module"])


def run_module_and_exit(module: str) -> NoReturn:
    """Runs `module` as `python -m` does in this forked process, then ends the process as the interpreter ends one:
    its non-daemon threads joined, the exit handlers run, the standard streams flushed, the same exit status (an
    uncaught exception's traceback and 1, `sys.exit`'s status or message, death by SIGINT for an uncaught Ctrl-C).
    It skips what comes after, the interpreter's teardown: freeing every object would write to every page of the
    launcher's imports, copying them into the child first (docs/measured.md has what that costs a trial).
    Python runs exit handlers and joins threads through threading._shutdown and atexit._run_exitfuncs, which are what
    this calls (CPython's own, tests/sweeps/test_sweep_isolation.py checks they are there)."""
    import atexit
    import runpy

    status, interrupted = 0, False
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            status = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
            status = 1
    except BaseException as error:  # printed and ended on, as the interpreter does
        interrupted = isinstance(error, KeyboardInterrupt)
        sys.excepthook(type(error), error, error.__traceback__)
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


def main(argv: list[str]) -> None:
    """The launcher process (`python -m scripts.sweeps.launcher MODULES -- COMMAND`, or forked by the sweep): serves
    until the sweep closes its stdin; in each forked child, that child's trial."""
    if (child_request := serve(argv)) is not None:
        run_child(child_request)


if __name__ == "__main__":
    main(sys.argv[1:])
