"""A pipeline's register step: registers the train step's model (an MLflow model folder) under a name when the
evaluate step's metric reaches a threshold, and says so, registering nothing, when it does not; either way it passes
the model on to the score step (--output).

    python -m scripts.azure_ml.register_step MODEL_DIR METRICS_DIR --name birds-classifier --metric test_acc \\
        --threshold 0.9 --output OUT_DIR

METRICS_DIR holds the evaluate step's metrics.json. test_acc reaches a threshold at or above it, test_loss at or below.
The registry is MLflow's: inside Azure ML the workspace's (the step's run, MLFLOW_RUN_ID, gets the model's files), here
MLFLOW_TRACKING_URI's or outputs/mlflow.db, in a run of MLFLOW_EXPERIMENT_NAME (python -m scripts.pipeline --local
true sets both). Mistakes (no metrics.json, a metric it does not hold, no MLmodel) are one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from scripts.training.asset_names import name_problem

METRICS_FILE = "metrics.json"  # scripts/azure_ml/components.py's
LOCAL_STORE = Path("outputs/mlflow.db")  # scripts.train's own store when no MLFLOW_TRACKING_URI is set


class RegisterError(Exception):
    """A model or metrics folder the step cannot use; the message names it."""


def reaches(metric: str, value: float, threshold: float) -> bool:
    return value <= threshold if metric.endswith("_loss") else value >= threshold


def step_run(tracking_uri: str) -> str:
    """The run the model's files are logged to: Azure ML's step run (MLFLOW_RUN_ID), or a new one."""
    from mlflow import MlflowClient

    from scripts.training.tracking_server import experiment_id

    if os.environ.get("MLFLOW_RUN_ID"):
        return os.environ["MLFLOW_RUN_ID"]
    client = MlflowClient(tracking_uri)
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "lightning-template")
    location = (LOCAL_STORE.parent / "mlartifacts").resolve().as_uri() if tracking_uri.startswith("sqlite") else None
    run = client.create_run(experiment_id(client, name, location), run_name="register")
    client.set_terminated(run.info.run_id)  # the files and the registration need no open run
    return run.info.run_id


def register_step(model: Path, metrics: Path, name: str, metric: str, threshold: float, output: Path | None) -> str:
    """Registers `model` as a version of `name` when `metric` reaches `threshold`; returns the version, or ''."""
    if problem := name_problem(name, "--name"):  # the registry's refusal would be MLflow's traceback
        raise RegisterError(problem)
    if not (model / "MLmodel").is_file():
        raise RegisterError(f"{model}: no MLmodel in it; give the train step's model output (an MLflow model folder)")
    path = metrics / METRICS_FILE if metrics.is_dir() else metrics
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise RegisterError(f"{path}: not the evaluate step's metrics ({error}); give its metrics output") from None
    if metric not in values:
        raise RegisterError(f"{path}: no {metric} in it (it has {', '.join(sorted(values))}); give one of those")
    if output is not None:
        shutil.copytree(model, output, dirs_exist_ok=True)
    value = float(values[metric])
    relation = "at most" if metric.endswith("_loss") else "at least"
    if not reaches(metric, value, threshold):
        print(f"not registered: {metric} {value:.4f} does not reach the threshold ({relation} {threshold:g})")
        return ""
    from scripts.serving.mlflow_model import RegistryError, register_folder, register_later

    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{LOCAL_STORE}"
    run_id = step_run(tracking_uri)
    try:
        version = register_folder(tracking_uri, run_id, model, name)
    except RegistryError as error:
        raise RegisterError(
            f"--name {name}: the MLflow registry refused it ({error}); the model is logged to run {run_id} as "
            f"runs:/{run_id}/model: register it later with {register_later(tracking_uri, run_id, name)}"
        ) from None
    print(f"registered model: {name} version {version} ({metric} {value:.4f}, the threshold {relation} {threshold:g})")
    return version


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.azure_ml.register_step", description=__doc__.split("\n")[0]
    )
    parser.add_argument("model", type=Path, help="the MLflow model folder (the train step's model output)")
    parser.add_argument("metrics", type=Path, help="the evaluate step's metrics folder (or its metrics.json)")
    parser.add_argument("--name", required=True, help="the registered model's name, e.g. birds-classifier")
    parser.add_argument(
        "--metric", default="test_acc", help="the metric of metrics.json compared (test_acc, test_loss)"
    )
    parser.add_argument("--threshold", type=float, required=True, help="the value the metric must reach")
    parser.add_argument("--output", type=Path, default=None, help="a folder to copy the model to (the score step's)")
    options = parser.parse_args(args)
    try:
        register_step(options.model, options.metrics, options.name, options.metric, options.threshold, options.output)
    except RegisterError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
