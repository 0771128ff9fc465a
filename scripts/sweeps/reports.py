"""The sweep's side of a trial's reports: stores into the study what the trial's fit appends to its reports file.

    python -m scripts.sweep configs/sweeps/penguins.yaml    # scripts.sweep runs one ReportWriter per running trial

A trial's fit (scripts.sweeps.trial.SweepTrial) appends a JSON line {"step", "value"} to the file in SWEEP_REPORTS
at every validation's end and goes on training; this thread of the sweep process, otherwise waiting for the fit,
reads the new lines every POLL_S and stores them with the study's storage, on the other core. Optuna's report is a
database transaction (with sqlite, about a penguin epoch's work: docs/measured.md): in the fit it would be on the
training's path.
When the fit has ended, `finish` stores the rest before the sweep records the trial: what a fit reported before it
ended, however it ended (SIGKILL included), is in the study. A sweep process killed during a fit leaves the file;
the next start stores it before it queues the trial again. As optuna.trial.Trial.report does, the first value of an
epoch stays (a resumed fit sends its checkpoint's reports again).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

POLL_S = 0.2


class ReportWriter(threading.Thread):
    """Stores the reports that a trial's fit appends to `path` into trial `trial_id` of `storage` (an Optuna
    storage), until `finish`. A report the storage refuses ends the writing; `error` says why."""

    def __init__(self, storage, trial_id: int, path: Path) -> None:
        super().__init__(name=f"sweep-reports-{trial_id}", daemon=True)
        self.storage, self.trial_id, self.path = storage, trial_id, path
        self.offset = 0  # bytes of the file stored so far (whole lines)
        self.stored: set[int] | None = None  # the trial's epochs in the storage
        self.error: str | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(POLL_S):
            self.store_new()
        self.store_new()

    def finish(self) -> str | None:
        """Stores what is left (the fit has ended) and removes the file; returns the error that stopped the writing,
        if any (the file stays then). Also for a writer never started: a fit whose sweep process was killed first."""
        self.done.set()
        if self.ident is None:
            self.store_new()
        else:
            self.join()
        if self.error is None:
            self.path.unlink(missing_ok=True)
        return self.error

    def store_new(self) -> None:
        if self.error is not None:
            return
        try:
            with open(self.path, "rb") as reports:
                reports.seek(self.offset)
                data = reports.read()
        except FileNotFoundError:  # nothing reported yet
            return
        whole = data[: data.rfind(b"\n") + 1]  # a line being written is read at the next poll
        try:
            for line in whole.splitlines():
                report = json.loads(line)
                if self.stored is None:
                    self.stored = set(self.storage.get_trial(self.trial_id).intermediate_values)
                step = int(report["step"])
                if step not in self.stored:
                    self.storage.set_trial_intermediate_value(self.trial_id, step, float(report["value"]))
                    self.stored.add(step)
        except Exception as error:  # a finished trial, a database gone: the sweep fails the trial with it
            self.error = f"{type(error).__name__}: {error}"
        self.offset += len(whole)
