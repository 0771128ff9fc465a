"""A hyperparameter sweep on this machine: an Optuna study over a sweep file's search space, every trial a real fit.

    python -m scripts.sweep configs/sweeps/penguins.yaml            # or: make sweep TASK=penguins
    python -m scripts.sweep configs/sweeps/penguins.yaml --n_jobs 2 # two trials at once
    MLFLOW_TRACKING_URI=http://host:5000 python -m scripts.sweep configs/sweeps/mnist.yaml

Every trial is `python -m scripts.train fit --config <task> <fixed options> <the trial's values> --seed_everything
<sweep seed + trial number>` in its own process, so a crash, a NaN or an out-of-memory ends that trial alone; the
data split (the datamodule's own seed) is the same for all. scripts.sweeps.trial's callback in the fit reports the
objective every epoch and stops the trial when the pruner says so. The study lives in outputs/sweeps/optuna.db
(sqlite; --storage names a database server instead): the same command resumes a stopped sweep, a trial it stopped
runs again from its last checkpoint in the same MLflow run, and two processes started on the same study share its
trials. MLflow gets one parent run for the sweep and one child run per trial (its parameters, per-epoch metrics and
state); the best is tagged. It prints one line per finished trial, then the best values, and writes
outputs/sweeps/<study>/best.yaml, which `python -m scripts.train fit --config <task> --config <it>` trains.

Every mistake in the sweep file (an option the CLI does not have, a value it refuses, a bad distribution, a missing
objective, a metric the module does not log) is one line and exit 1 before any trial starts.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
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

import yaml

from scripts.sweeps.launcher import Launcher, LauncherError, available, config_modules
from scripts.sweeps.records import child_run, experiment_id, log_values, mark, parent_run, tag_best, tracking_store
from scripts.sweeps.reports import ReportWriter
from scripts.sweeps.space import (
    Param,
    Sweep,
    SweepError,
    check_metric,
    check_options,
    cli_value,
    load_sweep,
    option_args,
)

SWEEPS = "sweeps"  # outputs/sweeps: the study database and a folder per study
HOST, PID = "sweep.host", "sweep.pid"  # trial user attributes: the process that runs it, for finding killed ones
RUN_ID = "mlflow_run_id"  # trial user attribute: its MLflow child run (kept by a trial run again)
INTERRUPTED = "interrupted"  # trial user attribute: stopped by a signal to the sweep, to be run again
FAILED = "fail_reason"  # trial user attribute: why it failed
OBJECTIVE = "objective"  # trial user attribute: a pruned trial's objective, its best epoch's value
PARENT_RUN_ID, FINGERPRINT, STARTS = "mlflow_parent_run_id", "sweep_file", "starts"  # study user attributes
OWNER = "database"  # in the study's folder: the digest of the database whose study its trials are (database_of)


class TrialFailed(Exception):
    """The trial's fit failed (exit status, NaN, no objective): the study records it FAIL and goes on."""


def short_names(params: tuple[Param, ...]) -> dict[str, str]:
    """Each option's last part (lr, batch_size) where that is unique, for the one-line trial reports."""
    last = [param.option.rsplit(".", 1)[-1] for param in params]
    return {p.option: (name if last.count(name) == 1 else p.option) for p, name in zip(params, last)}


def nested(values: dict) -> dict:
    """{'model.optimizer.init_args.lr': 0.1} -> {'model': {'optimizer': {'init_args': {'lr': 0.1}}}}."""
    tree: dict = {}
    for option, value in values.items():
        *parents, leaf = option.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


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


