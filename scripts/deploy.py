"""Serve a registered model from an Azure ML managed online endpoint, or score a folder or CSV with it as a job.

    python -m scripts.deploy online penguins-classifier:1 --endpoint penguins --instance_type Standard_DS3_v2
    python -m scripts.deploy online penguins-classifier:1 --endpoint penguins --dry_run true   # the two YAMLs
    python -m scripts.deploy online penguins-classifier:1 --endpoint penguins --yaml_dir deploy/  # files for `az ml`
    python -m scripts.deploy batch birds-classifier:2 azureml:photos:1 --compute cpu-cluster   # batch scoring job

`online` creates (or updates) the endpoint with its auth mode (`key`, or `aml_token`: tokens of the caller's Azure
login), then the deployment: the model version of the workspace's registry (where `fit --register_model` puts it when
the fit runs as an Azure ML job), this folder as code (less .amlignore) with scripts/score.py as the scoring script,
scripts/serving/environment.yml built on Azure ML's Open MPI image (the environment `make serve` runs locally:
azureml-inference-server-http, torch, ONNX Runtime), the instance type and count, SCORE_BACKEND; then sends it all
the traffic. `--dry_run true` prints the endpoint's YAML and the deployment's, what `az ml online-endpoint create -f`
and `az ml online-deployment create -f` take; `--yaml_dir` writes them there.

`batch` runs the same scoring code as a command job (`python -m scripts.score MODEL INPUT --output ...`) over a folder
of images or a CSV of penguins, on a compute cluster, and writes predictions.csv to the job's output `predictions`.
A job rather than a batch endpoint: nothing to keep deployed, the online endpoint's code and environment unchanged.

Every check of the arguments runs before the Azure SDK is imported; each mistake is one line and exit 1. The
workspace is config.json or --subscription_id --resource_group --workspace, as for scripts.submit.
"""

from __future__ import annotations

import io
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from scripts.azure_ml.assets import ENVIRONMENTS
from scripts.azure_ml.jobs import (
    BASE_IMAGE,
    SubmitError,
    check_workspace_ids,
    is_local,
    parse_reference,
    workspace_client,
)

SERVE_ENVIRONMENT = ENVIRONMENTS["serving"].conda_file
SCORING_SCRIPT = "scripts/score.py"
NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{1,30}[A-Za-z0-9]")  # Azure ML's rule for endpoint and deployment names
GPU_SIZE = re.compile(r"Standard_N", re.IGNORECASE)  # Azure's N-series (NC, ND, NG, NV): the VM sizes with GPUs
MODEL = re.compile(r"(?:azureml:|models:/)?([A-Za-z0-9][\w.-]*)[:/](\d+)")


class DeployError(Exception):
    """A bad model, name, option or workspace; the message names it and what to give instead."""


@dataclass
class Names:
    model: str  # NAME
    version: str
    endpoint: str
    deployment: str

    @property
    def model_id(self) -> str:
        return f"azureml:{self.model}:{self.version}"


def check_names(model: str, endpoint: str, deployment: str) -> Names:
    if not Path(SERVE_ENVIRONMENT).is_file():
        raise DeployError(f"{SERVE_ENVIRONMENT} is not here: run from the repository's root (the deployment's code)")
    found = MODEL.fullmatch(model)
    if found is None:
        raise DeployError(
            f"model {model!r}: give a registered model as NAME:VERSION (azureml:NAME:VERSION, models:/NAME/VERSION), "
            "e.g. penguins-classifier:1 from `fit --register_model penguins-classifier` in an Azure ML job"
        )
    for option, name in (("--endpoint", endpoint), ("--deployment", deployment)):
        if not NAME.fullmatch(name or ""):
            raise DeployError(
                f"{option} {name!r}: 3-32 letters, digits and hyphens, starting with a letter, not ending in a hyphen"
            )
    return Names(found.group(1), found.group(2), endpoint, deployment)


