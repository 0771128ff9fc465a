"""Run any training config as an Azure ML command job: the same `python -m scripts.train fit` line, on a cluster.

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster
    python -m scripts.submit configs/mnist.yaml --presets+ configs/trainer/gpu.yaml --compute gpu-cluster --nodes 2 \\
        --processes_per_node 4 --inputs+ data.init_args.data_dir=azureml:mnist:1 --train_args "--trainer.max_epochs 5"
    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --dry_run true  # print the job's YAML

The job uploads this folder (less `.amlignore`), builds `environment.yml` on an Azure ML Open MPI image
and runs `python -m scripts.train fit --config TASK [--config PRESET ...]` in every process. Azure ML
hands the job's MLflow run over (MLFLOW_TRACKING_URI, MLFLOW_RUN_ID), so metrics, config and checkpoints
land in the job; ./outputs is uploaded too. Several processes add configs/trainer/ddp.yaml with
distribution `pytorch` (Azure ML starts one process per device with torch.distributed's variables) or
configs/trainer/ddp_mpi.yaml with `mpi` (mpirun), and the devices and nodes to match. A Horovod config
(configs/trainer/horovod.yaml) runs under `mpi` on the image strategies/horovod.Dockerfile builds. The YAML of
`--dry_run` also runs as `az ml job create -f`. The workspace is config.json (the studio's "Download
config file", found here or above) unless --subscription_id, --resource_group and --workspace name it.
Needs azure-ai-ml (pyproject's `azure` extra, which `make install` installs).
"""

from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path
from typing import Literal

import yaml

BASE_IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest"  # Open MPI for `mpi`; pip's torch brings CUDA
PRESETS = {"pytorch": "configs/trainer/ddp.yaml", "mpi": "configs/trainer/ddp_mpi.yaml"}
DEFAULT_EXPERIMENT = "lightning-template"  # scripts.train's default logger's
HOROVOD_DOCKERFILE = Path("strategies/horovod.Dockerfile")
HOROVOD_CONTEXT = Path("outputs/horovod-image")  # the Dockerfile and the files it COPYs, what Azure ML builds from


class SubmitError(Exception):
    """A bad config path, option or workspace; the message names it and what to give instead."""


def trainer_setting(configs: list[str], key: str) -> object:
    """What the configs set `trainer.<key>` to (the last config that sets it wins), or None."""
    value = None
    for path in configs:
        trainer = (yaml.safe_load(Path(path).read_text()) or {}).get("trainer") or {}
        value = trainer.get(key, value)
    return value


def experiment_of(configs: list[str]) -> str:
    """The MLflow experiment the configs' logger names."""
    logger = trainer_setting(configs, "logger")
    if isinstance(logger, dict):
        return (logger.get("init_args") or {}).get("experiment_name", DEFAULT_EXPERIMENT)
    return DEFAULT_EXPERIMENT


def horovod_build_context() -> Path:
    """HOROVOD_CONTEXT, made a Docker build context: HOROVOD_DOCKERFILE (as Dockerfile) and the files of this
    folder it COPYs, at their paths.

    Azure ML builds an environment again whenever its context changes: with the whole repository as the
    context, every code change would rebuild the conda environment and Horovod (tens of minutes)."""
    folder = HOROVOD_CONTEXT
    shutil.rmtree(folder, ignore_errors=True)
    for line in HOROVOD_DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                (folder / source).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, folder / source)
    shutil.copy(HOROVOD_DOCKERFILE, folder / "Dockerfile")
    return folder


def build_job(
    configs: list[str],
    compute: str,
    nodes: int = 1,
    processes_per_node: int = 1,
    distribution: Literal["pytorch", "mpi"] = "pytorch",
    inputs: list[str] | None = None,
    train_args: str = "",
    experiment: str | None = None,
    image: str = BASE_IMAGE,
):
    """The azure.ai.ml command job that runs `scripts.train fit` on `configs`; see `submit` for the arguments."""
    from azure.ai.ml import Input, MpiDistribution, PyTorchDistribution, command
    from azure.ai.ml.entities import BuildContext, Environment

    if not Path("environment.yml").is_file():
        raise SubmitError("environment.yml is not in this folder: run from the repository's root (the job's code)")
    for path in configs:
        if Path(path).is_absolute() or not Path(path).is_file():
            raise SubmitError(f"{path}: no such config in this folder; give a path like configs/penguins.yaml")
    if nodes < 1 or processes_per_node < 1:
        raise SubmitError(f"--nodes {nodes} --processes_per_node {processes_per_node}: both must be 1 or more")
    several = nodes * processes_per_node > 1
    environment = Environment(image=image, conda_file="environment.yml")
    horovod = "horovod" in str(trainer_setting(configs, "strategy")).lower()
    if horovod:
        if str(trainer_setting(configs, "accelerator")) in ("gpu", "cuda"):
            raise SubmitError(f"Horovod's image ({HOROVOD_DOCKERFILE}) is built for CPUs; on GPUs use DDP instead")
        if several and distribution != "mpi":
            raise SubmitError("Horovod's processes are started by mpirun: add --distribution mpi")
        if image != BASE_IMAGE:
            raise SubmitError(f"--image: Horovod jobs run on the image {HOROVOD_DOCKERFILE} builds; edit its FROM")
        environment = Environment(build=BuildContext(path=str(horovod_build_context()), dockerfile_path="Dockerfile"))
    parts = ["python -m scripts.train fit", *(f"--config {path}" for path in configs)]
    launch, shape = None, "1 process"
    if several:
        if not horovod:  # the configs' Horovod strategy joins mpirun's processes itself
            parts.append(f"--config {PRESETS[distribution]}")
        parts += [f"--trainer.devices {processes_per_node}", f"--trainer.num_nodes {nodes}"]
        launch = (PyTorchDistribution if distribution == "pytorch" else MpiDistribution)(
            process_count_per_instance=processes_per_node
        )
        shape = f"{nodes} x {processes_per_node} {distribution}"
    job_inputs = {}
    for item in inputs or []:
        option, _, path = item.partition("=")
        if not option or not path or option.startswith("-"):
            raise SubmitError(f"--inputs {item}: give OPTION=PATH, e.g. data.init_args.data_dir=azureml:mnist:1")
        name = option.rsplit(".", 1)[-1]  # data.init_args.data_dir -> ${{inputs.data_dir}}
        if name in job_inputs:
            raise SubmitError(f"--inputs {item}: another input also ends in .{name}; give one per name")
        if is_local(path):  # uploaded with the job
            if not Path(path).exists():
                raise SubmitError(f"--inputs {item}: no such file or folder {path}")
            path = str(Path(path).resolve())
        kind = "uri_file" if Path(path.rstrip("/")).suffix else "uri_folder"  # mounted read-only either way
        job_inputs[name] = Input(type=kind, path=path)
        parts.append(f"--{option} ${{{{inputs.{name}}}}}")
    if train_args:
        parts.append(train_args)
    tasks = ", ".join(Path(path).stem for path in configs)
    return command(
        code=".",
        command=" ".join(parts),
        environment=environment,
        compute=compute,
        instance_count=nodes,
        distribution=launch,
        inputs=job_inputs or None,
        experiment_name=experiment or experiment_of(configs),
        display_name=f"{tasks}: fit, {shape}",
    )


