"""scripts.sweep: real Optuna studies over real penguin fits (a few epochs each), run as a user runs them, in
processes of their own; the study, the trials and the MLflow runs read back afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from tests import warm_launcher
from tests.conftest import REPO, run_module

pytestmark = pytest.mark.slow  # every test here trains
PENGUINS = "configs/penguins.yaml"
LR = "model.optimizer.init_args.lr"


def sweep_file(folder: Path, name: str = "penguins-test", **sections) -> Path:
    """A sweep of SGD on standardised penguins (a few epochs a trial), sections as given."""
    data = {
        "config": PENGUINS,
        "objective": {"metric": "val_loss", "goal": "minimize"},
        "sampling": {"algorithm": "random", "seed": 7},
        "budget": {"trials": 3},
        "fixed": {
            "trainer.max_epochs": 4,
            "model.optimizer.class_path": "torch.optim.SGD",
            "data.init_args.preprocessing": "standardize",
        },
        "search_space": {LR: {"loguniform": [0.05, 0.5]}},
    } | sections
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def clean_env() -> dict:
    return {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}


def run_sweep(path: Path, outputs: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_module("scripts.sweep", str(path), "--outputs", str(outputs), *args, env=env or clean_env())


def started_sweep(path: Path, outputs: Path) -> warm_launcher.Command:
    """The sweep's process, forked from the tests' warm launcher; returns at once (its pid, signals, communicate)."""
    return warm_launcher.start("scripts.sweep", [str(path), "--outputs", str(outputs)], REPO, clean_env())


def load(outputs: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{outputs}/sweeps/optuna.db")


def test_a_sweep_prunes_a_slow_learner_fails_a_diverging_one_writes_a_config_that_trains_and_resumes(tmp_path):
    # Grid order (seed 5): 0.5 finishes; 1e-6 learns nothing and is pruned after epoch 1 against the median of the
    # finished trial; 1e6 diverges to NaN and fails; the study goes on to the end.
    path = sweep_file(
        tmp_path,
        sampling={"algorithm": "grid", "seed": 5},
        budget={"trials": 3},
        early_termination={"policy": "median", "delay_evaluation": 1, "evaluation_interval": 1, "startup_trials": 1},
        search_space={LR: {"choice": [0.5, 1.0e-6, 1.0e6]}},
    )
    outputs = tmp_path / "outputs"
    result = run_sweep(path, outputs)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("trial ")]
    assert len(lines) == 3, result.stdout  # one line per finished trial
    study = load(outputs, "penguins-test")
    state = {trial.params[LR]: trial.state.name for trial in study.trials}
    assert state[1e-6] == "PRUNED" and state[1e6] == "FAIL", result.stdout
    assert state[0.5] == "COMPLETE", result.stdout
    (failed,) = [line for line in lines if "FAIL" in line]
    assert "TrialDiverged" in failed and "nan" in failed.lower(), failed
    pruned = study.trials[[t.params[LR] for t in study.trials].index(1e-6)]
    assert len(pruned.intermediate_values) < 4  # stopped before its 4 epochs

    # The best values, and a config that trains them.
    best = study.best_trial
    config = outputs / "sweeps" / "penguins-test" / "best.yaml"
    assert f"best config: {config}" in result.stdout
    written = yaml.safe_load(config.read_text())
    assert written["model"]["optimizer"]["init_args"]["lr"] == best.params[LR]
    assert written["seed_everything"] == 5 + best.number  # the sweep's seed plus the trial number
    trained = run_module(
        "scripts.train", "fit", "--config", PENGUINS, "--config", str(config),
        "--trainer.default_root_dir", str(tmp_path / "again"), env=clean_env(),
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "test_acc" in trained.stdout

    # MLflow: one parent run, one child per trial, with its values, its epochs and its state; the best tagged.
    client = MlflowClient(f"sqlite:///{outputs}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "penguins"]
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    children = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 3 and parent.info.status == "FINISHED"
    for trial in study.trials:
        (run,) = [run for run in children if run.info.run_id == trial.user_attrs["mlflow_run_id"]]
        assert float(run.data.params[LR]) == trial.params[LR]
        assert run.data.tags["sweep.state"] == trial.state.name
        assert run.info.status == ("FAILED" if trial.state.name == "FAIL" else "FINISHED")
        epochs = [metric.step for metric in client.get_metric_history(run.info.run_id, "val_loss")]
        assert epochs == list(range(len(epochs))) and epochs
        if trial.state.name == "COMPLETE":
            assert len(epochs) == 4 and float(run.data.tags["sweep.objective"]) == trial.value
    assert [run.data.tags.get("sweep.best") for run in children].count("true") == 1
    assert parent.data.tags["sweep.best_run_id"] == best.user_attrs["mlflow_run_id"]
    assert parent.data.metrics["best_val_loss"] == pytest.approx(best.value)

    # A study of the same name in another database leaves this folder's trials alone; the same database, however its
    # URL spells it, is the folder's: its study resumes (its budget is spent).
    folder = outputs / "sweeps" / "penguins-test"
    kept = {file: file.read_bytes() for file in [*folder.glob("trial-*/checkpoints/*.ckpt"), config]}
    other = f"sqlite:///{tmp_path / 'other.db'}"
    refused = run_sweep(path, outputs, "--storage", other)
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"error: {path}: {folder} holds the trials of study penguins-test of another database than {other}; give "
        "--study_name NEW (or --outputs another folder) to keep them"
    ), refused.stderr[-3000:]
    assert {file: file.read_bytes() for file in kept} == kept and len(kept) > 1
    same = run_sweep(path, outputs, "--storage", f"sqlite:///{os.path.relpath(outputs, REPO)}/sweeps/optuna.db")
    assert same.returncode == 0 and f"best trial {best.number}" in same.stdout, same.stderr[-3000:]


def wait_for(condition, process: warm_launcher.Command, timeout_s: float = 300) -> None:
    """Until `condition()` holds while the sweep `process` runs; a sweep that ends first fails with its output."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the sweep ended (exit {process.returncode}) first:\n{out[-2000:]}\n{err[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.5)


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def wait_until_gone(pid: int, timeout_s: float = 300) -> None:
    """Until process `pid` has ended (gone, or a zombie nobody reaps)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except OSError:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} still runs")
        time.sleep(0.5)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL])
def test_the_same_command_resumes_a_stopped_sweep_and_runs_the_stopped_trial_again_from_its_checkpoint(
    tmp_path, stop_signal
):
    path = sweep_file(tmp_path, budget={"trials": 2}, fixed={"trainer.max_epochs": 40})
    outputs = tmp_path / "outputs"
    driver = started_sweep(path, outputs)
    last = outputs / "sweeps" / "penguins-test" / "trial-0" / "checkpoints" / "last.ckpt"
    wait_for(last.is_file, driver)  # trial 0 has trained an epoch
    (fit,) = children_of(driver.pid)
    driver.send_signal(stop_signal)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == (143 if stop_signal == signal.SIGTERM else -9), out
    if stop_signal == signal.SIGTERM:
        assert f"resume with: python -m scripts.sweep {path}" in out
    else:  # nobody told the fit: it sees its sweep gone and stops by itself, not training on for nobody
        wait_until_gone(fit)
        log = last.parent.parent / "trial.log"
        assert f"the sweep process {driver.pid} is gone: this trial stops" in log.read_text()
    stopped, *queued = load(outputs, "penguins-test").trials
    # SIGTERM: the sweep stopped the trial's fit and queued it again itself; SIGKILL: it stays RUNNING until the next
    # start on this host finds its process gone.
    expected = ["FAIL", "WAITING"] if stop_signal == signal.SIGTERM else ["RUNNING"]
    assert [trial.state.name for trial in [stopped, *queued]] == expected
    run_id = stopped.user_attrs["mlflow_run_id"]

    result = run_sweep(path, outputs)  # the same command
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load(outputs, "penguins-test")
    states = [trial.state.name for trial in study.trials]
    assert states == ["FAIL", "COMPLETE", "COMPLETE"], result.stdout  # 0 stopped, 1 its copy, 2 a new one
    again = study.trials[1]
    assert again.system_attrs["failed_trial"] == 0 and again.params == stopped.params
    # Every epoch's report in the study, whether made before the stop or after resuming from the checkpoint (early
    # stopping may end the trial before its 40 epochs).
    epochs = sorted(again.intermediate_values)
    assert epochs == list(range(len(epochs))) and len(epochs) > 2, epochs
    assert again.user_attrs["mlflow_run_id"] == run_id  # the same MLflow run goes on
    log = (outputs / "sweeps" / "penguins-test" / "trial-0" / "trial.log").read_text()
    assert "resuming from" in log  # from trial 0's last.ckpt
    client = MlflowClient(f"sqlite:///{outputs}/mlflow.db")
    steps = [metric.step for metric in client.get_metric_history(run_id, "val_loss")]
    assert sorted(set(steps)) == epochs  # every epoch once in the run, none lost
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len([line for line in result.stdout.splitlines() if line.startswith("trial ")]) == 2


def test_trials_log_to_an_mlflow_server_under_the_sweeps_parent_run_and_take_the_files_fixed_options(
    tmp_path, azure_tracking
):
    # The sweep's trials skip the test and keep Lightning's files in --outputs; a file's fixed options change that,
    # as they do in an Azure ML trial.
    root = tmp_path / "lightning"
    fixed = {"trainer.max_epochs": 2, "test_after_fit": True, "trainer.default_root_dir": str(root)}
    path = sweep_file(tmp_path, name="server-test", budget={"trials": 1}, fixed=fixed)
    outputs = tmp_path / "outputs"
    result = run_sweep(path, outputs, env={**clean_env(), "MLFLOW_TRACKING_URI": azure_tracking.url})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    client = MlflowClient(azure_tracking.url)
    experiment = client.get_experiment_by_name("penguins")
    runs = client.search_runs([experiment.experiment_id], "tags.`sweep.study` = 'server-test'")
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    (child,) = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert child.data.tags["sweep.state"] == "COMPLETE"
    assert len(client.get_metric_history(child.info.run_id, "val_loss")) == 2
    assert child.data.params["trainer.max_epochs"] == "2"  # the fit's whole config, logged in the child run
    assert "test_acc" in child.data.metrics, sorted(child.data.metrics)
    assert root.is_dir()
    assert not (outputs / "mlflow.db").exists()  # nothing went to the local store


def test_a_trial_past_its_time_fails_and_a_sweep_without_a_finished_trial_says_so(tmp_path):
    # 1,000 epochs that early stopping cannot cut short (min_epochs): ~20 s, however fast a trial starts.
    fixed = {"trainer.max_epochs": 1000, "trainer.min_epochs": 1000, "model.optimizer.class_path": "torch.optim.SGD"}
    path = sweep_file(tmp_path, budget={"trials": 1, "trial_time": 1}, fixed=fixed)
    outputs = tmp_path / "outputs"
    result = run_sweep(path, outputs)
    assert result.returncode == 1
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("trial ")]
    assert "FAIL" in line and "ran past budget.trial_time (1 s)" in line, line
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: study penguins-test: no trial completed (1 fail); see ")
    ), result.stderr
    (trial,) = load(outputs, "penguins-test").trials
    run = MlflowClient(f"sqlite:///{outputs}/mlflow.db").get_run(trial.user_attrs["mlflow_run_id"])
    assert (run.info.status, run.data.tags["sweep.state"]) == ("FAILED", "FAIL")


def scripted(folder: Path, **init_args) -> str:
    """A config that adds tests.sweeps.sweep_callbacks.Scripted (val_score by seed, trials held until a file exists)."""
    path = folder / "scripted.yaml"
    callback = {"class_path": "tests.sweeps.sweep_callbacks.Scripted", "init_args": init_args}
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": [callback]}}))
    return str(path)


def test_a_pruned_trials_line_shows_the_objective_mlflow_has_its_best_epochs_value(tmp_path):
    # Trial 0 (seed 7) finishes; trial 1 (seed 8) scores 0.3 then 0.9: at epoch 1 its best, 0.3, is worse than trial
    # 0's 0.1 there, so it is pruned with 0.9 as its last value and 0.3 as its objective.
    scores = {"7": [0.5, 0.1, 0.05, 0.01], "8": [0.3, 0.9, 0.9, 0.9]}
    path = sweep_file(
        tmp_path,
        config=[PENGUINS, scripted(tmp_path, scores=scores)],
        objective={"metric": "val_score", "goal": "minimize"},
        budget={"trials": 2},
        early_termination={"policy": "median", "delay_evaluation": 0, "evaluation_interval": 1, "startup_trials": 1},
    )
    outputs = tmp_path / "outputs"
    result = run_sweep(path, outputs)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    pruned_line = [line for line in result.stdout.splitlines() if line.startswith("trial   1")][0]
    assert "val_score 0.3000  PRUNED at epoch 1" in pruned_line, pruned_line
    trial = load(outputs, "penguins-test").trials[1]
    run = MlflowClient(f"sqlite:///{outputs}/mlflow.db").get_run(trial.user_attrs["mlflow_run_id"])
    assert float(run.data.tags["sweep.objective"]) == pytest.approx(0.3)
    assert run.data.tags["sweep.state"] == "PRUNED"


def test_two_processes_share_a_study_and_the_first_to_end_writes_best_yaml_from_the_finished_trials(tmp_path):
    # Each trial holds at its first epoch until the test lets it go: the first process starts trial 0, the second
    # trial 1; trial 0 goes on and ends, so the first process ends (budget spent) while trial 1 still runs.
    holds = {"7": str(tmp_path / "go-0"), "8": str(tmp_path / "go-1")}
    path = sweep_file(
        tmp_path, config=[PENGUINS, scripted(tmp_path, wait_for=holds)], budget={"trials": 2},
        fixed={"trainer.max_epochs": 2},
    )  # fmt: skip
    outputs = tmp_path / "outputs"

    def start() -> warm_launcher.Command:
        return started_sweep(path, outputs)

    def running(number: int) -> bool:
        try:
            trials = load(outputs, "penguins-test").trials
        except Exception:  # no study yet
            return False
        if len(trials) > number and trials[number].state.is_finished():  # it cannot have run to its hold
            raise AssertionError(f"trial {number} ended {trials[number].state.name}: {trials[number].user_attrs}")
        return len(trials) > number and trials[number].state.name == "RUNNING"

    first = start()
    wait_for(lambda: running(0), first)
    second = start()
    wait_for(lambda: running(1), second)
    Path(holds["7"]).touch()
    first_out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, first_out
    best = outputs / "sweeps" / "penguins-test" / "best.yaml"
    pid = load(outputs, "penguins-test").trials[1].user_attrs["sweep.pid"]
    assert "2 trials: 1 running, 1 complete" in first_out
    assert "best trial 0: val_loss " in first_out
    assert f"of the finished trials; still running: trial 1 (process {pid} on " in first_out
    header = best.read_text().splitlines()[:2]
    assert "the best of 1 finished trial." in header[0], header
    assert header[1].startswith(f"# Still running when this was written: trial 1 (process {pid} on "), header

    Path(holds["8"]).touch()
    second_out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, second_out
    assert "2 trials: 2 complete" in second_out and "still running" not in second_out
    text = best.read_text()
    assert "the best of 2 finished trials." in text and "Still running" not in text
    study = load(outputs, "penguins-test")
    assert f"# Best trial {study.best_trial.number} of sweep penguins-test" in text
    # Each process ran one trial, of values of its own, and printed its line alone.
    assert [trial.user_attrs["sweep.pid"] for trial in study.trials] == [first.pid, second.pid]
    assert len({trial.params[LR] for trial in study.trials}) == 2
    for out, number in ((first_out, "0"), (second_out, "1")):
        assert [line.split()[1] for line in out.splitlines() if line.startswith("trial ")] == [number], out
    client = MlflowClient(f"sqlite:///{outputs}/mlflow.db")
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep.best_trial"] == str(study.best_trial.number)
