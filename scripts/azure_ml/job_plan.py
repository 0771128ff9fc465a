"""A job's plan: what it runs (the `scripts.train fit` command line), on which image, how its processes are started,
its inputs and limits, all decided and checked before azure.ai.ml is imported, so that a mistake is one line at once.
scripts/azure_ml/jobs.py builds the SDK's job from it; scripts/azure_ml/pipelines.py the pipeline's train step.

    python -m scripts.submit configs/mnist.yaml --compute gpu-cluster --nodes 2 --processes_per_node 4 --dry_run true
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from scripts.azure_ml.code_snapshot import is_uploaded
from scripts.azure_ml.errors import SubmitError
from scripts.azure_ml.images import BASE_IMAGE, HOROVOD_DOCKERFILE, HOROVOD_GPU_DOCKERFILE
from scripts.azure_ml.job_configs import (
    GPU_ACCELERATORS,
    accelerator_of,
    dataloader_workers,
    launch_first,
    trainer_setting,
)
from scripts.azure_ml.job_inputs import JobInput, left_out_file, parse_input
from scripts.azure_ml.option_values import TIERS, parse_duration, parse_reference, shm_size_of

# Presets that choose how processes are spread: submit adds them itself, from --nodes and --distribution.
LAUNCH_PRESETS = {"configs/trainer/ddp.yaml", "configs/trainer/ddp_mpi.yaml"}
# Trainer options that submit sets from its own: in --train_args they would disagree with the processes started.
LAUNCH_OPTIONS = {
    "devices": "--processes_per_node",
    "num_nodes": "--nodes",
    "strategy": "--distribution (or --presets+ a preset)",
}
PRESETS = {"pytorch": "configs/trainer/ddp.yaml", "mpi": "configs/trainer/ddp_mpi.yaml"}


@dataclass
class Plan:
    """What the job runs, decided and checked before azure.ai.ml is imported (a mistake costs no import of the SDK)."""

    command: str
    configs: list[str]
    horovod: bool
    gpu: bool
    launch: str | None  # None: one process; else "pytorch" or "mpi"
    shape: str
    inputs: list[JobInput]
    environment: str | None = None  # a registered environment, azureml:NAME:VERSION
    tier: str | None = None
    timeout_s: int | None = None
    shm_size: str | None = None


def plan_job(
    configs: list[str],
    nodes: int = 1,
    processes_per_node: int = 1,
    distribution: str = "pytorch",
    inputs: list[str] | None = None,
    train_args: str = "",
    image: str = BASE_IMAGE,
    checkpoints: bool = True,
    environment: str | None = None,
    tier: str | None = None,
    timeout: str | int | None = None,
    shm_size: str | None = None,
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
        if not is_uploaded(Path.cwd(), path):  # e.g. a run's outputs/.../config.yaml: the job would have no such file
            raise SubmitError(
                f"{path}: the job's code (this folder, less .amlignore's outputs/, data/, ...) leaves it out, so its "
                "processes would not find it; copy it under configs/, e.g. configs/my_task.yaml"
            )
    for path in configs[1:]:
        if Path(path).as_posix() in LAUNCH_PRESETS:
            raise SubmitError(
                f"--presets {path}: submit adds it itself; give --nodes, --processes_per_node and --distribution"
            )
    configs = launch_first(configs)
    try:
        options = shlex.split(train_args)  # the job's shell reads it so
    except ValueError as error:
        raise SubmitError(
            f"--train_args {train_args}: not a command line ({str(error).lower()}); close each quote it opens"
        ) from None
    for option in options:
        key = option.removeprefix("--trainer.").split("=", 1)[0]
        if option.startswith("--trainer.") and key in LAUNCH_OPTIONS:
            raise SubmitError(f"--train_args {option}: the job's processes decide it; give {LAUNCH_OPTIONS[key]}")
    for index, token in enumerate(options):  # e.g. --ckpt_path outputs/<exp>/<run>/checkpoints/last.ckpt
        option, equals, value = token.partition("=")
        value = value if equals else next(iter(options[index + 1 : index + 2]), "")
        if option.startswith("--") and left_out_file(value):
            raise SubmitError(
                f"--train_args {option} {value}: a file here that the job's code leaves out (.amlignore's outputs/, "
                f"data/, *.ckpt, ...), so its processes would not find it; give it as an input: --inputs+ "
                f"{option.removeprefix('--')}={value}"
            )
    if nodes < 1 or processes_per_node < 1:
        raise SubmitError(f"--nodes {nodes} --processes_per_node {processes_per_node}: both must be 1 or more")
    if tier is not None and tier not in TIERS:
        raise SubmitError(f"--tier {tier!r}: give {' or '.join(TIERS)}")
    if environment is not None:
        if image != BASE_IMAGE:
            raise SubmitError("--image and --environment: a registered environment has its image; give one of them")
        environment = parse_reference(environment, "--environment", "azureml:lightning-training:1")
    timeout_s = None if timeout is None else parse_duration(str(timeout))
    shm = shm_size_of(shm_size, dataloader_workers(configs, train_args), processes_per_node)
    several = nodes * processes_per_node > 1
    horovod = "horovod" in str(trainer_setting(configs, "strategy")).lower()
    gpu = accelerator_of(configs, train_args) in GPU_ACCELERATORS
    if horovod:
        if several and distribution != "mpi":
            raise SubmitError("Horovod's processes are started by mpirun: add --distribution mpi")
        if image != BASE_IMAGE or environment:
            dockerfile = HOROVOD_GPU_DOCKERFILE if gpu else HOROVOD_DOCKERFILE
            option = "--image" if image != BASE_IMAGE else "--environment"
            raise SubmitError(f"{option}: Horovod jobs run on the image {dockerfile} builds; edit its FROM")
    parts = ["python -m scripts.train fit", *(f"--config {shlex.quote(path)}" for path in configs)]  # a shell reads it
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
        parts.append(f"--{job_input.option} {job_input.value(f'${{{{inputs.{job_input.name}}}}}')}")
    if train_args:
        parts.append(train_args)
    return Plan(" ".join(parts), configs, horovod, gpu, launch, shape, job_inputs, environment, tier, timeout_s, shm)
