"""Serve a registered MLflow model from an Azure ML managed online endpoint, or score folders and CSVs with it from a
batch endpoint (docs/azure-ml.md says what each creates and its options). Every check but batch's --instance_count
against the cluster's maximum runs before the Azure SDK is imported; each mistake is one line and exit 1.

    python -m scripts.deploy online penguins-classifier:1 --endpoint penguins --instance_type Standard_DS3_v2
    python -m scripts.deploy online penguins-classifier:1 --endpoint penguins --dry_run true   # the two YAMLs
    python -m scripts.deploy online penguins-classifier:1 --endpoint penguins --scoring script  # scripts/score.py
    python -m scripts.deploy batch birds-classifier:2 --endpoint birds-batch --inputs images --compute cpu-cluster
    python -m scripts.deploy batch penguins-classifier:1 --endpoint penguins-rows --inputs tabular --compute cpu-cluster
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from scripts.azure_ml.assets import default_kind
from scripts.azure_ml.endpoints import SERVE_ENVIRONMENT, Names
from scripts.azure_ml.errors import SubmitError, service_line
from scripts.azure_ml.option_values import parse_reference
from scripts.azure_ml.options import DryRun, run_command
from scripts.azure_ml.workspace import (
    GPU_SIZE,
    VM_SIZE,
    check_cluster_size,
    check_workspace_ids,
    compute_name,
    not_signed_in,
    workspace_client,
)
from scripts.azure_ml.yaml_files import check_not_written_over, check_yaml_dir

NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{1,30}[A-Za-z0-9]")  # Azure ML's rule for endpoint and deployment names
MODEL = re.compile(r"(?:azureml:|models:/)?([A-Za-z0-9][\w.-]*)[:/](\d+)")
MAX_REQUEST_TIMEOUT_MS = 180_000  # Azure ML's limit of managed online deployments' request_timeout_ms


class DeployError(Exception):
    """A bad model, name, option or workspace; the message names it and what to give instead."""


def check_names(model: str, endpoint: str, deployment: str) -> Names:
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


def check_code_folder() -> None:
    """A deployment with code uploads this folder: it must be the repository's root."""
    if not Path(SERVE_ENVIRONMENT).is_file():
        raise DeployError(f"{SERVE_ENVIRONMENT} is not here: run from the repository's root (the deployment's code)")


def registered_environment(environment: str | None, with_code: bool, option: str) -> str | None:
    if environment is None:
        return None
    if not with_code:
        raise DeployError(f"--environment is for {option}; the MLflow model alone brings its own requirements")
    reference = parse_reference(environment, "--environment", "azureml:lightning-serving:1")
    if default_kind(reference) in ("training", "training-gpu"):  # would build for an hour, then serve nothing
        raise DeployError(
            f"--environment {environment}: the {default_kind(reference)} environment (environment.yml), which has no "
            "Azure ML inference server to serve the model; give the serving one, e.g. azureml:lightning-serving:1 "
            "(python -m scripts.assets environment serving)"
        )
    return reference


def checked_output(options: DryRun, with_code: bool, environment: str | None, option: str) -> str | None:
    """The last checks before the SDK's import: the dry run's folder, the code folder (`with_code`: the deployment
    uploads it), the workspace's ids; returns the registered environment (--environment, which goes with `option`)."""
    if options.yaml_dir and not options.dry_run:
        raise DeployError("--yaml_dir writes the YAML instead of deploying: add --dry_run true")
    check_yaml_dir(options.yaml_dir, "deploy/")
    if with_code:
        check_code_folder()
    environment = registered_environment(environment, with_code, option)
    check_workspace_ids(*options.workspace_ids(), not options.dry_run)
    return environment


def print_or_write(entities: tuple, yaml_dir: str | None, kind: str) -> str:
    """The dry run: the endpoint's and the deployment's YAML printed, or written to yaml_dir; returns both."""
    from scripts.azure_ml.endpoints import entity_yaml

    folder = Path(yaml_dir) if yaml_dir else Path(".")
    texts = [entity_yaml(entity, folder) for entity in entities]
    if yaml_dir:
        written = {"endpoint.yml": ("an endpoint's YAML", ("name", "auth_mode")),
                   "deployment.yml": ("a deployment's YAML", ("name", "endpoint_name"))}  # fmt: skip
        check_not_written_over(folder, written, "--yaml_dir")
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in zip(written, texts):  # the endpoint's file, then the deployment's
            (folder / name).write_text(text)
        traffic = " --all-traffic" if kind == "online" else " --set-default"
        print(
            f"wrote {folder / 'endpoint.yml'} and {folder / 'deployment.yml'}: az ml {kind}-endpoint create -f "
            f"{folder / 'endpoint.yml'}, then az ml {kind}-deployment create -f {folder / 'deployment.yml'}{traffic}"
        )
    else:
        print(f"# endpoint.yml\n{texts[0]}---\n# deployment.yml\n{texts[1]}", end="")
    return "---\n".join(texts)


