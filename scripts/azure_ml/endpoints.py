"""The azure.ai.ml entities scripts.deploy creates, and their YAML as `az ml` takes it: a managed online endpoint and
its deployment (the registered MLflow model alone, Azure ML's no-code deployment, or scripts/score.py in the serving
environment), a batch endpoint and its model deployment (tabular files: the MLflow model alone; images:
scripts/serving/batch_score.py over the same model).

    python -m scripts.deploy online penguins-classifier:1 --endpoint penguins --dry_run true
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from scripts.azure_ml.assets import ENVIRONMENTS
from scripts.azure_ml.images import BASE_IMAGE
from scripts.azure_ml.yaml_files import dumped

SERVE_ENVIRONMENT = ENVIRONMENTS["serving"].conda_file
SCORING_SCRIPT = "scripts/score.py"
BATCH_SCORING_SCRIPT = "scripts/serving/batch_score.py"


@dataclass
class Names:
    model: str  # NAME
    version: str
    endpoint: str
    deployment: str

    @property
    def model_id(self) -> str:
        return f"azureml:{self.model}:{self.version}"


# What a batch deployment's scoring script runs under besides the serving environment: Azure ML's batch driver
# imports azureml-core, which every scoring-script batch deployment of Azure's own examples installs
# (Azure/azureml-examples, cli/endpoints/batch/deploy-models/*/environment/conda.yaml); pip resolves this version
# beside the serving environment's pins (pydantic, OpenTelemetry, numpy). pyarrow: pandas' Parquet reader, for the
# Parquet files batch_score.py scores (the training environment's version; mlflow 3.15 caps it below 26).
BATCH_PACKAGES = ("azureml-core==1.61.0.post4", "pyarrow==25.0.1")


def batch_conda() -> dict:
    """scripts/serving/environment.yml with BATCH_PACKAGES added to its pip list, as a conda file's contents."""
    conda = yaml.safe_load(Path(SERVE_ENVIRONMENT).read_text())
    pip = next(item for item in conda["dependencies"] if isinstance(item, dict) and "pip" in item)
    pip["pip"] = [*pip["pip"], *BATCH_PACKAGES]
    conda["name"] = f"{conda['name']}-batch"
    return conda


def environment(registered: str | None = None, batch: bool = False):
    """The serving environment: a registered one (azureml:NAME:VERSION, scripts.assets environment serving), else
    scripts/serving/environment.yml on Azure ML's Open MPI image, the one jobs use; for a batch deployment with its
    BATCH_PACKAGES."""
    if registered:
        return registered
    from azure.ai.ml.entities import Environment

    return Environment(image=BASE_IMAGE, conda_file=batch_conda() if batch else SERVE_ENVIRONMENT)


def build_online(
    names: Names,
    instance_type: str,
    instance_count: int,
    auth_mode: str,
    scoring: str,
    workers: int,
    request_timeout_ms: int,
    registered_environment: str | None = None,
):
    """The endpoint and the deployment; scoring "mlflow" is the model alone (Azure ML builds the environment from the
    model's own requirements and writes the scoring script), "script" is scripts/score.py in the serving
    environment. See scripts.deploy.online for the other arguments."""
    from azure.ai.ml.entities import (
        CodeConfiguration,
        ManagedOnlineDeployment,
        ManagedOnlineEndpoint,
        OnlineRequestSettings,
    )

    served_by = "Azure ML's MLflow scoring (no code)" if scoring == "mlflow" else SCORING_SCRIPT
    endpoint = ManagedOnlineEndpoint(
        name=names.endpoint, auth_mode=auth_mode, description=f"{names.model} served by {served_by}"
    )
    # WORKER_COUNT: the inference server's processes per instance, each with the model; one request at a time each.
    # Azure ML's no-code deployments run the same inference server, so it applies to both.
    variables = {"WORKER_COUNT": str(workers)}
    code = {}
    if scoring == "script":
        code = {
            "code_configuration": CodeConfiguration(code=".", scoring_script=SCORING_SCRIPT),
            "environment": environment(registered_environment),
        }
    deployment = ManagedOnlineDeployment(
        name=names.deployment,
        endpoint_name=names.endpoint,
        model=names.model_id,
        instance_type=instance_type,
        instance_count=instance_count,
        environment_variables=variables,
        request_settings=OnlineRequestSettings(
            request_timeout_ms=request_timeout_ms, max_concurrent_requests_per_instance=workers
        ),
        **code,
    )
    return endpoint, deployment


def build_batch(
    names: Names,
    inputs: str,
    compute: str,
    instance_count: int,
    mini_batch_size: int,
    max_concurrency_per_instance: int,
    registered_environment: str | None = None,
):
    """The batch endpoint and its model deployment. Tabular files (CSV, Parquet) are read and scored by Azure ML's
    own MLflow batch driver: no code, no environment. Images are files the MLflow driver cannot read as a table, so
    scripts/serving/batch_score.py turns each into the model's `image` column, in the serving environment. Every
    deployment appends one row per input to predictions.csv; a file that fails is logged and counted against the
    error threshold, its mini-batch's other files still scored."""
    from azure.ai.ml.entities import (
        BatchEndpoint,
        BatchRetrySettings,
        CodeConfiguration,
        ModelBatchDeployment,
        ModelBatchDeploymentSettings,
    )

    if inputs == "tabular":
        scores = "CSV and Parquet files by Azure ML's MLflow batch driver (no code)"
    else:
        scores = f"image files by {BATCH_SCORING_SCRIPT}"
    endpoint = BatchEndpoint(name=names.endpoint, description=f"{names.model} scoring {scores}")
    code = {}
    if inputs == "images":
        code = {
            "code_configuration": CodeConfiguration(code=".", scoring_script=BATCH_SCORING_SCRIPT),
            "environment": environment(registered_environment, batch=True),
        }
    deployment = ModelBatchDeployment(
        name=names.deployment,
        endpoint_name=names.endpoint,
        model=names.model_id,
        compute=compute,
        settings=ModelBatchDeploymentSettings(
            instance_count=instance_count,
            mini_batch_size=mini_batch_size,  # files per run(mini_batch) call
            max_concurrency_per_instance=max_concurrency_per_instance,
            output_action="append_row",
            output_file_name="predictions.csv",
            retry_settings=BatchRetrySettings(max_retries=3, timeout=300),
            error_threshold=-1,  # a bad file is logged and skipped, the job goes on
            logging_level="info",
        ),
        **code,
    )
    return endpoint, deployment


def entity_yaml(entity, folder: Path = Path(".")) -> str:
    """An endpoint's or deployment's YAML as `az ml ... create -f` takes it from a file in `folder`: the code path
    relative to that folder (the SDK writes this machine's absolute path), the environment's conda file inline."""
    from azure.ai.ml.entities import BatchEndpoint, OnlineEndpoint

    # An endpoint's dump returns its YAML's dict and writes nothing.
    data = plain(entity.dump()) if isinstance(entity, OnlineEndpoint | BatchEndpoint) else dumped(entity)
    if "code_configuration" in data:
        data["code_configuration"]["code"] = os.path.relpath(Path.cwd(), folder.resolve())
    if "instance_count" in data.get("settings", {}):  # the SDK dumps it twice and refuses a file that has both
        data["settings"].pop("instance_count")
    return yaml.safe_dump(data, sort_keys=False)


def plain(value):
    """The SDK's OrderedDicts as plain dicts and lists, which yaml.safe_dump writes."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return [plain(item) for item in value] if isinstance(value, list | tuple) else value