def environment(registered: str | None = None):
    """The serving environment: a registered one (azureml:NAME:VERSION, scripts.assets environment serving), else
    scripts/serving/environment.yml on Azure ML's Open MPI image, the one jobs use."""
    if registered:
        return registered
    from azure.ai.ml.entities import Environment

    return Environment(image=BASE_IMAGE, conda_file=SERVE_ENVIRONMENT)


def build_online(
    names: Names,
    instance_type: str,
    instance_count: int,
    auth_mode: str,
    backend: str,
    workers: int,
    request_timeout_ms: int,
    registered_environment: str | None = None,
):
    """The azure.ai.ml endpoint and deployment; see `online` for the arguments."""
    from azure.ai.ml.entities import (
        CodeConfiguration,
        ManagedOnlineDeployment,
        ManagedOnlineEndpoint,
        OnlineRequestSettings,
    )

    endpoint = ManagedOnlineEndpoint(
        name=names.endpoint, auth_mode=auth_mode, description=f"{names.model} served by scripts/score.py"
    )
    deployment = ManagedOnlineDeployment(
        name=names.deployment,
        endpoint_name=names.endpoint,
        model=names.model_id,
        code_configuration=CodeConfiguration(code=".", scoring_script=SCORING_SCRIPT),
        environment=environment(registered_environment),
        instance_type=instance_type,
        instance_count=instance_count,
        # WORKER_COUNT: the inference server's processes per instance, each with the model; one request at a time each.
        environment_variables={"SCORE_BACKEND": backend, "WORKER_COUNT": str(workers)},
        request_settings=OnlineRequestSettings(
            request_timeout_ms=request_timeout_ms, max_concurrent_requests_per_instance=workers
        ),
    )
    return endpoint, deployment


def entity_yaml(entity, folder: Path = Path(".")) -> str:
    """An endpoint's or deployment's YAML as `az ml ... create -f` takes it from a file in `folder`: the code path
    relative to that folder (the SDK writes this machine's absolute path), the environment's conda file inline."""
    from azure.ai.ml.entities import OnlineEndpoint

    if isinstance(entity, OnlineEndpoint):
        data = plain(entity.dump())  # an endpoint's dump returns its YAML's dict and writes nothing
    else:
        text = io.StringIO()
        entity.dump(text)
        data = yaml.safe_load(text.getvalue())
    if "code_configuration" in data:
        data["code_configuration"]["code"] = os.path.relpath(Path.cwd(), folder.resolve())
    return yaml.safe_dump(data, sort_keys=False)


