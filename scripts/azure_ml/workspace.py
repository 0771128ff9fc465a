"""Where an Azure ML job goes: the workspace (its ids, the client, the line for a missing login) and the compute (a
cluster's name, or serverless compute on a VM size that fits the configs), checked before the SDK is imported; then,
once the client is there, the node count against the cluster's maximum."""

from __future__ import annotations

import json
import re
from pathlib import Path

from scripts.azure_ml.errors import SubmitError, service_line

# Serverless compute: no cluster; Azure ML's documented way is a job with no compute, its VM size (if any) in resources.
SERVERLESS = "serverless"
# A compute's name (no space, '/' or ':', which would make another resource's ARM id), or its ARM id.
COMPUTE_NAME = re.compile(r"(/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.MachineLearningServices"
                          r"/workspaces/[^/]+/computes/)?[A-Za-z0-9][\w-]*", re.IGNORECASE)  # fmt: skip
VM_SIZE = re.compile(r"Standard_\w+")
GPU_SIZE = re.compile(r"Standard_N", re.IGNORECASE)  # Azure's N-series (NC, ND, NG, NV): the VM sizes with GPUs
# A workspace's ids as Azure takes them (Azure Resource Manager's naming rules; the workspace's name as Azure ML's REST
# API checks it), by config.json's key: its option, the rule, and the rule in words. A mistyped one would otherwise
# reach Azure, after the code's upload, as an error of the request.
WORKSPACE_IDS = {
    "subscription_id": ("--subscription_id", re.compile(r"[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}"),
                        "a GUID, 8-4-4-4-12 hexadecimal digits"),
    "resource_group": ("--resource_group", re.compile(r"[-\w.()]{0,89}[-\w()]"),  # \w: any letter or digit, and '_'
                       "1-90 letters, digits, '_', '-', '.', '(' and ')', not ending in '.'"),
    "workspace_name": ("--workspace", re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{2,32}"),
                       "3-33 letters, digits, '_' and '-', starting with a letter or digit"),
}  # fmt: skip
# Where MLClient.from_config looks for the workspace's file, in this order, each in this folder and the 20 above it.
CONFIG_FOLDERS, CONFIG_NAMES, CONFIG_LEVELS = (".azureml", "aml_config", ""), ("config.json", "project.json"), 20
FROM_THE_STUDIO = (
    "download the workspace's config.json again (the studio's 'Download config file'), or give --subscription_id "
    "--resource_group --workspace"
)


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


def check_cluster_size(client, compute: str | None, nodes: int, option: str = "--nodes", again: str = "submit") -> None:
    """`nodes` within the maximum of the cluster `compute` (a name or ARM id), read from the workspace: Azure ML takes
    a job of more nodes than its cluster scales to, and it waits for them for good. Serverless compute (None) has no
    cluster to ask; a cluster the workspace lacks is left to Azure ML's own refusal, as before; `again` is the
    command's verb for the line on a missing login."""
    if compute is None or compute.lower() == SERVERLESS:
        return
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError

    name = compute.rsplit("/", 1)[-1]
    try:
        cluster = client.compute.get(name)
    except ResourceNotFoundError:
        return
    except ClientAuthenticationError:
        raise SubmitError(not_signed_in(again)) from None
    except HttpResponseError as error:
        message = service_line(error)
        raise SubmitError(f"Azure ML refused to read the compute {name}: {message}") from None
    most = getattr(cluster, "max_instances", None)  # an AmlCompute's; a compute instance or Kubernetes has none
    if most is not None and nodes > most:
        fewer = f"give {most} or fewer, or " if most else ""
        raise SubmitError(
            f"{option} {nodes}: the cluster {name} scales to at most {most} nodes; {fewer}raise its maximum (az ml "
            f"compute update --name {name} --max-instances {nodes})"
        )


def check_workspace_ids(subscription_id: str | None, resource_group: str | None, workspace: str | None,
                        contacted: bool = False) -> None:  # fmt: skip
    """The workspace's ids given as options: all three or none, each as Azure takes it; when the command goes on to
    contact the workspace without them (`contacted`), the config file it would read, if one is there, before the job
    or assets are built."""
    if (subscription_id or resource_group or workspace) and not (subscription_id and resource_group and workspace):
        raise SubmitError("name the workspace with all three of --subscription_id --resource_group --workspace")
    given = {"subscription_id": subscription_id, "resource_group": resource_group, "workspace_name": workspace}
    for key, value in given.items() if workspace else ():
        option, rule, words = WORKSPACE_IDS[key]
        if not rule.fullmatch(value):
            raise SubmitError(
                f"{option} {value!r}: Azure takes {words}; give the workspace's, as its config.json (the studio's "
                "'Download config file') has it"
            )
    if contacted and not workspace and (found := config_file(Path.cwd())) is not None:
        check_config_file(found)


def config_file(start: Path) -> Path | None:
    """The workspace's config file MLClient.from_config reads from `start`, or None."""
    folders = [start, *start.parents][: CONFIG_LEVELS + 1]
    for subfolder in CONFIG_FOLDERS:
        for name in CONFIG_NAMES:
            for folder in folders:
                if (folder / subfolder / name).is_file():
                    return folder / subfolder / name
    return None


def check_config_file(path: Path) -> None:
    """The workspace's config file, read as MLClient.from_config reads it: JSON with the three ids (or an ARM `Scope`
    naming them), each as Azure takes it."""
    try:
        config = json.loads(path.read_text())
    except OSError as error:
        raise SubmitError(f"{path}: cannot read it ({error.strerror}); {FROM_THE_STUDIO}") from None
    except ValueError as error:  # not JSON, or not text
        why = f" ({error.msg} at line {error.lineno})" if isinstance(error, json.JSONDecodeError) else ""
        raise SubmitError(f"{path}: not JSON{why}; {FROM_THE_STUDIO}") from None
    if isinstance(config, dict) and config.get("Scope"):  # /subscriptions/S/resourceGroups/R/providers/.../workspaces/W
        parts = [*str(config["Scope"]).split("/"), *[None] * 9]
        config = {"subscription_id": parts[2], "resource_group": parts[4], "workspace_name": parts[8]}
    missing = [key for key in WORKSPACE_IDS if not isinstance(config, dict) or config.get(key) is None]
    if missing:
        raise SubmitError(f"{path}: no {', '.join(missing)} in it; {FROM_THE_STUDIO}")
    for key, (_, rule, words) in WORKSPACE_IDS.items():
        if not (isinstance(config[key], str) and rule.fullmatch(config[key])):
            raise SubmitError(f"{path}: {key} {config[key]!r}: Azure takes {words}; {FROM_THE_STUDIO}")


def workspace_client(subscription_id: str | None, resource_group: str | None, workspace: str | None):
    """The MLClient of the workspace the options name, else of its config file (found here or above); its ids are
    checked before any request."""
    check_workspace_ids(subscription_id, resource_group, workspace)
    found = None if workspace else config_file(Path.cwd())
    if found is not None:
        check_config_file(found)
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
        return MLClient.from_config(credential, path=found)
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
