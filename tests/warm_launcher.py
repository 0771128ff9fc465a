"""`python -m MODULE ARGS` for the tests, without paying Python's import of torch, Lightning and MLflow each time.

A launcher process imports those libraries once, then forks one child per command, several at once where asked
(the processes of a job). The child is a real process of its own: it takes the command's working directory,
environment, stdin (empty), stdout and stderr, runs the module as `python -m` does (runpy, `__main__`, sys.path[0]
the working directory, then PYTHONPATH) and ends as the interpreter ends (atexit handlers, an uncaught exception's
traceback and exit status 1, `sys.exit`'s status or message), without the interpreter's teardown
(run_module_and_exit). The project's own modules are imported fresh in every child, from its own sys.path; only
third-party libraries are shared, and none of them has started a thread, opened a file or a connection when the fork
happens. Three of CPython's private names serve this file alone, the tests' machinery, never the product
(tests/test_warm_launcher.py checks they are there).

What a preloaded library reads from the environment at its import is the launcher's, not the command's: commands
that set such variables (Lightning's MLFLOW_TRACKING_URI default, which scripts.train reads again itself, is the
one the tests rely on) are run in a fresh interpreter by `run` (see FRESH_ENV).

    from tests.warm_launcher import run
    result = run("scripts.train", ["fit", "--config", "configs/penguins.yaml"], cwd=REPO)
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]

# matplotlib draws the evaluation report at the end of every test (scripts/training/run_record.py); MLflow's sqlite
# store, its migrations and tracing, and git are what every fit imports besides (else ~0.9 s more CPU a command).
# Not optuna, an extra that a plain command must not find imported, nor the project's modules, which each child
# imports itself.
PRELOAD = (
    "torch", "torch.utils.serialization", "torchvision", "lightning.pytorch", "lightning.pytorch.cli", "torchmetrics",
    "mlflow", "pandas", "matplotlib.figure", "matplotlib.backends.backend_agg",
    "mlflow.store.tracking.sqlalchemy_store", "mlflow.store.tracking.sqlalchemy_workspace_store",
    "mlflow.store.workspace.utils", "mlflow.tracing.processor.base_mlflow", "mlflow.tracing.processor.otel",
    "mlflow.tracing.utils.environment", "sqlalchemy.dialects.sqlite", "sqlalchemy.dialects.mysql",
    "sqlalchemy.dialects.mssql", "alembic.command", "alembic.config", "opentelemetry.sdk.metrics", "git", "filelock",
)  # fmt: skip
# Variables a preloaded library reads when it is imported: a command that sets one gets a fresh interpreter.
FRESH_ENV = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTORCH_", "TORCH_", "PL_", "LIGHTNING_", "MPL",
)  # fmt: skip


class Command:
    """A command the launcher forked, as much of subprocess.Popen as the tests use (args, pid, returncode, poll, wait,
    communicate, send_signal, terminate, kill), its output kept in files until it ends."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.folder = Path(tempfile.mkdtemp(prefix="warm-launcher-"))
        self.pid: int | None = None
        self.returncode: int | None = None
        self.output: tuple[str, str] | None = None
        self.started = threading.Event()
        self.finished = threading.Event()
        self.lock = threading.Lock()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.finished.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        # Under the lock that `ended` takes: a reaped command's pid is never signalled (it could be another process's).
        with self.lock:
            if self.pid is not None and not self.finished.is_set():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def forked(self, pid: int) -> None:
        self.pid = pid
        self.started.set()

    def ended(self, status: int | None) -> None:
        # Its output is read and its folder removed here, not in communicate(): a test that only waits for the
        # command, or kills it, would otherwise leave the folder in the temporary directory.
        self.output = tuple(self.read_output(name) for name in ("stdout", "stderr"))
        shutil.rmtree(self.folder, ignore_errors=True)
        with self.lock:
            self.returncode = status
            self.started.set()
            self.finished.set()

    def read_output(self, name: str) -> str:
        try:
            return (self.folder / name).read_text(errors="replace")
        except FileNotFoundError:  # the launcher died before it forked the command
            return ""

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """(stdout, stderr) once it has ended."""
        self.wait(timeout)
        return self.output


class Launcher:
    """One launcher process, forking as many commands at once as it is asked for."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.commands: dict[int, Command] = {}
        self.lock = threading.Lock()
        self.next_id = 0
        threading.Thread(target=self.read, name="warm-launcher", daemon=True).start()

    def read(self) -> None:
        """The launcher's answers: a command's pid when forked, its exit status when it has ended."""
        for line in self.process.stdout:
            message = json.loads(line)
            with self.lock:
                command = self.commands[message["id"]]
            if "pid" in message:
                command.forked(message["pid"])
            else:
                with self.lock:
                    del self.commands[message["id"]]
                command.ended(message["status"])
        with self.lock:  # the launcher died: its commands' ends are unknown
            lost, self.commands = list(self.commands.values()), {}
        for command in lost:
            command.ended(None)

    def start(self, module: str, args: list[str], cwd: str, env: dict[str, str]) -> Command:
        command = Command([sys.executable, "-m", module, *args])
        request = {"module": module, "args": args, "cwd": cwd, "env": env, "folder": str(command.folder)}
        with self.lock:
            self.next_id += 1
            self.commands[self.next_id] = command
            self.process.stdin.write((json.dumps({"id": self.next_id, **request}) + "\n").encode())
            self.process.stdin.flush()
        command.started.wait()
        if command.pid is None:
            raise RuntimeError(f"the warm launcher died before it started {module}")
        return command

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


_launcher: Launcher | None = None
_launcher_lock = threading.Lock()


def launcher() -> Launcher:
    """This process's launcher, started the first time a command is asked for (or again, if it died)."""
    global _launcher
    with _launcher_lock:
        if _launcher is None or _launcher.process.poll() is not None:
            _launcher = Launcher()
        return _launcher


