"""Where a registered model's URI (models:/NAME/VERSION, models:/NAME@alias, runs:/RUN/model) is looked up, the same
for every command that takes one (scripts.serve, scripts.spark score): MLFLOW_TRACKING_URI, else the store
scripts.train writes, outputs/mlflow.db. A store that is not there is named, never made (MLflow would make an empty
one at a sqlite path, ./mlflow.db when nothing is set).

    python -m scripts.serve models:/penguins-classifier/1
    python -m scripts.spark score models:/penguins-classifier/1 new.csv --output predictions/
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STORE = Path("outputs/mlflow.db")  # scripts.train's, from the repository's root
REGISTRY_URIS = ("models:/", "runs:/")


class RegistryError(Exception):
    """A store or registered model that is not there; the message names it and what to give."""


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else outputs/mlflow.db (as an absolute sqlite URI: Spark's executors start elsewhere)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        store = os.environ["MLFLOW_TRACKING_URI"]
        if store.startswith("sqlite:///") and not Path(store.removeprefix("sqlite:///")).is_file():
            raise RegistryError(f"{store}: no such MLflow store; check MLFLOW_TRACKING_URI")
        return store
    if not DEFAULT_STORE.is_file():
        raise RegistryError(
            f"no MLflow store: {DEFAULT_STORE} is not here and MLFLOW_TRACKING_URI is not set; train with "
            "--register_model first, or give a model folder or checkpoint"
        )
    return f"sqlite:///{DEFAULT_STORE.resolve()}"


def use_store(uri: str) -> str:
    """The store `uri` is looked up in (`tracking_uri`), set as MLFLOW_TRACKING_URI for this process and those it
    starts (Spark's executors); refuses, in one line, a store or model that is not there (MLflow's own answer is a
    traceback, after Spark started)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    store = tracking_uri()
    os.environ["MLFLOW_TRACKING_URI"] = store
    mlflow.set_tracking_uri(store)
    try:
        mlflow.models.get_model_info(uri)
    except (MlflowException, OSError) as error:
        message = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise RegistryError(f"{uri}: not in the registry at {store} ({message}); check the name and version") from None
    return store
