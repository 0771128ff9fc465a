"""A hyperparameter sweep on this machine: an Optuna study over a sweep file's search space, every trial a real fit.

    python -m scripts.sweep configs/sweeps/penguins.yaml            # or: make sweep TASK=penguins
    python -m scripts.sweep configs/sweeps/penguins.yaml --n_jobs 2 # two trials at once
    MLFLOW_TRACKING_URI=http://host:5000 python -m scripts.sweep configs/sweeps/mnist.yaml

Every trial is `python -m scripts.train fit` in its own process, so a crash ends that trial alone; the study lives in
outputs/sweeps/optuna.db, so the same command resumes it (docs/sweeps.md). Every mistake in the sweep file is one
line and exit 1 before any trial starts.
"""

from __future__ import annotations

import signal
import sys
import warnings
from pathlib import Path

from scripts.sweeps.preflight import check_metric, check_options
from scripts.sweeps.records import parent_run, tag_best, tracking_store
from scripts.sweeps.runner import RUN_ID, Runner, TrialFailed, format_value, short_names, trials_counted
from scripts.sweeps.space import Sweep, SweepError, load_sweep
from scripts.sweeps.study import PARENT_RUN_ID, connect, open_study, still_running, write_best
from scripts.training.machine import usable_cores
from scripts.training.tracking_server import experiment_id

SWEEPS = "sweeps"  # outputs/sweeps: the study database and a folder per study


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
    cores = usable_cores()
    if not 1 <= n_jobs <= cores:  # each trial is a fit in a process of its own
        raise SweepError(f"--n_jobs {n_jobs}: give 1 to {cores} trials at once (this machine's cores)")
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
    return run_study(spec, sweep_file, study_name, storage, n_jobs, outputs)


def run_study(
    spec: Sweep, sweep_file: str, study_name: str | None, storage: str | None, n_jobs: int, outputs: str
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

    tracking_uri, artifact_location = tracking_store(outputs_path)
    # The experiment the trials' configs name (their logger's, as the training CLI resolved it).
    named = str(first_config.get("trainer.logger.init_args.experiment_name") or "lightning-template")
    experiment = experiment_id(MlflowClient(tracking_uri), named, artifact_location)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our one line per trial says it
    rdb = rdb or connect(storage_url)
    study = open_study(spec, name, rdb, folder)
    runner = Runner(spec, study, rdb, storage_url, folder, outputs_path, tracking_uri, experiment, "")
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
    from scripts.training.cli_errors import run_cli

    sys.exit(run_cli(sweep, "scripts.sweep", (SweepError,), args))


if __name__ == "__main__":
    main()
