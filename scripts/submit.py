"""Run any training config as an Azure ML command job: the same `python -m scripts.train fit` line, on a cluster.

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster
    python -m scripts.submit configs/mnist.yaml --presets+ configs/trainer/gpu.yaml --compute gpu-cluster --nodes 2 \\
        --processes_per_node 4 --inputs+ data.init_args.data_dir=azureml:mnist:1 --train_args "--trainer.max_epochs 5"
    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --dry_run true  # print the job's YAML
    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --stream true  # follow it to its end

Every check of the arguments runs before the Azure SDK is imported; each mistake is one line. The job uploads this
folder (less `.amlignore`), builds `environment.yml` on Azure ML's Open MPI image (its CUDA one with InfiniBand for
configs that run on GPUs) and runs `python -m scripts.train fit --config TASK [--config PRESET ...]` in every
process. Azure ML hands the job's MLflow run over (MLFLOW_TRACKING_URI, MLFLOW_RUN_ID), so metrics, config and
checkpoints land in the job; ./outputs is uploaded too. Checkpoints go to the job output `checkpoints`, mounted
read-write: a job on low-priority nodes that Azure ML preempts and restarts resumes from its last.ckpt
(scripts/checkpoints.py). Several processes add configs/trainer/ddp.yaml with
distribution `pytorch` (Azure ML starts one process per device with torch.distributed's variables) or
configs/trainer/ddp_mpi.yaml with `mpi` (mpirun), and the devices and nodes to match. A Horovod config
(configs/trainer/horovod.yaml) runs under `mpi` on the image strategies/horovod.Dockerfile builds. The YAML of
`--dry_run` also runs as `az ml job create -f`. The workspace is config.json (the studio's "Download
config file", found here or above) unless --subscription_id, --resource_group and --workspace name it.
Needs azure-ai-ml (pyproject's `azure` extra, which `make install` installs).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

BASE_IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest"  # Open MPI: the mpirun of `mpi` jobs
# GPU jobs: Azure ML's Open MPI image on CUDA with the InfiniBand user space (libibverbs) and Mellanox's NCCL RDMA/SHARP
# plugin on LD_LIBRARY_PATH, so NCCL between ND-series nodes goes over InfiniBand instead of TCP. torch from PyPI
# brings its own CUDA 13 runtime and NCCL (the image's CUDA 11.8 toolkit is not used): the node needs an NVIDIA driver
# R580 or newer and a GPU of compute capability 7.5 or more (T4, A10, A100, H100; not V100, see the README).
GPU_IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04:latest"
GPU_ACCELERATORS = ("gpu", "cuda")
# Presets that choose how processes are spread: submit adds them itself, from --nodes and --distribution.
LAUNCH_PRESETS = {"configs/trainer/ddp.yaml", "configs/trainer/ddp_mpi.yaml"}
# Trainer options that submit sets from its own: in --train_args they would disagree with the processes started.
LAUNCH_OPTIONS = {
    "devices": "--processes_per_node",
    "num_nodes": "--nodes",
    "strategy": "--distribution (or --presets+ a preset)",
}
INPUT_TYPES = ("uri_folder", "uri_file")
INPUT_MODES = ("ro_mount", "download", "direct", "eval_mount", "eval_download")
PRESETS = {"pytorch": "configs/trainer/ddp.yaml", "mpi": "configs/trainer/ddp_mpi.yaml"}
DEFAULT_EXPERIMENT = "lightning-template"  # scripts.train's default logger's
HOROVOD_DOCKERFILE = Path("strategies/horovod.Dockerfile")
HOROVOD_GPU_DOCKERFILE = Path("strategies/horovod_gpu.Dockerfile")  # Horovod with CUDA and NCCL, on GPU_IMAGE
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


def horovod_build_context(gpu: bool = False) -> Path:
    """HOROVOD_CONTEXT (-gpu), made a Docker build context: the Horovod Dockerfile (as Dockerfile) and the files of
    this folder it COPYs, at their paths.

    Azure ML builds an environment again whenever its context changes: with the whole repository as the
    context, every code change would rebuild the conda environment and Horovod (tens of minutes)."""
    dockerfile = HOROVOD_GPU_DOCKERFILE if gpu else HOROVOD_DOCKERFILE
    folder = HOROVOD_CONTEXT.with_name(HOROVOD_CONTEXT.name + ("-gpu" if gpu else ""))
    shutil.rmtree(folder, ignore_errors=True)
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                (folder / source).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, folder / source)
    shutil.copy(dockerfile, folder / "Dockerfile")
    return folder


@dataclass
class JobInput:
    option: str  # the scripts.train option it is given as, e.g. data.init_args.data_dir
    path: str
    type: str
    mode: str

    @property
    def name(self) -> str:
        return self.option.rsplit(".", 1)[-1]  # data.init_args.data_dir -> ${{inputs.data_dir}}


def parse_input(item: str) -> JobInput:
    """OPTION=PATH[,type=uri_folder|uri_file][,mode=ro_mount|download|...]: the type of a local path is what it is on
    disk; anything else (a data asset azureml:NAME:VERSION, a datastore or https URI) is a folder unless given."""
    option, _, rest = item.partition("=")
    path, *settings = rest.split(",")
    if not option or not path or option.startswith("-"):
        raise SubmitError(f"--inputs {item}: give OPTION=PATH, e.g. data.init_args.data_dir=azureml:mnist:1")
    given = {}
    for setting in settings:
        key, _, value = setting.partition("=")
        allowed = {"type": INPUT_TYPES, "mode": INPUT_MODES}.get(key)
        if allowed is None or value not in allowed:
            raise SubmitError(
                f"--inputs {item}: {setting!r} is not type=({'|'.join(INPUT_TYPES)}) or mode=({'|'.join(INPUT_MODES)})"
            )
        given[key] = value
    kind = given.get("type", "uri_folder")
    if is_local(path):  # uploaded with the job
        if not Path(path).exists():
            raise SubmitError(f"--inputs {item}: no such file or folder {path}")
        kind = "uri_file" if Path(path).is_file() else "uri_folder"
        if given.get("type", kind) != kind:
            raise SubmitError(f"--inputs {item}: {path} is a {'file' if Path(path).is_file() else 'folder'}")
        path = str(Path(path).resolve())
    return JobInput(option, path, kind, given.get("mode", "ro_mount"))


@dataclass
class Plan:
    """What the job runs, decided and checked before azure.ai.ml is imported (a mistake costs no 4 s import)."""

    command: str
    configs: list[str]
    horovod: bool
    gpu: bool
    launch: str | None  # None: one process; else "pytorch" or "mpi"
    shape: str
    inputs: list[JobInput]


def plan_job(
    configs: list[str],
    nodes: int = 1,
    processes_per_node: int = 1,
    distribution: str = "pytorch",
    inputs: list[str] | None = None,
    train_args: str = "",
    image: str = BASE_IMAGE,
    checkpoints: bool = True,
) -> Plan:
    if not Path("environment.yml").is_file():
        raise SubmitError("environment.yml is not in this folder: run from the repository's root (the job's code)")
    for path in configs:
        if Path(path).is_absolute() or not Path(path).is_file():
            raise SubmitError(f"{path}: no such config in this folder; give a path like configs/penguins.yaml")
        try:
            yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as error:
            raise SubmitError(f"{path}: not valid YAML ({getattr(error, 'problem', error)})") from None
    for path in configs[1:]:
        if Path(path).as_posix() in LAUNCH_PRESETS:
            raise SubmitError(
                f"--presets {path}: submit adds it itself; give --nodes, --processes_per_node and --distribution"
            )
    for option in shlex.split(train_args):
        key = option.removeprefix("--trainer.").split("=", 1)[0]
        if option.startswith("--trainer.") and key in LAUNCH_OPTIONS:
            raise SubmitError(f"--train_args {option}: the job's processes decide it; give {LAUNCH_OPTIONS[key]}")
    if nodes < 1 or processes_per_node < 1:
        raise SubmitError(f"--nodes {nodes} --processes_per_node {processes_per_node}: both must be 1 or more")
    several = nodes * processes_per_node > 1
    horovod = "horovod" in str(trainer_setting(configs, "strategy")).lower()
    accelerator = str(trainer_setting(configs, "accelerator"))
    accelerator = dict(re.findall(r"--trainer\.(accelerator)[= ](\S+)", train_args)).get("accelerator", accelerator)
    gpu = accelerator in GPU_ACCELERATORS
    if horovod:
        if several and distribution != "mpi":
            raise SubmitError("Horovod's processes are started by mpirun: add --distribution mpi")
        if image != BASE_IMAGE:
            dockerfile = HOROVOD_GPU_DOCKERFILE if gpu else HOROVOD_DOCKERFILE
            raise SubmitError(f"--image: Horovod jobs run on the image {dockerfile} builds; edit its FROM")
    parts = ["python -m scripts.train fit", *(f"--config {path}" for path in configs)]
    launch, shape = None, "1 process"
    if several:
        if not horovod:  # the configs' Horovod strategy joins mpirun's processes itself
            parts.append(f"--config {PRESETS[distribution]}")
        parts += [f"--trainer.devices {processes_per_node}", f"--trainer.num_nodes {nodes}"]
        launch, shape = distribution, f"{nodes} x {processes_per_node} {distribution}"
    # A job output mounted read-write outlives the node: a job restarted after preemption resumes from it.
    if checkpoints:  # not for a sweep's trials, which would all share it
        parts.append("--checkpoint_dir ${{outputs.checkpoints}}")
    job_inputs = [parse_input(item) for item in inputs or []]
    names: set[str] = set()
    for job_input in job_inputs:
        if job_input.name in names:
            raise SubmitError(
                f"--inputs {job_input.option}={job_input.path}: another input also ends in .{job_input.name}"
            )
        names.add(job_input.name)
        parts.append(f"--{job_input.option} ${{{{inputs.{job_input.name}}}}}")
    if train_args:
        parts.append(train_args)
    return Plan(" ".join(parts), configs, horovod, gpu, launch, shape, job_inputs)


def build_job(
    configs: list[str],
    compute: str,
    nodes: int = 1,
    processes_per_node: int = 1,
    distribution: Literal["pytorch", "mpi"] = "pytorch",
    inputs: list[str] | None = None,
    train_args: str = "",
    experiment: str | None = None,
    image: str | None = None,
    checkpoints: bool = True,
):
    """The azure.ai.ml command job that runs `scripts.train fit` on `configs`; see `submit` for the arguments."""
    plan = plan_job(
        configs, nodes, processes_per_node, distribution, inputs, train_args, image or BASE_IMAGE, checkpoints
    )
    from azure.ai.ml import Input, MpiDistribution, Output, PyTorchDistribution, command
    from azure.ai.ml.entities import BuildContext, Environment

    if plan.horovod:
        context = horovod_build_context(plan.gpu)
        environment = Environment(build=BuildContext(path=str(context), dockerfile_path="Dockerfile"))
    else:
        environment = Environment(image=image or (GPU_IMAGE if plan.gpu else BASE_IMAGE), conda_file="environment.yml")
    launch = None
    if plan.launch:
        launch = (PyTorchDistribution if plan.launch == "pytorch" else MpiDistribution)(
            process_count_per_instance=processes_per_node
        )
    job_inputs = {i.name: Input(type=i.type, path=i.path, mode=i.mode) for i in plan.inputs}
    tasks = ", ".join(Path(path).stem for path in configs)
    return command(
        code=".",
        command=plan.command,
        environment=environment,
        compute=compute,
        instance_count=nodes,
        distribution=launch,
        inputs=job_inputs or None,
        outputs={"checkpoints": Output(type="uri_folder", mode="rw_mount")} if checkpoints else None,
        experiment_name=experiment or experiment_of(configs),
        display_name=f"{tasks}: fit, {plan.shape}",
    )


def is_local(path: str) -> bool:
    return "://" not in path and not path.startswith("azureml:")


def job_yaml(job, folder: Path = Path(".")) -> str:
    """The job as `az ml job create -f` takes it from a file in `folder`: its code path relative to that folder (the
    SDK writes this machine's absolute path), local inputs as the paths they are."""
    text = io.StringIO()
    job._to_job().dump(text)  # the job itself, not the node wrapping it in a component
    data = yaml.safe_load(text.getvalue())
    data["code"] = os.path.relpath(Path.cwd(), folder.resolve())
    for name, given in (job.inputs or {}).items():
        if is_local(given.path):  # the SDK's dump writes a local path as an asset name: "azureml:/home/..."
            data["inputs"][name]["path"] = given.path
    return yaml.safe_dump(data, sort_keys=False)


def check_workspace_ids(subscription_id: str | None, resource_group: str | None, workspace: str | None) -> None:
    if (subscription_id or resource_group or workspace) and not (subscription_id and resource_group and workspace):
        raise SubmitError("name the workspace with all three of --subscription_id --resource_group --workspace")


def workspace_client(subscription_id: str | None, resource_group: str | None, workspace: str | None):
    check_workspace_ids(subscription_id, resource_group, workspace)
    from azure.ai.ml import MLClient
    from azure.identity import DefaultAzureCredential

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


def follow(client, name: str) -> None:
    """Prints the job's logs until it ends; raises SubmitError unless it completed."""
    from azure.ai.ml.exceptions import JobException

    with contextlib.suppress(JobException):  # the SDK's word for a job that ended Failed: its status says it below
        client.jobs.stream(name)
    status = client.jobs.get(name).status
    status = str(getattr(status, "value", status))  # the SDK's JobStatus enum, or a plain string
    if status != "Completed":
        raise SubmitError(f"job {name} ended {status}; its logs are above and in the studio")
    print(f"job {name} completed")


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
    image: str | None = None,
    dry_run: bool = False,
    yaml_file: str | None = None,
    stream: bool = False,
    subscription_id: str | None = None,
    resource_group: str | None = None,
    workspace: str | None = None,
    sweep: str | None = None,
) -> str:
    """Builds the job and submits it (or prints its YAML); returns the job's name (or the YAML).

    Args:
        task: the task's config, e.g. configs/mnist.yaml.
        compute: the Azure ML compute cluster's name.
        presets: configs added after it, in order, e.g. configs/trainer/gpu.yaml (not ddp*.yaml: submit adds those).
        nodes: machines (instance_count); with processes_per_node > 1 or nodes > 1 the job runs DDP.
        processes_per_node: processes on each machine, one per GPU (process_count_per_instance).
        distribution: how Azure ML starts the processes: `pytorch` (torch.distributed's variables) or `mpi`.
        inputs: OPTION=PATH[,type=uri_folder|uri_file][,mode=ro_mount|download|direct|eval_mount|eval_download]:
            the data at PATH (a local path, uploaded; a datastore URI; azureml:NAME:VERSION) is given to the job and
            its path passed as --OPTION. A local path is a file or folder as on disk; anything else a folder unless
            `type=uri_file`; mode ro_mount unless given.
        train_args: more `scripts.train` options, e.g. "--trainer.max_epochs 5" (not devices, num_nodes, strategy).
        experiment: the Azure ML experiment; default: the configs' logger's experiment_name.
        image: the Docker base image environment.yml is built on; default: Azure ML's Open MPI image, its CUDA one
            when the configs run on GPUs.
        dry_run: print the job's YAML instead of submitting; save it at the repository's root (job.yml) and
            `az ml job create -f job.yml` runs it.
        yaml_file: with dry_run, write the YAML to this file instead, its code path relative to the file's folder.
        stream: follow the submitted job's logs and exit with its status (0 when it completed).
        subscription_id, resource_group, workspace: the workspace, when there is no config.json.
        sweep: a sweep file (configs/sweeps/TASK.yaml): submit an Azure ML sweep job over its search space, each
            trial this command with the trial's values (scripts/sweep_azure.py).
    """
    if not compute:
        raise SubmitError("give the compute cluster to run on: --compute NAME")
    if stream and dry_run:
        raise SubmitError("--stream follows a submitted job: leave out --dry_run")
    check_workspace_ids(subscription_id, resource_group, workspace)  # before the SDK import build_job makes
    configs = [task, *(presets or [])]
    as_yaml = job_yaml
    if sweep:
        from scripts.sweep_azure import build_sweep_job, load_for_azure, sweep_yaml, trial_args
        from scripts.sweep_space import SweepError

        try:
            spec = load_for_azure(sweep, configs)
        except SweepError as error:
            raise SubmitError(f"--sweep {error}") from None
        args = " ".join(part for part in (trial_args(spec), train_args) if part)
        trial = build_job(configs, compute, nodes, processes_per_node, distribution, inputs, args, experiment, image,
                          checkpoints=False)  # fmt: skip
        job, as_yaml = build_sweep_job(trial, spec, compute), sweep_yaml
    else:
        job = build_job(
            configs, compute, nodes, processes_per_node, distribution, inputs, train_args, experiment, image
        )
    if dry_run:
        if yaml_file:
            text = as_yaml(job, Path(yaml_file).parent)
            Path(yaml_file).write_text(text)
            print(f"wrote {yaml_file}: az ml job create -f {yaml_file}")
            return text
        text = as_yaml(job)
        print(text, end="")
        return text
    from azure.core.exceptions import ClientAuthenticationError

    from scripts.code_snapshot import code_snapshot

    client = workspace_client(subscription_id, resource_group, workspace)
    try:
        with code_snapshot(Path.cwd()) as code:  # the SDK's own walk of the folder reads .venv's every file
            (job.trial if sweep else job).code = str(code)
            submitted = client.jobs.create_or_update(job)
        print(f"submitted {submitted.name}: {submitted.studio_url}")
        if stream:
            follow(client, submitted.name)
    except ClientAuthenticationError:
        raise SubmitError(
            "not signed in to Azure: run `az login` (or set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET "
            "for a service principal), then submit again"
        ) from None
    return submitted.name