def make_sampler(sweep: Sweep, seed: int):
    import optuna

    if sweep.algorithm == "grid":
        return optuna.samplers.GridSampler({p.option: p.grid_values() for p in sweep.params}, seed=seed)
    if sweep.algorithm == "bayesian":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


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
    launcher: Launcher | None = None  # forks the trials' fits (None: each a fresh interpreter)
    interrupted: threading.Event = field(default_factory=threading.Event)
    children: dict = field(default_factory=dict)  # trial number -> its fit's process (a launcher's Child, a Popen)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @functools.cached_property
    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.tracking_uri)

    def objective(self, trial) -> float:
        import optuna

        from scripts.sweeps.trial import PRUNED_AT, REPORTS, TRIAL_ID

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
        reports = reports_file(folder, trial_id)
        env = {**os.environ, "MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_RUN_ID": run_id}
        env.update({TRIAL_ID: str(trial_id), REPORTS: str(reports)})
        started = time.monotonic()
        log = folder / "trial.log"
        with open(log, "a") as file:
            file.write(f"$ {' '.join(command)}\n")
        try:
            child = self.start(trial.number, command, env, log)
        except LauncherError as error:
            self.fail(trial, run_id, str(error))
        writer = ReportWriter(self.storage, trial_id, reports)
        writer.start()
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
            unstored = writer.finish()
        seconds = time.monotonic() - started
        trial.set_user_attr("seconds", round(seconds, 1))
        if self.interrupted.is_set() and returncode != 0:
            trial.set_user_attr(INTERRUPTED, True)
            self.fail(trial, run_id, "stopped with the sweep; the same command runs it again", status="KILLED")
        if timed_out:
            limit = self.sweep.trial_time_s
            self.fail(trial, run_id, f"ran past budget.trial_time ({limit} s); see {folder}/trial.log")
        if returncode is None:
            self.fail(trial, run_id, f"the trial launcher died during the fit; see {log}")
        if returncode < 0:
            name = signal.Signals(-returncode).name
            self.fail(trial, run_id, f"the fit died of {name} (exit {returncode}); see {log}")
        if returncode != 0:
            self.fail(trial, run_id, f"{last_line(log)} (exit {returncode}; {log})")
        if unstored:
            self.fail(trial, run_id, f"its reports could not be stored ({unstored}); they are in {reports}")
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

    def start(self, number: int, command: list[str], env: dict[str, str], log: Path):
        """The trial's fit, forked from the warm launcher where there is one, else a fresh interpreter; appends its
        output to `log`."""
        if self.launcher is not None:
            return self.launcher.start(number, "scripts.train", command[3:], env, log)
        with open(log, "a") as file:
            return subprocess.Popen(command, stdout=file, stderr=subprocess.STDOUT, env=env, start_new_session=True)

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
                original = trial.system_attrs.get("failed_trial", trial.number)
                ReportWriter(self.storage, trial_id, reports_file(self.folder / f"trial-{original}", trial_id)).finish()
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    if self.storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL):
                        run_again(self.study, self.storage.get_trial(trial_id))

    def run_interrupted_again(self, numbers: set[int]) -> None:
        for trial in self.study.get_trials(deepcopy=False):
            if trial.number in numbers and trial.user_attrs.get(INTERRUPTED) and not superseded(self.study, trial):
                run_again(self.study, trial)


def parsed_ahead(sweep: Sweep) -> list[str]:
    """A trial's command with each option's first value, for the launcher to parse before it forks the trials."""
    first = {param.option: param.representatives()[0] for param in sweep.params}
    callback = {"class_path": "scripts.sweeps.trial.SweepTrial", "init_args": {
        "storage": "sqlite://", "study_name": sweep.name, "sweep_file": sweep.path, "metric": sweep.metric,
    }}  # fmt: skip
    configs = (item for config in sweep.configs for item in ("--config", config))
    return ["fit", *configs, *option_args({**sweep.fixed, **first}), "--trainer.callbacks+", json.dumps(callback)]


def reports_file(folder: Path, trial_id: int) -> Path:
    """Where a trial's fit appends its reports (scripts.sweeps.reports)."""
    return folder / f"reports-{trial_id}.jsonl"


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


