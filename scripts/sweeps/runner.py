"""A local sweep's trials, each a real fit in its own process: the values Optuna draws, the fit's command, its end
(finished, pruned, failed, timed out, stopped with the sweep), and the one line printed for it. scripts.sweep runs
one Runner per process over a study that several processes may share.

    python -m scripts.sweep configs/sweeps/penguins.yaml --n_jobs 2
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from scripts.sweeps.records import child_run, log_values, mark
from scripts.sweeps.space import Param, Sweep, cli_value, option_args

HOST, PID = "sweep.host", "sweep.pid"  # trial user attributes: the process that runs it, for finding killed ones
RUN_ID = "mlflow_run_id"  # trial user attribute: its MLflow child run (kept by a trial run again)
INTERRUPTED = "interrupted"  # trial user attribute: stopped by a signal to the sweep, to be run again
FAILED = "fail_reason"  # trial user attribute: why it failed
OBJECTIVE = "objective"  # trial user attribute: a pruned trial's objective, its best epoch's value


class TrialFailed(Exception):
    """The trial's fit failed (exit status, NaN, no objective): the study records it FAIL and goes on."""


def short_names(params: tuple[Param, ...]) -> dict[str, str]:
    """Each option's last part (lr, batch_size) where that is unique, for the one-line trial reports."""
    last = [param.option.rsplit(".", 1)[-1] for param in params]
    return {p.option: (name if last.count(name) == 1 else p.option) for p, name in zip(params, last)}


def suggest(trial, params: tuple[Param, ...], grid: bool):
    """The trial's value of every option, drawn by the study's sampler."""
    values = {}
    for param in params:
        if grid or param.kind == "choice":
            values[param.option] = trial.suggest_categorical(param.option, param.grid_values() or list(param.args))
        elif param.kind == "int":
            low, high, step = param.args
            values[param.option] = trial.suggest_int(param.option, low, high, step=step)
        else:
            low, high = param.args[:2]
            step = param.args[2] if param.kind == "quniform" else None
            values[param.option] = trial.suggest_float(
                param.option, low, high, log=param.kind == "loguniform", step=step
            )
    return values


