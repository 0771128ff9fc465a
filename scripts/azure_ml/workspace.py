"""Where an Azure ML job goes: the workspace (its ids, the client, the line for a missing login) and the compute (a
cluster's name, or serverless compute on a VM size that fits the configs), checked before the SDK is imported."""

from __future__ import annotations

import re

from scripts.azure_ml.errors import SubmitError

# Serverless compute: no cluster; Azure ML's documented way is a job with no compute, its VM size (if any) in resources.
SERVERLESS = "serverless"
# A compute's name (no space, '/' or ':', which would make another resource's ARM id), or its ARM id.
COMPUTE_NAME = re.compile(r"(/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.MachineLearningServices"
                          r"/workspaces/[^/]+/computes/)?[A-Za-z0-9][\w-]*", re.IGNORECASE)  # fmt: skip
VM_SIZE = re.compile(r"Standard_\w+")
GPU_SIZE = re.compile(r"Standard_N", re.IGNORECASE)  # Azure's N-series (NC, ND, NG, NV): the VM sizes with GPUs


def compute_name(compute: str, instead: str = " or serverless") -> str:
    """--compute as the SDK takes it: a compute's name or ARM id, without the `azureml:` of Azure ML's YAML (the SDK
    would send it as part of the name)."""
    name = compute.removeprefix("azureml:")
    if not COMPUTE_NAME.fullmatch(name):
        raise SubmitError(
            f"--compute {compute!r}: not a compute's name; give a cluster's name (letters, digits and hyphens, e.g. "
            f"cpu-cluster){instead}"
        )
    return name


def check_compute(compute: str, instance_type: str | None, configs: list[str], gpu: bool) -> str | None:
    """The job's compute as the SDK takes it: the cluster's name, or None for serverless compute (which then runs on
    instance_type's VM size, or one Azure ML picks: a CPU one)."""
    name = compute_name(compute)
    if name.lower() == "local":  # azure-ai-ml's local runs fail for command jobs (Azure/azure-sdk-for-python#37867)
        raise SubmitError(
            f"--compute {compute}: Azure ML's local runs are not supported for these jobs; to train on this machine "
            f"run python -m scripts.train fit --config {configs[0]}, or give a compute cluster's name or serverless"
        )
    serverless = name.lower() == SERVERLESS
    if instance_type is not None:
        if not serverless:
            raise SubmitError(
                f"--instance_type {instance_type}: the VM size of serverless compute; the cluster {name} has its "
                "own: leave it out, or give --compute serverless"
            )
        if not VM_SIZE.fullmatch(instance_type):
            raise SubmitError(f"--instance_type {instance_type!r}: give an Azure VM size such as Standard_DS3_v2")
    if serverless and gpu and not GPU_SIZE.match(instance_type or ""):
        given = f"--instance_type {instance_type} is a CPU size" if instance_type else "serverless picks a CPU VM"
        raise SubmitError(
            f"--compute serverless: the configs run on GPUs and {given}; give --instance_type a GPU size, e.g. "
            "Standard_NC4as_T4_v3"
        )
    return None if serverless else name


def check_workspace_ids(subscription_id: str | None, resource_group: str | None, workspace: str | None) -> None:
    if (subscription_id or resource_group or workspace) and not (subscription_id and resource_group and workspace):
        raise SubmitError("name the workspace with all three of --subscription_id --resource_group --workspace")


def workspace_client(subscription_id: str | None, resource_group: str | None, workspace: str | None):
    check_workspace_ids(subscription_id, resource_group, workspace)
    import logging

    from azure.ai.ml import MLClient
    from azure.identity import DefaultAzureCredential

    # Without a login DefaultAzureCredential logs each credential it tried (14 lines) before it raises; the caller's
    # ClientAuthenticationError is one line saying to sign in, and the managed identity's try of the cloud metadata
    # address (the way an Azure VM signs in) says nothing to anyone not on one.
    logging.getLogger("azure.identity").setLevel(logging.CRITICAL)
    credential = DefaultAzureCredential()
    if subscription_id and resource_group and workspace:
        return MLClient(credential, subscription_id, resource_group, workspace)
    try:
        return MLClient.from_config(credential)
    except Exception:  # the SDK raises its ValidationException when no config.json is found
        raise SubmitError(
            "no Azure ML workspace: put its config.json (the studio's 'Download config file') in this folder, "
            "or give --subscription_id --resource_group --workspace"
        ) from None


def not_signed_in(again: str) -> str:
    """The one line for a missing Azure login; `again` is the command's verb (submit, deploy, register)."""
    return (
        "not signed in to Azure: run `az login` (or set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET "
        f"for a service principal), then {again} again"
    )
