"""`python -m MODULE ARGS` for the tests, without paying Python's import of torch, Lightning and MLflow each time.

A launcher process imports those libraries once, then forks one child per command. The child is a real process of
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
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PRELOAD = ("torch", "torchvision", "lightning.pytorch", "lightning.pytorch.cli", "torchmetrics", "mlflow", "pandas")
# Variables a preloaded library reads when it is imported: a command that sets one gets a fresh interpreter.
FRESH_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTORCH_", "TORCH_", "PL_", "LIGHTNING_")
LAUNCHERS = 2  # commands that can run at once (the tests run at most two side by side on CI's 2 cores)


class Launcher:
    """One launcher process: a command at a time."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run(self, module: str, args: list[str], cwd: str, env: dict[str, str], timeout: float):
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            request = {"module": module, "args": args, "cwd": cwd, "env": env, "stdout": str(out), "stderr": str(err)}
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            pid = json.loads(self.process.stdout.readline())["pid"]
            expired = threading.Event()
            timer = threading.Timer(timeout, lambda: (expired.set(), os.kill(pid, signal.SIGKILL)))
            timer.start()
            status = json.loads(self.process.stdout.readline())["status"]
            timer.cancel()
            command = [sys.executable, "-m", module, *args]
            if expired.is_set():
                raise subprocess.TimeoutExpired(command, timeout, out.read_text(), err.read_text())
            return subprocess.CompletedProcess(command, status, out.read_text(), err.read_text())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


_idle: list[Launcher] = []
_started = 0  # launchers started, idle or running a command
_available = threading.Condition()


def take() -> Launcher:
    """An idle launcher; a new one while fewer than LAUNCHERS run (each costs an import of torch, Lightning and
    MLflow, so a test process that never runs two commands at once starts one)."""
    global _started
    with _available:
        while not _idle and _started >= LAUNCHERS:
            _available.wait()
        if _idle:
            return _idle.pop()
        _started += 1
    return Launcher()


def give_back(launcher: Launcher) -> None:
    with _available:
        _idle.append(launcher)
        _available.notify()


def close() -> None:
    """Ends the launcher processes (the test session's end)."""
    global _started
    with _available:
        while _idle:
            _idle.pop().close()
        _started = 0


def run(
    module: str, args: list[str], cwd: str | Path, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`python -m module args` in `cwd` with `env` (default: this process's), as subprocess.run with
    capture_output=True and text=True gives it."""
    env = dict(os.environ if env is None else env)
    changed = {key for key in env if env.get(key) != os.environ.get(key)} | (set(os.environ) - set(env))
    if any(key.startswith(FRESH_ENV) for key in changed):
        return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip
    launcher = take()
    try:
        return launcher.run(module, [str(arg) for arg in args], str(cwd), env, timeout)
    finally:
        give_back(launcher)


def serve() -> None:
    """The launcher: imports PRELOAD, then forks a child per request line, which runs its command."""
    del sys.path[0]  # this file's folder: the child's own path comes first (run_child)
    for name in PRELOAD:
        importlib.import_module(name)
    gc.freeze()  # what the children share stays out of their collections, at their exit too
    while line := sys.stdin.readline():
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(request)  # does not return
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)


def run_child(request: dict) -> None:
    """The command in this (forked) process, as `python -m` runs it, ending as the interpreter would end it."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    python_path = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:0] = [os.getcwd(), *python_path]
    sys.argv = [request["module"], *request["args"]]
    sweep_launcher().run_module_and_exit(request["module"])


def sweep_launcher():
    """scripts/sweeps/launcher.py, the sweeps' launcher, loaded from its file under a name of its own: its
    run_module_and_exit ends a child as a sweep's trial ends. Not imported as `scripts.sweeps.launcher`, which would
    import the package `scripts` here, and every child would then take the project's code from this checkout
    instead of its own working directory (a node's copy)."""
    spec = importlib.util.spec_from_file_location("sweep_launcher", REPO / "scripts" / "sweeps" / "launcher.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    serve()
