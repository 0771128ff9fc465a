"""A pipeline run on this machine, step after step, each its real command in its own process, as Azure ML runs it: in a
copy of the code Azure ML would upload (scripts/azure_ml/code_snapshot.py), `${{inputs.*}}` and `${{outputs.*}}` the
folders one step writes and the next reads, `$[[...]]` kept only when its optional input is given.

    python -m scripts.pipeline configs/penguins.yaml --local true --score_data configs/examples/penguins.csv

Every step's folders go to <local_dir>/pipelines/<task>-<time>/<step>/<output> (what the step wrote to ./outputs, its
run's config among them, to <step>/outputs), its MLflow runs to MLFLOW_TRACKING_URI or <local_dir>/mlflow.db (the
store scripts.train writes when local_dir is `outputs`, its default). A step that fails ends the run with its exit
status, naming the step.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scripts.azure_ml.errors import SubmitError
from scripts.azure_ml.pipelines import PipelinePlan

OPTIONAL = re.compile(r"\$\[\[(.*?)\]\]")
REFERENCE = re.compile(r"\$\{\{(inputs|outputs)\.(\w+)\}\}")
OUTPUTS = {"train": ("model", "checkpoints", "metrics"), "evaluate": ("metrics",), "register": ("model",),
           "score": ("predictions",)}  # fmt: skip


def local_command(command: str, inputs: dict[str, object], outputs: dict[str, Path]) -> list[str]:
    """The step's command with its references filled in, as the argument list of one process."""

    def optional(found: re.Match) -> str:
        names = [name for kind, name in REFERENCE.findall(found.group(1)) if kind == "inputs"]
        return found.group(1) if all(inputs.get(name) is not None for name in names) else ""

    def fill(found: re.Match) -> str:
        value = inputs[found.group(2)] if found.group(1) == "inputs" else outputs[found.group(2)]
        return shlex.quote(str(value))

    args = shlex.split(REFERENCE.sub(fill, OPTIONAL.sub(optional, command)))
    return [sys.executable if args[0] == "python" else args[0], *args[1:]]


def step_inputs(plan: PipelinePlan, done: dict[str, dict[str, Path]]) -> dict[str, dict[str, object]]:
    """Each step's inputs: the given data, the train parameters' defaults, and the outputs of the steps before."""
    components = plan.components
    training = plan.training_data.path if plan.training_data else None
    train = {name: default for name, (_, default) in components.parameters.items()}
    train |= {"training_data": training, "nodes": 1, "processes_per_node": 1, "launch_config": None}
    return {
        "train": train,
        "evaluate": {"checkpoints": done.get("train", {}).get("checkpoints"),
                     "test_data": plan.test_data.path if plan.test_data else training},
        "register": {"model": done.get("train", {}).get("model"), "metrics": done.get("evaluate", {}).get("metrics"),
                     "model_name": plan.model_name, "metric": plan.metric, "threshold": plan.threshold},
        "score": {"model": done.get("register", {}).get("model"), "data": plan.score_data.path},
    }  # fmt: skip


def tracking_environment(local_dir: Path, experiment: str) -> dict[str, str]:
    """MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME for every step: the user's store, or local_dir's (its experiment
    made with its artifacts beside it, as scripts.train makes one there)."""
    environment = {"MLFLOW_EXPERIMENT_NAME": experiment}
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return environment
    from mlflow import MlflowClient

    from scripts.training.tracking import open_sqlite_store
    from scripts.training.tracking_server import experiment_id

    uri = f"sqlite:///{(local_dir / 'mlflow.db').resolve()}"
    local_dir.mkdir(parents=True, exist_ok=True)
    open_sqlite_store(uri)
    experiment_id(MlflowClient(uri), experiment, (local_dir / "mlartifacts").resolve().as_uri())
    return {**environment, "MLFLOW_TRACKING_URI": uri}


def run_local(plan: PipelinePlan, local_dir: Path) -> Path:
    """Runs the four steps here; returns the run's folder."""
    from scripts.azure_ml.code_snapshot import code_snapshot

    if plan.sweep is not None:
        raise SubmitError(
            "--local true with --sweep: a sweep step runs in Azure ML; here: python -m scripts.sweep FILE"
        )
    for option, data in (("--data", plan.training_data), ("--test_data", plan.test_data),
                         ("--score_data", plan.score_data)):  # fmt: skip
        if data is not None and not Path(data.path).exists():
            raise SubmitError(f"--local true {option} {data.path}: runs on local files; give a folder or file here")
    folder = first = local_dir / "pipelines" / f"{plan.components.task}-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in itertools.count(2):  # another run of the task started in the same second has the name: -2, -3, ...
        try:
            folder.mkdir(parents=True)
            break
        except FileExistsError:
            folder = first.with_name(f"{first.name}-{n}")
    environment = {**os.environ, **tracking_environment(local_dir, plan.experiment)}
    done: dict[str, dict[str, Path]] = {}
    for step in ("train", "evaluate", "register", "score"):
        outputs = {name: (folder / step / name).resolve() for name in OUTPUTS[step]}
        for path in outputs.values():
            path.mkdir(parents=True)
        args = local_command(plan.components.commands[step], step_inputs(plan, done)[step], outputs)
        print(f"[{step}] {shlex.join(['python', *args[1:]])}", flush=True)
        with code_snapshot(Path.cwd()) as code:  # what Azure ML uploads, as the step's working folder
            status = subprocess.run(args, cwd=code, env=environment).returncode
            if (code / "outputs").is_dir():
                shutil.move(code / "outputs", folder / step / "outputs")
        if status != 0:
            raise SubmitError(
                f"step {step} failed (exit status {status}); its output is above, its folders in {folder}"
            )
        done[step] = outputs
    print(f"pipeline done: {folder} (predictions: {done['score']['predictions'] / 'predictions.csv'})")
    print(registration(plan, done["evaluate"]["metrics"]))
    return folder


def registration(plan: PipelinePlan, metrics: Path) -> str:
    """What the register step did, from the evaluate step's metrics: a run below the threshold registered nothing,
    and its score step scored with the model all the same."""
    from scripts.azure_ml.register_step import METRICS_FILE, reaches

    value = float(json.loads((metrics / METRICS_FILE).read_text())[plan.metric])
    relation = "at most" if plan.metric.endswith("_loss") else "at least"
    if reaches(plan.metric, value, plan.threshold):
        return f"registered: {plan.model_name} ({plan.metric} {value:.4f}, the threshold {relation} {plan.threshold:g})"
    return (
        f"registered nothing: {plan.metric} {value:.4f} does not reach --threshold {plan.threshold:g} ({relation}); "
        f"the predictions are the unregistered model's"
    )
