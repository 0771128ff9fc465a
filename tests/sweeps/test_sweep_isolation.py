"""A local sweep's trials are processes of their own: a trial that dies of a signal or hangs fails alone, and the study
goes on."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from tests.conftest import run_module

pytestmark = pytest.mark.slow  # a sweep trains
LR = "model.optimizer.init_args.lr"


def processes_with(marker: str) -> list[int]:
    """Pids of the live processes whose environment holds `marker` (this test's sweep and its trials)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_a_trial_that_dies_of_a_signal_and_one_that_hangs_fail_alone_and_the_study_goes_on(tmp_path):
    # Trial n trains with seed 7 + n: trial 0 aborts (SIGABRT), trial 1 hangs deaf to SIGTERM until the sweep kills it
    # after budget.trial_time, trial 2 trains. The objective check's short fit (seed 42) meets neither. trial_time 40 s:
    # a 2-epoch trial, its interpreter's start included, took 12 s at load 5; the deaf one costs it plus 30 s of grace.
    faults = tmp_path / "faults.yaml"
    fault = {"class_path": "tests.sweeps.sweep_callbacks.Fault", "init_args": {"abort_seed": 7, "hang_seed": 8}}
    faults.write_text(yaml.safe_dump({"trainer": {"callbacks": [fault]}}))
    path = tmp_path / "faults-test.yaml"
    path.write_text(
        yaml.safe_dump({
            "config": ["configs/penguins.yaml", str(faults)],
            "objective": {"metric": "val_loss", "goal": "minimize"},
            "sampling": {"algorithm": "random", "seed": 7},
            "budget": {"trials": 3, "trial_time": 40},
            "fixed": {"trainer.max_epochs": 2, "model.optimizer.class_path": "torch.optim.SGD"},
            "search_space": {LR: {"loguniform": [0.05, 0.5]}},
        })
    )  # fmt: skip
    outputs = tmp_path / "outputs"
    marker = f"SWEEP_ISOLATION_TEST={tmp_path}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    env["SWEEP_ISOLATION_TEST"] = str(tmp_path)
    result = run_module("scripts.sweep", str(path), "--outputs", str(outputs), env=env)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]  # the study has a best trial
    lines = [line for line in result.stdout.splitlines() if line.startswith("trial ")]
    assert len(lines) == 3, result.stdout
    assert " FAIL " in lines[0] and "the fit died of SIGABRT (exit -6)" in lines[0], lines[0]
    assert " FAIL " in lines[1] and "ran past budget.trial_time (40 s)" in lines[1], lines[1]
    assert " COMPLETE " in lines[2], lines[2]
    assert "3 trials: 1 complete, 2 fail" in result.stdout
    assert "best trial 2:" in result.stdout and (outputs / "sweeps" / "faults-test" / "best.yaml").is_file()
    assert processes_with(marker) == []  # the hung trial was killed

    study = optuna.load_study(study_name="faults-test", storage=f"sqlite:///{outputs}/sweeps/optuna.db")
    assert [trial.state.name for trial in study.trials] == ["FAIL", "FAIL", "COMPLETE"]
    client = MlflowClient(f"sqlite:///{outputs}/mlflow.db")
    runs = [client.get_run(trial.user_attrs["mlflow_run_id"]) for trial in study.trials]
    assert [(run.info.status, run.data.tags["sweep.state"]) for run in runs] == [
        ("FAILED", "FAIL"), ("FAILED", "FAIL"), ("FINISHED", "COMPLETE"),
    ]  # fmt: skip
    parent = {run.data.tags["mlflow.parentRunId"] for run in runs}
    assert len(parent) == 1 and client.get_run(parent.pop()).info.status == "FINISHED"