def argument_error_line(text: str) -> str:
    """jsonargparse's many lines about a bad option, as one: the option, the value given, what it takes."""
    key = re.search(r'Parser key "([^"]+)"', text)
    given = re.search(r"Got value: (.*?)(?:\n|$)", text)
    if key and given:
        expected = re.search(r"Expected a (?:typing\.Literal\[(.*?)\]|<class '(\w+)'>)", text)
        wanted = ""
        if expected:
            wanted = f"; give {expected.group(1).replace(chr(39), '') if expected.group(1) else expected.group(2)}"
        return f"--{key.group(1)}: {given.group(1).strip()!r} is not a valid value{wanted}"
    return text.strip().splitlines()[0]


def main(args: list[str] | None = None) -> None:
    """A bad config path, option, workspace or login ends in one line on stderr and exit status 1; so does a job
    followed with --stream that does not complete."""
    import logging

    from jsonargparse import ArgumentError, auto_cli

    # azure-ai-ml warns of its own experimental schema classes when it writes a job: nothing a user can act on.
    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)
    try:
        auto_cli(submit, args=args, as_positional=True, exit_on_error=False)
    except ArgumentError as error:
        sys.exit(f"error: {argument_error_line(str(error))} (python -m scripts.submit --help lists the options)")
    except SubmitError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