def write_best(runner: Runner, best, finished: int, running: list) -> Path:
    """best.yaml: the best finished trial's values, the fixed options and its seed, as a config to add after the
    task's; its header says which trials of the study were still running (in other processes) when it was written."""
    sweep = runner.sweep
    original = best.system_attrs.get("failed_trial", best.number)
    values = {"seed_everything": sweep.seed + original, **sweep.fixed, **best.params}
    configs = " ".join(f"--config {config}" for config in sweep.configs)
    path = runner.folder / "best.yaml"
    header = (
        f"# Best trial {best.number} of sweep {runner.study.study_name} ({sweep.path}): {sweep.metric} "
        f"{best.value:.4f} ({sweep.goal}), the best of {finished} finished trial{'s' * (finished != 1)}.\n"
    )
    if running:
        header += f"# Still running when this was written: {still_running(running)}; the last sweep process to end "
        header += "writes this file again.\n"
    header += f"#   python -m scripts.train fit {configs} --config {path}\n"
    path.write_text(header + yaml.safe_dump(nested(values), sort_keys=False))
    return path


def still_running(running: list) -> str:
    """'trial 3 (process 123 on host-a)' for each trial still running in another process, by commas."""
    return ", ".join(f"trial {t.number} (process {t.user_attrs.get(PID)} on {t.user_attrs.get(HOST)})" for t in running)


def connect(storage_url: str):
    """The study database (with the sweep processes' heartbeat), or one line saying why it cannot be opened."""
    from scripts.sweeps.trial import open_storage

    try:
        return open_storage(storage_url, heartbeat=True)
    except Exception as error:  # no such server, no driver for its scheme (postgresql needs psycopg2), a bad URL
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SweepError(f"--storage {storage_url}: cannot open the study's database ({first})") from None


def database_of(url: str) -> str:
    """Which database a storage URL names, as a digest (a server's URL may hold a password): a sqlite file by its
    absolute path, however the URL spells it."""
    if url.startswith("sqlite:///"):
        url = f"sqlite:///{Path(url.removeprefix('sqlite:///')).resolve()}"
    return hashlib.sha256(url.encode()).hexdigest()


def open_study(sweep: Sweep, study_name: str, storage, folder: Path):
    """Creates the study in `storage` or loads it (same config, objective and search space only), with the sweep's
    sampler, seeded anew at each start, and its pruner."""
    import optuna
    from filelock import FileLock

    from scripts.sweeps.trial import make_pruner

    with FileLock(str(folder / "study.lock")):
        # The folder's trials (their logs, checkpoints, best.yaml) are one database's study's: another database's
        # study of this name would take trial-0... for its own, deleting the others.
        owner, database = folder / OWNER, database_of(storage.url)
        if owner.is_file() and owner.read_text().strip() != database:
            raise SweepError(
                f"{sweep.path}: {folder} holds the trials of study {study_name} of another database than "
                f"{storage.url}; give --study_name NEW (or --outputs another folder) to keep them"
            )
        study = optuna.create_study(study_name=study_name, storage=storage, direction=sweep.goal, load_if_exists=True)
        fingerprint = json.loads(json.dumps(sweep.fingerprint(), sort_keys=True))  # as stored: lists, str keys
        given = study.user_attrs.get(FINGERPRINT)
        before = json.loads(given) if given is not None else None
        if before is not None:
            # A study started before config files were fingerprinted by their contents has no "contents" (nor
            # "nested", before the files they point to were).
            now = {key: value for key, value in fingerprint.items() if key in before}
            if now != before:
                raise SweepError(changed_since(sweep, study_name, storage.url, before, now))
        if before is None or before.keys() != fingerprint.keys():
            study.set_user_attr(FINGERPRINT, json.dumps(fingerprint, sort_keys=True))
        starts = study.user_attrs.get(STARTS, 0)
        study.set_user_attr(STARTS, starts + 1)
        owner.write_text(database + "\n")
    # Each start draws other values: a resumed or second process must not repeat the first's draws.
    seed = sweep.seed + 7919 * starts
    study = optuna.load_study(
        study_name=study_name, storage=storage, sampler=make_sampler(sweep, seed), pruner=make_pruner(sweep.termination)
    )
    return study