def check_model(client, names: Names) -> None:
    """The model version is the workspace's: one it lacks would be refused only with the deployment, after a new
    endpoint was created, left empty."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        client.models.get(names.model, names.version)
    except ResourceNotFoundError:
        raise DeployError(
            f"model {names.model}:{names.version} is not registered in this workspace; nothing was created. Its "
            f"versions: az ml model list --name {names.model}"
        ) from None


def create(client, names: Names, operations: str, endpoint, deployment, finish, kept: tuple[str, ...] = ()) -> str:
    """The model checked (check_model), then the endpoint, then the deployment (its code snapshot uploaded, if it has
    code), through the client's `operations` (online_endpoints / batch_endpoints), then finish(endpoints), whose answer
    this returns; Azure's refusals as DeployError. An endpoint that is there keeps its traffic and default deployment,
    and the settings named in `kept` (those the user left to it)."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError

    from scripts.azure_ml.code_snapshot import code_snapshot

    endpoints = getattr(client, operations)
    deployments = getattr(client, operations.replace("endpoints", "deployments"))
    try:
        check_model(client, names)
        try:
            live = endpoints.get(endpoint.name)
        except ResourceNotFoundError:
            live = None
        # An endpoint put without its traffic (online) or default deployment (batch) takes them from the deployments
        # serving now, for as long as the new one takes to provision, and for good if it fails: they are kept.
        for setting in ("traffic", "mirror_traffic", "defaults", *kept):
            if live is not None and getattr(live, setting, None):
                setattr(endpoint, setting, getattr(live, setting))
        endpoints.begin_create_or_update(endpoint).result()
        print(f"endpoint {endpoint.name} is ready; creating deployment {deployment.name}")
        if deployment.code_configuration is None:
            deployments.begin_create_or_update(deployment).result()
        else:
            with code_snapshot(Path.cwd()) as code:  # the SDK's own walk of the folder reads .venv's every file
                deployment.code_configuration.code = str(code)
                deployments.begin_create_or_update(deployment).result()
        return finish(endpoints)
    except ClientAuthenticationError:
        raise DeployError(not_signed_in("deploy")) from None
    except HttpResponseError as error:
        message = service_line(error)
        raise DeployError(f"Azure ML refused endpoint {endpoint.name}: {message}") from None


