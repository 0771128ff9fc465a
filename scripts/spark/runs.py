"""The MLflow run of a fit on Spark as the driver sees it (scripts.spark fit): a tag that the run rank 0 makes carries,
given to the tasks through MLflow's own MLFLOW_RUN_CONTEXT variable, and the run ended by the driver when the fit
fails: a killed executor takes the process that would end the run with it, and left it RUNNING.

    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

FIT_TAG = "template.spark_fit"  # one value per scripts.spark fit


def tagged_environment(environment: dict[str, str]) -> tuple[dict[str, str], str]:
    """(the tasks' environment with MLFLOW_RUN_CONTEXT holding this fit's tag beside any given, the tag's value)."""
    fit = uuid.uuid4().hex
    tags = json.loads(environment.get("MLFLOW_RUN_CONTEXT") or "{}")
    return {**environment, "MLFLOW_RUN_CONTEXT": json.dumps({**tags, FIT_TAG: fit})}, fit


def tracking_store(config, environment: dict[str, str]) -> str | None:
    """The store the tasks track to, as scripts.train picks it: the logger's tracking_uri, MLFLOW_TRACKING_URI, else
    mlflow.db in the root folder (None when that is not there: nothing was tracked)."""
    init_args = getattr(config.trainer.logger, "init_args", None) or {}
    given = init_args.get("tracking_uri") or environment.get("MLFLOW_TRACKING_URI")
    if given:
        return str(given)
    store = Path(str(config.trainer.default_root_dir or "outputs")) / "mlflow.db"
    return f"sqlite:///{store.resolve()}" if store.is_file() else None


def end_lost_runs(config, environment: dict[str, str], fit: str, status: str) -> list[str]:
    """Ends as `status` (KILLED, FAILED) the runs of the fit `fit` still RUNNING, and returns their ids; none when the
    store cannot be read (the failure is reported all the same)."""
    store = tracking_store(config, environment)
    if store is None:
        return []
    from mlflow import MlflowClient

    try:
        client = MlflowClient(store)
        experiments = [experiment.experiment_id for experiment in client.search_experiments(max_results=1000)]
        running = client.search_runs(experiments, f"tags.`{FIT_TAG}` = '{fit}' and attributes.status = 'RUNNING'")
        for run in running:
            client.set_terminated(run.info.run_id, status)
    except Exception:  # a store that does not answer now: the fit's own failure is the line to report
        return []
    return [run.info.run_id for run in running]