def changed_since(sweep: Sweep, study_name: str, url: str, before: dict, now: dict) -> str:
    """Why a study cannot be resumed from this file: a config file edited since it started is named (its trials
    trained on the file as it was, the next ones would train on it as it is, and best.yaml goes with the file)."""
    files = ("contents", "nested")  # digests of the configs, then of the config files they point to
    rest = [key for key in now if key not in files and now[key] != before[key]]
    edited = [path for key in files for path, digest in before.get(key, {}).items() if now[key].get(path) != digest]
    if edited and not rest:
        return (
            f"{sweep.path}: {edited[0]} changed since study {study_name} in {url} started (its trials trained on it "
            f"as it was); restore it, or give --study_name NEW for a new study"
        )
    return (
        f"{sweep.path}: study {study_name} in {url} was started with another config, objective or search space; give "
        f"--study_name NEW for a new study (or delete that study to start over)"
    )


def sweep(
    sweep_file: str,
    study_name: str | None = None,
    storage: str | None = None,
    n_jobs: int = 1,
    outputs: str = "outputs",
) -> int:
    """Runs the sweep's study on this machine until its budget is spent; returns the exit status.

    Args:
        sweep_file: the sweep file, e.g. configs/sweeps/penguins.yaml.
        study_name: the study (default: the file's name), a name, not a path: the same name resumes it, or joins it from
            another process.
        storage: the study's database URL (default: sqlite:///OUTPUTS/sweeps/optuna.db); a database server's
            (postgresql://..., mysql://...) lets processes on several machines share the study.
        n_jobs: trials run at once by this process (each a fit in its own process).
        outputs: the outputs folder (trials' runs and checkpoints, the study, best.yaml).
    """
    spec = load_sweep(sweep_file)
    if n_jobs < 1:
        raise SweepError(f"--n_jobs {n_jobs}: give 1 or more trials at once")
    if study_name is not None and (Path(study_name).name != study_name or study_name in (".", "..")):
        # It names a folder under outputs/sweeps, whose trial folders and best.yaml the study replaces.
        raise SweepError(
            f"--study_name {study_name}: a name, not a path (the study's folder is {Path(outputs) / SWEEPS}/NAME); "
            "give one such as penguins-2"
        )
    for folder in (Path(outputs), *Path(outputs).parents):  # the first that exists must be a folder
        if folder.exists():
            if not folder.is_dir():
                raise SweepError(f"--outputs {outputs}: {folder} is a file, not a folder; give a folder")
            break
    # Started first: its imports run while this process checks the file. The trial's own variables are not its own.
    env = {key: value for key, value in os.environ.items() if key not in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID")}
    launcher = Launcher(env, config_modules(list(spec.configs)), parsed_ahead(spec)) if available() else None
    try:
        return run_study(spec, sweep_file, study_name, storage, n_jobs, outputs, launcher)
    finally:
        if launcher is not None:
            launcher.close()


def run_study(
    spec: Sweep, sweep_file: str, study_name: str | None, storage: str | None, n_jobs: int, outputs: str, launcher
) -> int:
    rdb = connect(storage) if storage else None  # a server's: checked before the slower checks below
    first_config = check_options(spec)
    outputs_path = Path(outputs)
    try:
        outputs_path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SweepError(f"--outputs {outputs}: cannot write there ({error.strerror}); give a folder") from None
    check_metric(spec, outputs_path, first_config)
    name = study_name or spec.name
    folder = outputs_path / SWEEPS / name
    folder.mkdir(parents=True, exist_ok=True)
    storage_url = storage or f"sqlite:///{outputs_path / SWEEPS / 'optuna.db'}"
    from mlflow import MlflowClient

    from scripts.azure_ml.jobs import experiment_of

    tracking_uri, artifact_location = tracking_store(outputs_path)
    experiment = experiment_id(MlflowClient(tracking_uri), experiment_of(list(spec.configs)), artifact_location)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our one line per trial says it
    rdb = rdb or connect(storage_url)
    study = open_study(spec, name, rdb, folder)
    runner = Runner(spec, study, rdb, storage_url, folder, outputs_path, tracking_uri, experiment, "", launcher)
    runner.parent_run_id = parent_run(runner.client, experiment, name, spec, study.user_attrs.get(PARENT_RUN_ID))
    study.set_user_attr(PARENT_RUN_ID, runner.parent_run_id)
    runner.end_killed_trials()
    previous = {sig: signal.signal(sig, runner.interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = set(trial.number for trial in study.get_trials(deepcopy=False))
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    budget = spec.trials or float("inf")
    print(f"sweep {name}: {spec.metric} ({spec.goal}), {len(spec.params)} options, study {storage_url}", flush=True)
    try:
        if trials_counted(study) < budget:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.optimize(
                    runner.objective,
                    n_jobs=n_jobs,
                    timeout=spec.time_s,
                    catch=(TrialFailed,),
                    callbacks=[runner.after_trial],
                )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    ran = set(trial.number for trial in study.get_trials(deepcopy=False)) - started
    if runner.interrupted.is_set():
        runner.run_interrupted_again(ran | {t.number for t in waiting})
        runner.client.set_terminated(runner.parent_run_id, "KILLED")
        print(f"stopped; resume with: python -m scripts.sweep {sweep_file}", flush=True)
        return 128 + signal.SIGTERM
    return finish(runner)


def finish(runner: Runner) -> int:
    """The study's summary and best.yaml, from its finished trials. Under the study's lock: of two processes ending
    together, the one that ends last sees the other's trials finished and writes best.yaml last."""
    import optuna
    from filelock import FileLock

    study, spec = runner.study, runner.sweep
    with FileLock(str(runner.folder / "study.lock")):
        trials = study.get_trials(deepcopy=False)
        states = {state: sum(1 for t in trials if t.state == state) for state in optuna.trial.TrialState}
        summary = ", ".join(f"{count} {state.name.lower()}" for state, count in states.items() if count)
        complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        if not running:  # else another process goes on with the study: it ends it
            runner.client.set_terminated(runner.parent_run_id, "FINISHED")
        if not complete:
            raise SweepError(f"study {study.study_name}: no trial completed ({summary}); see {runner.folder}/trial-*/")
        pick = max if spec.goal == "maximize" else min
        best = pick(complete, key=lambda t: t.value)
        path = write_best(runner, best, len(complete), running)
        runs = [trial.user_attrs[RUN_ID] for trial in trials if trial.user_attrs.get(RUN_ID)]
        tag_best(
            runner.client, runner.parent_run_id, spec.metric, best.user_attrs[RUN_ID], best.number, best.value, runs
        )
    names = short_names(spec.params)
    values = ", ".join(f"{names[o]}={format_value(v)}" for o, v in best.params.items())
    print(f"{len(trials)} trials: {summary}")
    print(f"best trial {best.number}: {spec.metric} {best.value:.4f} with {values}")
    if running:
        print(f"  of the finished trials; still running: {still_running(running)}; the last sweep process to end "
              "writes best.yaml again")  # fmt: skip
    print(f"best config: {path}")
    print(f"  python -m scripts.train fit {' '.join(f'--config {c}' for c in spec.configs)} --config {path}")
    return 0


def main(args: list[str] | None = None) -> None:
    """A mistake in the sweep file or the command is one line on stderr and exit status 1."""
    from jsonargparse import ArgumentError, auto_cli

    from scripts.training.cli_errors import argument_error_line

    try:
        status = auto_cli(sweep, args=args, as_positional=True, exit_on_error=False)
    except ArgumentError as error:
        sys.exit(f"error: {argument_error_line(str(error))} (python -m scripts.sweep --help lists the options)")
    except SweepError as error:
        sys.exit(f"error: {error}")
    sys.exit(status)


if __name__ == "__main__":
    main()