def close() -> None:
    """Ends the launcher process (the test session's end)."""
    global _launcher
    with _launcher_lock:
        if _launcher is not None:
            _launcher.close()
        _launcher = None


def fresh_interpreter_needed(env: dict[str, str]) -> bool:
    """Whether `env` changes a variable a preloaded library read at its import (FRESH_ENV)."""
    changed = {key for key in env if env.get(key) != os.environ.get(key)} | (set(os.environ) - set(env))
    return any(key.startswith(FRESH_ENV) for key in changed)


def start(
    module: str, args: list[str], cwd: str | Path, env: dict[str, str] | None = None
) -> Command | subprocess.Popen:
    """`python -m module args` in `cwd` with `env` (default: this process's), forked (a fresh interpreter where `env`
    needs one); returns at once. Its communicate() gives text."""
    env = dict(os.environ if env is None else env)
    args = [str(arg) for arg in args]
    if fresh_interpreter_needed(env):
        command = [sys.executable, "-m", module, *args]
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return launcher().start(module, args, str(cwd), env)


def run(
    module: str, args: list[str], cwd: str | Path, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`python -m module args` in `cwd` with `env` (default: this process's), as subprocess.run with
    capture_output=True and text=True gives it."""
    env = dict(os.environ if env is None else env)
    if fresh_interpreter_needed(env):
        return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip
    command = launcher().start(module, [str(arg) for arg in args], str(cwd), env)
    try:
        command.wait(timeout)
    except subprocess.TimeoutExpired:
        command.kill()
        raise subprocess.TimeoutExpired(command.args, timeout, *command.communicate()) from None
    return subprocess.CompletedProcess(command.args, command.returncode, *command.communicate())


# ---- the launcher process (`python tests/warm_launcher.py`) ----


def serve() -> None:
    """The launcher: imports PRELOAD, then forks a child per request line, which runs its command (an answer with
    the pid at the fork, one with the exit status at the end)."""
    requests, answers = take_pipes()
    del sys.path[0]  # this file's folder: the child's own path comes first (run_child)
    gc.disable()  # no collections while the preloaded libraries' objects are made (scripts/train.py)
    for name in PRELOAD:
        importlib.import_module(name)
    leave_finalizers_to_teardown()
    gc.freeze()  # what the children share stays out of their collections
    gc.enable()
    request = fork_on_request(requests, answers)
    if request is not None:
        run_child(request)


def take_pipes() -> tuple[int, int]:
    """This process's stdin and stdout (the pipes from and to the tests' process), moved aside: 0 reads nothing and
    1 writes to stderr, so nothing printed here or in a child reaches the answers."""
    requests, answers = os.dup(0), os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    return requests, answers


def leave_finalizers_to_teardown() -> None:
    """The finalizers registered so far (the preloaded libraries': torch.library's operator registrations, each
    undone at exit) belong to the interpreter's teardown, which a child skips (run_module_and_exit); at its exit a
    child runs the exit handlers and finalizers registered in it, its own (weakref.finalize._registry: CPython's)."""
    for finalizer in list(weakref.finalize._registry):
        finalizer.atexit = False


def fork_on_request(requests: int, answers: int) -> dict | None:
    """Forks a child per JSON line read from `requests` (it needs an "id"), answering {"id", "pid"} at the fork and
    {"id", "status"} (os.waitstatus_to_exitcode's) when the child has ended, any number at once. Returns in the
    child (its request), None when `requests` closes (the tests' process has gone)."""
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
    """The command in this (forked) process, as `python -m` runs it, ending as the interpreter would end it."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # the launcher's, read once; the command's TMPDIR is read anew, as `python -m` reads it
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(Path(request["folder"]) / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    python_path = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:0] = [os.getcwd(), *python_path]
    sys.argv = [request["module"], *request["args"]]
    run_module_and_exit(request["module"])


def run_module_and_exit(module: str) -> NoReturn:
    """Runs `module` as `python -m` does in this forked process, then ends the process as the interpreter ends one:
    its non-daemon threads joined, the exit handlers run, the standard streams flushed, the same exit status (an
    uncaught exception's traceback and 1, `sys.exit`'s status or message, death by SIGINT for an uncaught Ctrl-C).
    It skips what comes after, the interpreter's teardown: freeing every object would write to every page of the
    launcher's imports, copying them into the child first (docs/measured.md has what that costs a command).
    Python runs exit handlers and joins threads through threading._shutdown and atexit._run_exitfuncs, which are what
    this calls (CPython's own)."""
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


if __name__ == "__main__":
    serve()