def is_local(path: str) -> bool:
    return "://" not in path and not path.startswith("azureml:")


def job_yaml(job) -> str:
    """The job as `az ml job create -f` takes it."""
    text = io.StringIO()
    job._to_job().dump(text)  # the job itself, not the node wrapping it in a component
    data = yaml.safe_load(text.getvalue())
    for name, given in (job.inputs or {}).items():
        if is_local(given.path):  # the SDK's dump writes a local path as an asset name: "azureml:/home/..."
            data["inputs"][name]["path"] = given.path
    return yaml.safe_dump(data, sort_keys=False)


def workspace_client(subscription_id: str | None, resource_group: str | None, workspace: str | None):
    from azure.ai.ml import MLClient
    from azure.identity import DefaultAzureCredential

    credential = DefaultAzureCredential()
    if subscription_id and resource_group and workspace:
        return MLClient(credential, subscription_id, resource_group, workspace)
    if subscription_id or resource_group or workspace:
        raise SubmitError("name the workspace with all three of --subscription_id --resource_group --workspace")
    try:
        return MLClient.from_config(credential)
    except Exception:  # the SDK raises its ValidationException when no config.json is found
        raise SubmitError(
            "no Azure ML workspace: put its config.json (the studio's 'Download config file') in this folder, "
            "or give --subscription_id --resource_group --workspace"
        ) from None


def submit(
    task: str,
    compute: str = "",
    presets: list[str] | None = None,
    nodes: int = 1,
    processes_per_node: int = 1,
    distribution: Literal["pytorch", "mpi"] = "pytorch",
    inputs: list[str] | None = None,
    train_args: str = "",
    experiment: str | None = None,
    image: str = BASE_IMAGE,
    dry_run: bool = False,
    subscription_id: str | None = None,
    resource_group: str | None = None,
    workspace: str | None = None,
) -> str:
    """Builds the job and submits it (or prints its YAML); returns the job's name (or the YAML).

    Args:
        task: the task's config, e.g. configs/mnist.yaml.
        compute: the Azure ML compute cluster's name.
        presets: configs added after it, in order, e.g. configs/trainer/gpu.yaml.
        nodes: machines (instance_count); with processes_per_node > 1 or nodes > 1 the job runs DDP.
        processes_per_node: processes on each machine, one per GPU (process_count_per_instance).
        distribution: how Azure ML starts the processes: `pytorch` (torch.distributed's variables) or `mpi`.
        inputs: OPTION=PATH pairs: the data at PATH (a local path, uploaded; a datastore URI; azureml:NAME:VERSION)
            is mounted in the job and its mount point given as --OPTION. PATH with a suffix is a file, else a folder.
        train_args: more `scripts.train` options, e.g. "--trainer.max_epochs 5".
        experiment: the Azure ML experiment; default: the configs' logger's experiment_name.
        image: the Docker base image environment.yml is built on.
        dry_run: print the job's YAML (what `az ml job create -f` takes) instead of submitting.
        subscription_id, resource_group, workspace: the workspace, when there is no config.json.
    """
    if not compute:
        raise SubmitError("give the compute cluster to run on: --compute NAME")
    configs = [task, *(presets or [])]
    job = build_job(configs, compute, nodes, processes_per_node, distribution, inputs, train_args, experiment, image)
    if dry_run:
        text = job_yaml(job)
        print(text, end="")
        return text
    client = workspace_client(subscription_id, resource_group, workspace)
    submitted = client.jobs.create_or_update(job)
    print(f"submitted {submitted.name}: {submitted.studio_url}")
    return submitted.name


def main(args: list[str] | None = None) -> None:
    """A bad config path, option or workspace ends in one line on stderr and exit status 1."""
    import logging

    from jsonargparse import auto_cli

    # azure-ai-ml warns of its own experimental schema classes when it writes a job: nothing a user can act on.
    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)
    try:
        auto_cli(submit, args=args, as_positional=True)
    except SubmitError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
