"""scripts.sweeps.reports: the sweep process stores what a trial's fit appends to its reports file, into a real
sqlite study, as Optuna's Trial.report would."""

from __future__ import annotations

import json
import time
from pathlib import Path

import optuna
import pytest

from scripts.sweeps.reports import ReportWriter


@pytest.fixture
def running(tmp_path):
    """A study in a sqlite file, its storage and a RUNNING trial's id."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(study_name="reports", storage=storage)
    assert study.ask().number == 0
    return study, storage, storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name("reports"), 0)


def append(path: Path, text: str) -> None:
    with open(path, "a") as file:
        file.write(text)


def line(step: int, value: float) -> str:
    return json.dumps({"step": step, "value": value}) + "\n"


def stored(storage, trial_id: int) -> dict[int, float]:
    return storage.get_trial(trial_id).intermediate_values


def test_reports_are_stored_while_the_fit_runs_and_the_rest_at_its_end(running, tmp_path):
    _, storage, trial_id = running
    path = tmp_path / "reports.jsonl"
    writer = ReportWriter(storage, trial_id, path)
    writer.start()
    time.sleep(0.3)  # no file yet: nothing to store, no error
    append(path, line(0, 0.9) + line(1, 0.7) + '{"step": 2, "va')  # a line being written
    deadline = time.monotonic() + 10
    while stored(storage, trial_id) != {0: 0.9, 1: 0.7}:
        assert time.monotonic() < deadline, stored(storage, trial_id)
        time.sleep(0.05)
    append(path, 'lue": 0.5}\n' + line(3, 0.4))
    assert writer.finish() is None
    assert stored(storage, trial_id) == {0: 0.9, 1: 0.7, 2: 0.5, 3: 0.4}
    assert not path.exists()


def test_an_epoch_reported_twice_keeps_its_first_value_as_optuna_does(running, tmp_path):
    _, storage, trial_id = running
    storage.set_trial_intermediate_value(trial_id, 0, 0.9)  # inherited by a trial run again
    path = tmp_path / "reports.jsonl"
    append(path, line(0, 0.1) + line(1, 0.7) + line(1, 0.2))  # a resumed fit sends its checkpoint's reports again
    assert ReportWriter(storage, trial_id, path).finish() is None  # never started: a killed sweep's leftovers
    assert stored(storage, trial_id) == {0: 0.9, 1: 0.7}


def test_a_report_the_storage_refuses_is_an_error_and_the_file_stays(running, tmp_path):
    _, storage, trial_id = running
    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)  # finished meanwhile
    path = tmp_path / "reports.jsonl"
    append(path, line(0, 0.9))
    error = ReportWriter(storage, trial_id, path).finish()
    assert error is not None and "UpdateFinishedTrialError" in error
    assert path.read_text() == line(0, 0.9)
