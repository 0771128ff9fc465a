"""What a bench prints while it runs: each figure the moment it is measured, flushed (a pipe, a log file or CI sees it
then, not when the bench ends), and a step that fails as one line naming the bench and the step, exit status 1,
after every figure measured before it. The summary (best or median of the rounds, the ratios) comes last.

    report = Report("penguins")
    seconds = report.measured("round 1, plain tensor loop", lambda s: f"{s * 1000:.1f} ms/epoch", plain, train, val, 2)
    # prints "round 1, plain tensor loop: 150.8 ms/epoch"; if run() raises, the bench ends with
    # "error: penguins bench: round 1, plain tensor loop failed: ValueError: ..."
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
# The lines of a command's output that say what went wrong: the template's own one-line errors, and the last line of
# a Python traceback.
ERROR_LINE = re.compile(r"^(error: .+|[\w.]*(Error|Exception|Exit): .+)$")


class BenchError(RuntimeError):
    """A step's failure already said in one line (a command's exit status and error line): printed as it is."""


def error_line(output: str) -> str:
    """The line of a command's output that says what went wrong: its last error line, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line)]
    return (errors or lines or ["it printed nothing"])[-1]


def run_command(command: list[str], **options) -> subprocess.CompletedProcess:
    """`command`, its output captured as text; a non-zero exit is a BenchError with its status and error line."""
    result = subprocess.run(command, capture_output=True, text=True, **options)
    if result.returncode != 0:
        raise BenchError(f"exit status {result.returncode}: {error_line(result.stderr or result.stdout)}")
    return result


def one_line(error: BaseException) -> str:
    if isinstance(error, BenchError):
        return str(error)
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__


class Report:
    """One bench's steps: each run, its figure printed at once, its failure the bench's last line."""

    def __init__(self, bench: str) -> None:
        self.bench = bench

    def step(self, name: str, run: Callable[..., T], *args) -> T:
        """run(*args); if it raises, the bench ends here: one line naming the step, exit status 1."""
        try:
            return run(*args)
        except Exception as error:
            sys.stdout.flush()
            sys.exit(f"error: {self.bench} bench: {name} failed: {one_line(error)}")

    def measured(self, name: str, figure: Callable[[T], str], run: Callable[..., T], *args) -> T:
        """step(name, run, *args), then `name: figure(its value)` printed and flushed."""
        value = self.step(name, run, *args)
        print(f"{name}: {figure(value)}", flush=True)
        return value