@dataclass
class Runner:
    """Runs the trials of one study in this process; several Runners (processes, machines) may share a study."""

    sweep: Sweep
    study: object  # optuna.Study
    storage: object  # its optuna RDBStorage
    storage_url: str
    folder: Path  # outputs/sweeps/<study>
    outputs: Path
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    interrupted: threading.Event = field(default_factory=threading.Event)
    children: dict = field(default_factory=dict)  # trial number -> its fit's process
    lock: threading.Lock = field(default_factory=threading.Lock)

    @functools.cached_property
    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.tracking_uri)

    def objective(self, trial) -> float:
        import optuna

        from scripts.sweeps.trial import PRUNED_AT, TRIAL_ID

        values = suggest(trial, self.sweep.params, self.sweep.algorithm == "grid")
        trial_id = self.trial_id(trial)
        frozen = self.storage.get_trial(trial_id)
        original = frozen.system_attrs.get("failed_trial", trial.number)  # a trial run again keeps its first's folder
        folder = self.folder / f"trial-{original}"
        if original == trial.number and folder.exists():  # left by a study of this name that was deleted
            import shutil

            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        run_id = child_run(
            self.client, self.experiment_id, self.parent_run_id, self.study.study_name, original,
            trial.user_attrs.get(RUN_ID),
        )  # fmt: skip
        attributes = {HOST: socket.gethostname(), PID: os.getpid(), RUN_ID: run_id, INTERRUPTED: False, FAILED: ""}
        attributes[PRUNED_AT] = None
        for key, value in attributes.items():  # a trial run again inherits its first's: these are its own
            trial.set_user_attr(key, value)
        log_values(self.client, run_id, values)
        seed = self.sweep.seed + original
        callback = {
            "class_path": "scripts.sweeps.trial.SweepTrial",
            "init_args": {
                "storage": self.storage_url, "study_name": self.study.study_name, "sweep_file": self.sweep.path,
                "metric": self.sweep.metric,
            },
        }  # fmt: skip
        command = [
            sys.executable, "-m", "scripts.train", "fit",
            *(item for config in self.sweep.configs for item in ("--config", config)),
            # The sweep's defaults, which the file's fixed options may change (as they do in an Azure ML trial).
            "--test_after_fit", "false", "--trainer.default_root_dir", str(self.outputs),
            *option_args({**self.sweep.fixed, **values}),
            "--seed_everything", str(seed), "--checkpoint_dir", str(folder / "checkpoints"),
            "--trainer.callbacks+", json.dumps(callback),
        ]  # fmt: skip
        env = {**os.environ, "MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_RUN_ID": run_id, TRIAL_ID: str(trial_id)}
        started = time.monotonic()
        log = folder / "trial.log"
        with open(log, "a") as file:
            file.write(f"$ {' '.join(command)}\n")
            file.flush()  # before the fit's own lines
            # A session of its own: a Ctrl-C in the terminal reaches the sweep alone, which stops its trials itself.
            child = subprocess.Popen(command, stdout=file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        with self.lock:
            self.children[trial.number] = child
        try:
            returncode = child.wait(timeout=self.sweep.trial_time_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            stop(child)
            returncode, timed_out = child.returncode, True
        finally:
            with self.lock:
                self.children.pop(trial.number, None)
        seconds = time.monotonic() - started
        trial.set_user_attr("seconds", round(seconds, 1))
        if self.interrupted.is_set() and returncode != 0:
            trial.set_user_attr(INTERRUPTED, True)
            self.fail(trial, run_id, "stopped with the sweep; the same command runs it again", status="KILLED")
        if timed_out:
            limit = self.sweep.trial_time_s
            self.fail(trial, run_id, f"ran past budget.trial_time ({limit} s); see {folder}/trial.log")
        if returncode < 0:
            name = signal.Signals(-returncode).name
            self.fail(trial, run_id, f"the fit died of {name} (exit {returncode}); see {log}")
        if returncode != 0:
            self.fail(trial, run_id, f"{last_line(log)} (exit {returncode}; {log})")
        history = self.client.get_metric_history(run_id, self.sweep.metric)
        values_logged = [metric.value for metric in history]
        if not values_logged:
            self.fail(trial, run_id, f"the fit logged no {self.sweep.metric}; see {folder}/trial.log")
        best = max(values_logged) if self.sweep.goal == "maximize" else min(values_logged)
        pruned_at = self.storage.get_trial(trial_id).user_attrs.get(PRUNED_AT)
        self.client.set_tag(run_id, "sweep.objective", str(best))
        if pruned_at is not None:
            # Optuna records a pruned trial's last reported value; its line shows the objective MLflow has, the best.
            trial.set_user_attr(OBJECTIVE, best)
            mark(self.client, run_id, "PRUNED")
            raise optuna.TrialPruned(f"at epoch {pruned_at}")
        mark(self.client, run_id, "COMPLETE")
        return best

    def trial_id(self, trial) -> int:
        """The trial's id in the storage (what a trial's fit reports to)."""
        study_id = self.storage.get_study_id_from_name(self.study.study_name)
        return self.storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)

    def fail(self, trial, run_id: str, reason: str, status: str = "FAILED"):
        trial.set_user_attr(FAILED, reason)
        mark(self.client, run_id, "FAIL", status)
        raise TrialFailed(reason)

    def interrupt(self, signum, frame) -> None:
        """SIGINT or SIGTERM: stop the running fits (their last checkpoint stays), start no new trial."""
        if self.interrupted.is_set():
            return
        self.interrupted.set()
        print(f"stopping ({signal.Signals(signum).name}): the same command resumes this sweep", flush=True)
        with self.lock:
            for child in self.children.values():
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGTERM)

    def after_trial(self, study, trial) -> None:
        """The trial's one line; stops the study when its budget is spent or the sweep was interrupted."""
        print(trial_line(trial, self.sweep, short_names(self.sweep.params)), flush=True)
        if self.interrupted.is_set() or trials_counted(study) >= (self.sweep.trials or float("inf")):
            study.stop()

    def end_killed_trials(self) -> None:
        """Trials left RUNNING by a process of this host that is gone (SIGKILL, a crash) fail and queue again."""
        import optuna

        from scripts.training.tracking import process_alive

        host = socket.gethostname()
        study_id = self.storage.get_study_id_from_name(self.study.study_name)
        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            pid = trial.user_attrs.get(PID)
            if trial.user_attrs.get(HOST) == host and isinstance(pid, int) and not process_alive(pid):
                trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    if self.storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL):
                        run_again(self.study, self.storage.get_trial(trial_id))

    def run_interrupted_again(self, numbers: set[int]) -> None:
        for trial in self.study.get_trials(deepcopy=False):
            if trial.number in numbers and trial.user_attrs.get(INTERRUPTED) and not superseded(self.study, trial):
                run_again(self.study, trial)


def stop(child: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM, then SIGKILL what is left after `grace_s`."""
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def run_again(study, trial) -> None:
    """Queues a copy of a stopped trial (same values, same MLflow run and checkpoint folder, its epochs reported so
    far): Optuna's retry of a trial whose process died."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback(inherit_intermediate_values=True)(study, trial)


def superseded(study, trial) -> bool:
    trials = study.get_trials(deepcopy=False)
    return any(trial.number in other.system_attrs.get("retry_history", ()) for other in trials)


def trials_counted(study) -> int:
    """Trials that count against the budget: those started, less the stopped ones queued again (their copy counts
    once it starts)."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    again = {number for trial in trials for number in trial.system_attrs.get("retry_history", ())}
    waiting = optuna.trial.TrialState.WAITING
    return sum(1 for trial in trials if trial.number not in again and trial.state != waiting)


def last_line(log: Path) -> str:
    """The last line of a failed fit's log that says something (its error)."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def trial_line(trial, sweep: Sweep, names: dict[str, str]) -> str:
    values = " ".join(f"{names[o]}={format_value(v)}" for o, v in trial.params.items() if o in names)
    state = trial.state.name
    value = trial.user_attrs.get(OBJECTIVE, trial.value) if state == "PRUNED" else trial.value
    objective = f"{sweep.metric} {value:.4f}" if value is not None else f"{sweep.metric} -"
    seconds = trial.user_attrs.get("seconds")
    line = f"trial {trial.number:>3}  {values}  {objective}  {state}"
    if state == "PRUNED":
        line += f" at epoch {trial.user_attrs.get('pruned_at_epoch')}"
    if seconds is not None:
        line += f"  {seconds:.0f} s"
    if state == "FAIL" and trial.user_attrs.get(FAILED):
        line += f"  ({trial.user_attrs[FAILED]})"
    return line


def format_value(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else cli_value(value)
