"""What the driver of `python -m scripts.spark fit` makes of its tasks' output: every line to a log file, the console
kept to the lines before a failure, and the failure that came first (a task's error, a rank killed by a signal, an
executor lost) in one line.

    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from pathlib import Path

from scripts.spark.task import TASK_FAILED

TASK_FAILED_LINE = re.compile(rf"{TASK_FAILED} (\d+) at ([\d.]+): (.*)")
# What the tasks print once one has failed: torch's and torchrun's tracebacks and reports, dozens of lines a task. They
# go to the log file alone; the console keeps the line naming the failure. `exitcode: -9` is torchrun's word for a
# process killed by a signal (the OOM killer's SIGKILL), reported for the rank its `rank:` line named. A rank whose
# peer is gone prints torch's C++ report first: `[rank1]:[W1127 ...] [c10d] ... failed`, then its C++ stack.
FAILURE_STARTS = re.compile(
    r"\[rank\d+\]: Traceback|Traceback \(most recent call last\)|E\d{4} .* failed \(exitcode"
    r"|(\[rank\d+\]:)?\[[WE]\d{4} [^\]]*\] \[c10d\]|Exception raised from |terminate called after throwing"
)
TORCHRUN_RANK = re.compile(r"\s*rank\s*:\s*(\d+)")
TORCHRUN_SIGNAL = re.compile(r"\s*exitcode\s*:\s*-(\d+)\b")


class TaskErrors:
    """This process's stderr while the tasks run. TorchDistributor writes the lines its tasks print there; all of them
    go to `log` (a file), and to the console until a task fails: what follows a failure is tracebacks. The lines that
    say a task failed (TASK_FAILED) are kept, as (time, rank, message), and the ranks torchrun reports killed by a
    signal, as (time, rank, signal), to report the failure that came first in one line."""

    def __init__(self, stream, log=None) -> None:
        self.stream, self.log = stream, log
        self.failures: list[tuple[float, int, str]] = []
        self.killed: list[tuple[float, int, int]] = []
        self.muted = False
        self._partial = ""
        self._rank: int | None = None

    def write(self, text: str) -> int:
        if self.log is not None:
            self.log.write(text)
            self.log.flush()
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            failed = TASK_FAILED_LINE.search(line)
            if failed:
                self.failures.append((float(failed[2]), int(failed[1]), failed[3]))
            if rank := TORCHRUN_RANK.match(line):
                self._rank = int(rank[1])
            elif (killed := TORCHRUN_SIGNAL.match(line)) and self._rank is not None:
                self.killed.append((time.time(), self._rank, int(killed[1])))
            self.muted = self.muted or bool(failed or FAILURE_STARTS.match(line))
            if not self.muted:
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def failure_line(error: Exception, failures: list[tuple[float, int, str]], killed=()) -> str:
    """One line for a Spark job that failed: a rank killed by SIGKILL (the others then fail for the lost peer), else
    an executor Spark lost, else the task error or kill that came first, else Spark's reason (no Java trace)."""
    text = str(error)
    sigkilled = [kill for kill in killed if kill[2] == signal.SIGKILL]
    lost = re.search(r"ExecutorLostFailure \(([^)]*)\)", text)
    events = sorted(
        [
            *((at, rank, message) for at, rank, message in failures),
            *((at, rank, f"killed by signal {number} ({signal_name(number)})") for at, rank, number in killed),
        ]
    )
    if sigkilled:
        _, rank, number = min(sigkilled)
        return (
            f"rank {rank} of the Spark fit was killed by signal {number} ({signal_name(number)}: out of memory, or "
            "stopped from outside); the other ranks stopped for its loss"
        )
    if lost:
        return f"the Spark fit lost an executor ({lost[1]}): out of memory, or stopped from outside"
    if events:
        _, rank, message = events[0]
        return f"rank {rank} of the Spark fit: {message}"
    reason = re.search(r"Job aborted due to stage failure: ([^\n]*)", text)
    line = reason[1] if reason else next((line for line in text.splitlines() if line.strip()), type(error).__name__)
    return f"the Spark fit failed: {line.strip()} (see the executors' logs)"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def task_log(default_root_dir: str | None) -> Path:
    """A new file for the tasks' whole output, under the fit's root folder (outputs/spark-logs/)."""
    folder = Path(default_root_dir or "outputs") / "spark-logs"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # the fit's own check names an unwritable root; the log goes to the temporary folder
        folder = Path(tempfile.gettempdir())
    return folder / f"fit-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