def plain(value):
    """The SDK's OrderedDicts as plain dicts and lists, which yaml.safe_dump writes."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return [plain(item) for item in value] if isinstance(value, list | tuple) else value


def online(
    model: str,
    endpoint: str = "",
    deployment: str = "blue",
    instance_type: str = "Standard_DS3_v2",
    instance_count: int = 1,
    auth_mode: Literal["key", "aml_token"] = "key",
    backend: Literal["onnxruntime", "torch"] = "onnxruntime",
    workers: int = 1,
    request_timeout_ms: int = 5000,
    environment: str | None = None,
    dry_run: bool = False,
    yaml_dir: str | None = None,
    subscription_id: str | None = None,
    resource_group: str | None = None,
    workspace: str | None = None,
) -> str:
    """Creates or updates the managed online endpoint and its deployment, and sends it all traffic; returns the
    scoring URI (or, with dry_run, the YAML).

    Args:
        model: the registered model, NAME:VERSION (also azureml:NAME:VERSION or models:/NAME/VERSION).
        endpoint: the endpoint's name: unique in the Azure region, 3-32 letters, digits and hyphens.
        deployment: the deployment's name within the endpoint (blue, green, ...).
        instance_type: the VM size, e.g. Standard_DS3_v2 (4 cores; Azure ML's smallest supported is Standard_DS1_v2);
            a GPU size (Standard_N*) only with a registered GPU serving --environment: the default one runs on CPUs.
        instance_count: VMs serving the deployment.
        auth_mode: key (two static keys: `az ml online-endpoint get-credentials`) or aml_token (Azure ML tokens,
            expiring, from the caller's Azure login).
        backend: the scoring script's runtime (SCORE_BACKEND): onnxruntime or torch.
        workers: inference server processes per instance (WORKER_COUNT), each with its own copy of the model.
        request_timeout_ms: Azure ML's request timeout (its default, 5000 ms, fits these models).
        environment: a registered serving environment, azureml:NAME:VERSION (python -m scripts.assets environment
            serving); default: scripts/serving/environment.yml, built with the deployment.
        dry_run: print the endpoint's and the deployment's YAML instead of creating them.
        yaml_dir: with dry_run, write endpoint.yml and deployment.yml to this folder (for `az ml ... create -f`).
        subscription_id, resource_group, workspace: the workspace, when there is no config.json.
    """
    names = check_names(model, endpoint, deployment)
    if not re.fullmatch(r"Standard_\w+", instance_type):
        raise DeployError(f"--instance_type {instance_type!r}: give an Azure VM size such as Standard_DS3_v2")
    if GPU_SIZE.match(instance_type) and environment is None:
        raise DeployError(
            f"--instance_type {instance_type}: a GPU size, but the serving environment ({SERVE_ENVIRONMENT} on Azure "
            "ML's CPU image) scores on CPUs; give a CPU size such as Standard_DS3_v2, or --environment a registered "
            "serving environment built for GPUs"
        )
    if instance_count < 1 or workers < 1 or request_timeout_ms < 1:
        raise DeployError("--instance_count, --workers and --request_timeout_ms must be 1 or more")
    if yaml_dir and not dry_run:
        raise DeployError("--yaml_dir writes the YAML instead of deploying: add --dry_run true")
    check_workspace_ids(subscription_id, resource_group, workspace)
    if environment is not None:
        environment = parse_reference(environment, "--environment", "azureml:lightning-serving:1")
    built = build_online(names, instance_type, instance_count, auth_mode, backend, workers, request_timeout_ms,
                         environment)  # fmt: skip
    endpoint_entity, deployment_entity = built
    if dry_run:
        folder = Path(yaml_dir) if yaml_dir else Path(".")
        texts = [entity_yaml(endpoint_entity, folder), entity_yaml(deployment_entity, folder)]
        if yaml_dir:
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in zip(("endpoint.yml", "deployment.yml"), texts):
                (folder / name).write_text(text)
            print(
                f"wrote {folder / 'endpoint.yml'} and {folder / 'deployment.yml'}: az ml online-endpoint create -f "
                f"{folder / 'endpoint.yml'}, then az ml online-deployment create -f {folder / 'deployment.yml'} "
                "--all-traffic"
            )
        else:
            print(f"# endpoint.yml\n{texts[0]}---\n# deployment.yml\n{texts[1]}", end="")
        return "---\n".join(texts)
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    from scripts.azure_ml.code_snapshot import code_snapshot

    client = workspace_client(subscription_id, resource_group, workspace)
    try:
        client.online_endpoints.begin_create_or_update(endpoint_entity).result()
        print(f"endpoint {names.endpoint} is ready; creating deployment {names.deployment} (builds the environment)")
        with code_snapshot(Path.cwd()) as code:  # the SDK's own walk of the folder reads .venv's every file
            deployment_entity.code_configuration.code = str(code)
            client.online_deployments.begin_create_or_update(deployment_entity).result()
        created = client.online_endpoints.get(names.endpoint)
        created.traffic = {names.deployment: 100}
        client.online_endpoints.begin_create_or_update(created).result()
        scoring_uri = client.online_endpoints.get(names.endpoint).scoring_uri
    except ClientAuthenticationError:
        raise DeployError(
            "not signed in to Azure: run `az login` (or set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET "
            "for a service principal), then deploy again"
        ) from None
    except HttpResponseError as error:
        message = str(error.message or error).strip().splitlines()[0]
        raise DeployError(f"Azure ML refused endpoint {names.endpoint}: {message}") from None
    credentials = "get-credentials" if auth_mode == "key" else "get-credentials (an aml_token)"
    print(f"deployment {names.deployment} takes all traffic of {scoring_uri}")
    print(f"its key: az ml online-endpoint {credentials} -n {names.endpoint}")
    return scoring_uri


def build_batch(names: Names, data: str, compute: str, backend: str, data_type: str, registered: str | None = None):
    """The command job that runs scripts/score.py over `data` with the registered model."""
    from azure.ai.ml import Input, Output, command

    if is_local(data):
        data = str(Path(data).resolve())
    return command(
        code=".",
        command=(
            f"python -m scripts.score ${{{{inputs.model}}}} ${{{{inputs.data}}}} --backend {backend} "
            "--output ${{outputs.predictions}}"
        ),
        inputs={
            "model": Input(type="mlflow_model", path=names.model_id),
            "data": Input(type=data_type, path=data, mode="ro_mount"),
        },
        outputs={"predictions": Output(type="uri_folder", mode="rw_mount")},
        environment=environment(registered),
        compute=compute,
        experiment_name=f"{names.model}-batch",
        display_name=f"score {names.model}:{names.version}",
    )


def batch(
    model: str,
    data: str,
    compute: str = "",
    backend: Literal["onnxruntime", "torch"] = "onnxruntime",
    data_type: Literal["uri_folder", "uri_file"] | None = None,
    environment: str | None = None,
    dry_run: bool = False,
    subscription_id: str | None = None,
    resource_group: str | None = None,
    workspace: str | None = None,
) -> str:
    """Scores a folder of images or a CSV of penguins with a registered model as an Azure ML command job; returns the
    job's name (or, with dry_run, its YAML).

    Args:
        model: the registered model, NAME:VERSION (also azureml:NAME:VERSION or models:/NAME/VERSION).
        data: a local folder or file (uploaded), a data asset azureml:NAME:VERSION, or a datastore URI.
        compute: the compute cluster to run on.
        backend: the scoring script's runtime: onnxruntime or torch.
        data_type: uri_file or uri_folder, for a data asset or URI (a local path is what it is on disk; default: a
            folder unless it ends in .csv); a data asset's type must be the one it was registered as.
        environment: a registered serving environment, azureml:NAME:VERSION; default: scripts/serving/environment.yml.
        dry_run: print the job's YAML (`az ml job create -f`) instead of submitting it.
        subscription_id, resource_group, workspace: the workspace, when there is no config.json.
    """
    names = check_names(model, "batch", "batch")
    if not compute:
        raise DeployError("give the compute cluster to run on: --compute NAME")
    if is_local(data):
        if not Path(data).exists():
            raise DeployError(f"{data}: no such file or folder; give images (a folder) or a CSV of penguins")
        data_type = "uri_file" if Path(data).is_file() else "uri_folder"
    elif data_type is None:
        data_type = "uri_file" if data.lower().endswith(".csv") else "uri_folder"
    check_workspace_ids(subscription_id, resource_group, workspace)
    if environment is not None:
        environment = parse_reference(environment, "--environment", "azureml:lightning-serving:1")
    job = build_batch(names, data, compute, backend, data_type, environment)
    if dry_run:
        from scripts.azure_ml.jobs import job_yaml

        text = job_yaml(job)
        print(text, end="")
        return text
    from scripts.azure_ml.code_snapshot import code_snapshot

    client = workspace_client(subscription_id, resource_group, workspace)
    with code_snapshot(Path.cwd()) as code:
        job.code = str(code)
        submitted = client.jobs.create_or_update(job)
    print(f"submitted {submitted.name}: {submitted.studio_url}")
    return submitted.name


def main(args: list[str] | None = None) -> None:
    """Every mistake is one line on stderr and exit 1."""
    import logging

    from jsonargparse import ArgumentError, auto_cli

    from scripts.training.cli_errors import argument_error_line

    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)
    try:
        auto_cli({"online": online, "batch": batch}, args=args, as_positional=True, exit_on_error=False)
    except ArgumentError as error:
        sys.exit(f"error: {argument_error_line(str(error))} (python -m scripts.deploy --help lists the options)")
    except (DeployError, SubmitError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
