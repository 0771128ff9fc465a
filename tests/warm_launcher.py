"""`python -m MODULE ARGS` for the tests, without paying Python's import of torch, Lightning and MLflow each time.

A launcher process imports those libraries once, then forks one child per command, several at once where asked
(the processes of a job). The child is a real process of
its own: it takes the command's working directory, environment, stdin (empty), stdout and stderr, runs the module as
`python -m` does (runpy, `__main__`, sys.path[0] the working directory, then PYTHONPATH) and ends as the interpreter
ends (atexit handlers, an uncaught exception's traceback and exit status 1, `sys.exit`'s status or message), without
the interpreter's teardown (scripts/sweeps/launcher.py's run_module_and_exit). The
project's own modules are imported fresh in every child, from its own sys.path; only third-party libraries are
shared, and none of them has started a thread, opened a file or a connection when the fork happens.

What a preloaded library reads from the environment at its import is the launcher's, not the command's: commands
that set such variables (Lightning's MLFLOW_TRACKING_URI default, which scripts.train reads again itself, is the
one the tests rely on) are run in a fresh interpreter by `run` (see FRESH_ENV).

    from tests.warm_launcher import run
    result = run("scripts.train", ["fit", "--config", "configs/penguins.yaml"], cwd=REPO)
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# matplotlib draws the evaluation report at the end of every test (scripts/training/run_record.py).
PRELOAD = (
    "torch", "torchvision", "lightning.pytorch", "lightning.pytorch.cli", "torchmetrics", "mlflow", "pandas",
    "matplotlib.figure", "matplotlib.backends.backend_agg",
)  # fmt: skip
# Variables a preloaded library reads when it is imported: a command that sets one gets a fresh interpreter.
FRESH_ENV = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTORCH_", "TORCH_", "PL_", "LIGHTNING_", "MPL",
)  # fmt: skip


def sweep_launcher():
    """scripts/sweeps/launcher.py, the sweeps' launcher, loaded from its file under a name of its own: its loop forks
    the children and its run_module_and_exit ends one as a sweep's trial ends. Not imported as
    `scripts.sweeps.launcher`, which would import the package `scripts` here, and every child would then take the
    project's code from this checkout instead of its own working directory (a node's copy)."""
    spec = importlib.util.spec_from_file_location("sweep_launcher", REPO / "scripts" / "sweeps" / "launcher.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FORKS = sweep_launcher()
# And the libraries every fit imports besides, which the sweeps' launcher preloads for its trials (MLflow's sqlite
# store, its migrations and tracing; git): else each command importing them costs ~0.9 s more CPU. Not optuna, an
# extra that a plain command must not find imported, nor the project's modules, which each child imports itself.
PRELOAD += tuple(name for name in FORKS.PRELOAD if not name.startswith(("optuna", "scripts.")) and name not in PRELOAD)


class Command(FORKS.Child):
    """A command the launcher forked: the sweeps' Child (pid, returncode, poll, wait, send_signal, terminate, kill)
    and what else of subprocess.Popen the tests use (args, communicate), its output kept in files until it ends."""

    def __init__(self, args: list[str]) -> None:
        super().__init__(0)
        self.args = args
        self.folder = Path(tempfile.mkdtemp(prefix="warm-launcher-"))
        self.output: tuple[str, str] | None = None

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return super().wait(timeout)
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(self.args, timeout) from None

    def ended(self, status: int | None) -> None:
        # Its output is read and its folder removed here, not in communicate(): a test that only waits for the
        # command, or kills it, would otherwise leave the folder in the temporary directory.
        self.output = tuple(self.read_output(name) for name in ("stdout", "stderr"))
        shutil.rmtree(self.folder, ignore_errors=True)
        super().ended(status)

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
                command.started(message["pid"])
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
        command.wait_started()
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


def serve() -> None:
    """The launcher: imports PRELOAD, then forks a child per request line, which runs its command (the sweeps'
    launcher's loop: an answer with the pid at the fork, one with the exit status at the end)."""
    forks = FORKS
    requests, answers = forks.take_pipes()
    del sys.path[0]  # this file's folder: the child's own path comes first (run_child)
    gc.disable()  # no collections while the preloaded libraries' objects are made (scripts/train.py)
    for name in PRELOAD:
        importlib.import_module(name)
    forks.leave_finalizers_to_teardown()
    gc.freeze()  # what the children share stays out of their collections
    gc.enable()
    request = forks.fork_on_request(requests, answers)
    if request is not None:
        run_child(request, forks)


def run_child(request: dict, forks) -> None:
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
    forks.run_module_and_exit(request["module"])


if __name__ == "__main__":
    serve()
