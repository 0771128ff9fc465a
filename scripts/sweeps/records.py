"""The MLflow records of a local sweep (scripts.sweep): the store, one parent run for the sweep, one child run per
trial (tag mlflow.parentRunId, so the MLflow UI nests it under the parent), their states and the best's tags.

    python -m scripts.sweep configs/sweeps/penguins.yaml     # then: make mlflow-ui

The store is MLFLOW_TRACKING_URI's (a server, Azure ML's tracking) or outputs/mlflow.db, as for scripts.train.
A trial's fit logs into its child run (scripts.train takes it from MLFLOW_RUN_ID): the whole config as parameters,
per-epoch metrics, checkpoints. The sweep adds the trial's values before the fit starts, and afterwards the tags
sweep.state (COMPLETE, PRUNED, FAIL), sweep.objective and, on the best, sweep.best.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from scripts.sweeps.space import Sweep, SweepError, cli_value


def tracking_store(outputs: Path) -> tuple[str, str | None]:
    """The tracking URI trials log to (MLFLOW_TRACKING_URI, checked, or outputs/mlflow.db) and the artifact location of
    an experiment created in the local store (where scripts.train puts it); a store that cannot work raises
    SweepError with the reason."""
    from scripts.training.tracking import open_sqlite_store
    from scripts.training.tracking_server import TrackingError, check_tracking_uri, credentials_out_of_uri

    try:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri:
            uri = credentials_out_of_uri(uri)
            os.environ["MLFLOW_TRACKING_URI"] = uri
            check_tracking_uri(uri, "MLFLOW_TRACKING_URI")
            return uri, None
        uri = f"sqlite:///{outputs / 'mlflow.db'}"
        open_sqlite_store(uri)
    except TrackingError as error:
        raise SweepError(str(error)) from None
    return uri, (outputs / "mlartifacts").resolve().as_uri()


def active(client, run_id: str | None) -> bool:
    """Whether `run_id` is a run of this store that is not deleted (a resumed sweep goes on in its runs)."""
    from mlflow.exceptions import MlflowException

    with contextlib.suppress(MlflowException):
        return bool(run_id) and client.get_run(run_id).info.lifecycle_stage == "active"
    return False


def parent_run(client, experiment: str, study_name: str, sweep: Sweep, run_id: str | None) -> str:
    """The sweep's run: `run_id` again (RUNNING) when the study has one, else a new one with the search space as its
    parameters and the sweep file as an artifact."""
    if active(client, run_id):
        client.update_run(run_id, status="RUNNING")
        return run_id
    tags = {"sweep.study": study_name, "sweep.file": sweep.path, "sweep.algorithm": sweep.algorithm}
    run_id = client.create_run(experiment, tags=tags, run_name=f"{study_name}-sweep").info.run_id
    params = {"objective": f"{sweep.metric} ({sweep.goal})", "budget.trials": sweep.trials, "seed": sweep.seed}
    params |= {"early_termination": sweep.termination.policy, "configs": " ".join(sweep.configs)}
    params |= {f"search_space.{p.option}": f"{p.kind} {list(p.args)}" for p in sweep.params}
    for key, value in params.items():
        client.log_param(run_id, key, str(value))
    client.log_artifact(run_id, sweep.path)
    return run_id


def child_run(client, experiment: str, parent: str, study_name: str, number: int, run_id: str | None) -> str:
    """Trial `number`'s run under the parent: `run_id` again (RUNNING) for a trial run again, else a new one."""
    if active(client, run_id):
        client.update_run(run_id, status="RUNNING")
        return run_id
    tags = {"mlflow.parentRunId": parent, "sweep.study": study_name, "sweep.trial": str(number)}
    return client.create_run(experiment, tags=tags, run_name=f"{study_name}-trial-{number}").info.run_id


def log_values(client, run_id: str, values: dict) -> None:
    """The trial's values as parameters before its fit starts: a fit that fails at its start still says what it
    tried (the fit then logs the rest of the config; a run going on keeps the ones it has)."""
    from mlflow.entities import Param

    logged = client.get_run(run_id).data.params
    client.log_batch(run_id, params=[Param(o, cli_value(v)) for o, v in values.items() if o not in logged])


def mark(client, run_id: str, state: str, status: str | None = None) -> None:
    """The trial's state as the run's tag sweep.state, and the run's status when the sweep ends it."""
    client.set_tag(run_id, "sweep.state", state)
    if status:
        client.set_terminated(run_id, status)


def tag_best(client, parent: str, metric: str, best_run: str, number: int, value: float, runs: list[str]) -> None:
    """sweep.best on the best trial's run (and on no other of `runs`); its trial, run and value on the parent."""
    for run_id in runs:
        if run_id != best_run and active(client, run_id) and client.get_run(run_id).data.tags.get("sweep.best"):
            client.delete_tag(run_id, "sweep.best")
    client.set_tag(best_run, "sweep.best", "true")
    client.set_tag(parent, "sweep.best_trial", str(number))
    client.set_tag(parent, "sweep.best_run_id", best_run)
    client.log_metric(parent, f"best_{metric}", value, step=len(runs))