def online(
    model: str,
    endpoint: str = "",
    deployment: str = "blue",
    instance_type: str = "Standard_DS3_v2",
    instance_count: int = 1,
    auth_mode: Literal["key", "aml_token"] | None = None,
    scoring: Literal["mlflow", "script"] = "mlflow",
    workers: int = 1,
    request_timeout_ms: int = 5000,
    environment: str | None = None,
    **given,
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
            expiring, from the caller's Azure login); default: the endpoint's own if it is there, else key.
        scoring: mlflow (the model alone: Azure ML's no-code deployment of MLflow models) or script (scripts/score.py
            in the serving environment: this project's request format and 4xx errors).
        workers: inference server processes per instance (WORKER_COUNT), each with its own copy of the model.
        request_timeout_ms: Azure ML's request timeout (its default, 5000 ms, fits these models), 180000 at most.
        environment: with --scoring script, a registered serving environment, azureml:NAME:VERSION (python -m
            scripts.assets environment serving); default: scripts/serving/environment.yml, built with the deployment.
        given: --dry_run (the endpoint's and the deployment's YAML), --yaml_dir (endpoint.yml and deployment.yml)
            and the workspace (scripts/azure_ml/options.py's DryRun).
    """
    names = check_names(model, endpoint, deployment)
    if not VM_SIZE.fullmatch(instance_type):
        raise DeployError(f"--instance_type {instance_type!r}: give an Azure VM size such as Standard_DS3_v2")
    if GPU_SIZE.match(instance_type) and (environment is None or default_kind(environment) == "serving"):
        raise DeployError(
            f"--instance_type {instance_type}: a GPU size, but the model scores on CPUs (ONNX Runtime's CPU build, in "
            f"its requirements and {SERVE_ENVIRONMENT}); give a CPU size such as Standard_DS3_v2, or --scoring script "
            "--environment a registered serving environment built for GPUs"
        )
    if instance_count < 1 or workers < 1 or request_timeout_ms < 1:
        raise DeployError("--instance_count, --workers and --request_timeout_ms must be 1 or more")
    if request_timeout_ms > MAX_REQUEST_TIMEOUT_MS:
        raise DeployError(
            f"--request_timeout_ms {request_timeout_ms}: Azure ML's managed online endpoints take "
            f"{MAX_REQUEST_TIMEOUT_MS} (3 minutes) at most; give {MAX_REQUEST_TIMEOUT_MS} or less"
        )
    options = DryRun(**given)
    with_code = scoring == "script"
    environment = checked_output(options, with_code, environment, "--scoring script")
    from scripts.azure_ml.endpoints import build_online

    entities = build_online(names, instance_type, instance_count, auth_mode or "key", scoring, workers,
                            request_timeout_ms, environment)  # fmt: skip
    if options.dry_run:
        return print_or_write(entities, options.yaml_dir, "online")

    def all_traffic(endpoints) -> str:
        created = endpoints.get(names.endpoint)
        created.traffic = {names.deployment: 100}
        # Azure ML refuses a deployment that takes live and mirrored traffic: one that shadowed the live one stops.
        mirrored = dict(created.mirror_traffic or {})
        if mirrored.pop(names.deployment, 0):
            created.mirror_traffic = mirrored
            print(f"deployment {names.deployment} takes no more mirrored traffic: it takes the live traffic")
        endpoints.begin_create_or_update(created).result()
        return endpoints.get(names.endpoint).scoring_uri

    client = workspace_client(*options.workspace_ids())
    scoring_uri = create(client, names, "online_endpoints", *entities, all_traffic, () if auth_mode else ("auth_mode",))
    credentials = "get-credentials" if entities[0].auth_mode == "key" else "get-credentials (an aml_token)"
    print(f"deployment {names.deployment} takes all traffic of {scoring_uri}")
    print(f"its key: az ml online-endpoint {credentials} -n {names.endpoint}")
    return scoring_uri


def batch(
    model: str,
    endpoint: str = "",
    inputs: Literal["tabular", "images"] | None = None,
    compute: str = "",
    deployment: str = "default",
    instance_count: int = 1,
    mini_batch_size: int = 10,
    max_concurrency_per_instance: int = 1,
    environment: str | None = None,
    **given,
) -> str:
    """Creates or updates a batch endpoint and a model deployment, its default; returns the endpoint's invocation URI
    (or, with dry_run, the YAML).

    Args:
        model: the registered model, NAME:VERSION (also azureml:NAME:VERSION or models:/NAME/VERSION).
        endpoint: the batch endpoint's name: unique in the Azure region, 3-32 letters, digits and hyphens.
        inputs: what the endpoint scores: tabular (CSV or Parquet files of rows: the model alone, Azure ML's MLflow
            batch driver) or images (image files: scripts/serving/batch_score.py over the model).
        compute: the compute cluster the scoring jobs run on (its name, or azureml:NAME).
        deployment: the deployment's name within the endpoint.
        instance_count: nodes of the cluster a scoring job uses, at most its maximum (read from the workspace before
            anything is created; not with dry_run, which asks the workspace nothing).
        mini_batch_size: files per call of the scoring code (per run(mini_batch)).
        max_concurrency_per_instance: scoring processes per node.
        environment: with --inputs images, a registered serving environment, azureml:NAME:VERSION, with azureml-core
            in it (Azure ML's batch driver needs it); default: scripts/serving/environment.yml and azureml-core, built
            with the deployment.
        given: --dry_run (the endpoint's and the deployment's YAML), --yaml_dir (endpoint.yml and deployment.yml)
            and the workspace (scripts/azure_ml/options.py's DryRun).
    """
    names = check_names(model, endpoint, deployment)
    if inputs is None:
        raise DeployError("say what the endpoint scores: --inputs tabular (CSV or Parquet files) or --inputs images")
    if not compute:
        raise DeployError("give the compute cluster the scoring jobs run on: --compute NAME")
    compute = compute_name(compute, "")
    if compute.lower() in ("serverless", "local"):  # Azure ML's batch deployments name a compute of the workspace
        raise DeployError(
            f"--compute {compute}: a batch deployment's scoring jobs run on a compute cluster of the workspace; give "
            "its name, e.g. cpu-cluster"
        )
    if instance_count < 1 or mini_batch_size < 1 or max_concurrency_per_instance < 1:
        raise DeployError("--instance_count, --mini_batch_size and --max_concurrency_per_instance must be 1 or more")
    options = DryRun(**given)
    with_code = inputs == "images"
    environment = checked_output(options, with_code, environment, "--inputs images")
    from scripts.azure_ml.endpoints import build_batch

    entities = build_batch(names, inputs, compute, instance_count, mini_batch_size, max_concurrency_per_instance,
                           environment)  # fmt: skip
    if options.dry_run:
        return print_or_write(entities, options.yaml_dir, "batch")

    def default_deployment(endpoints) -> str:
        created = endpoints.get(names.endpoint)
        created.defaults = {"deployment_name": names.deployment}  # the service may answer without defaults
        endpoints.begin_create_or_update(created).result()
        return endpoints.get(names.endpoint).scoring_uri

    client = workspace_client(*options.workspace_ids())
    check_cluster_size(client, compute, instance_count, "--instance_count", "deploy")  # before anything is created
    uri = create(client, names, "batch_endpoints", *entities, default_deployment)
    kind = "uri_folder" if with_code else "uri_folder (or uri_file for one CSV)"
    print(f"deployment {names.deployment} is the default of {uri}")
    print(f"score data: az ml batch-endpoint invoke -n {names.endpoint} --input PATH --input-type {kind}")
    return uri


def main(args: list[str] | None = None) -> None:
    """Every mistake is one line on stderr and exit 1."""
    run_command({"online": online, "batch": batch}, "scripts.deploy", (DeployError, SubmitError), args)


if __name__ == "__main__":
    main()
