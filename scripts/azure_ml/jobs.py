"""Azure ML command jobs built from training configs, checked before the SDK is imported: the plan (what runs, on
which image, how processes are started), the job itself, its YAML, and its submission (the workspace and compute it
goes to: scripts/azure_ml/workspace.py). scripts.submit runs them; scripts.deploy and scripts/sweeps/azure.py reuse the
images and the launch rules.

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --dry_run true
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from scripts.azure_ml.code_snapshot import is_uploaded
from scripts.azure_ml.errors import SubmitError
from scripts.azure_ml.workspace import GPU_SIZE, check_compute, not_signed_in

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
# Azure ML's rule for experiment names (its service's own message when it refuses one, after the code is uploaded).
EXPERIMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,255}")
# mpirun answers a SIGTERM (Azure ML's at preemption and cancel) with SIGTERM to its processes after this many
# seconds and SIGKILL as many after that; Open MPI's default, 1, kills a fit before it stops at its next batch with
# last.ckpt kept (scripts/training/sigterm.py). Open MPI's own MCA parameter, read from the environment.
MPI_STOP_GRACE = {"OMPI_MCA_odls_base_sigkill_timeout": "10"}
HOROVOD_DOCKERFILE = Path("strategies/horovod.Dockerfile")
HOROVOD_GPU_DOCKERFILE = Path("strategies/horovod_gpu.Dockerfile")  # Horovod with CUDA and NCCL, on GPU_IMAGE
HOROVOD_CONTEXT = Path("outputs/horovod-image")  # the Dockerfile and the files it COPYs, what Azure ML builds from
TIERS = ("spot", "standard")  # Azure ML's queue settings' job tiers a job here takes: preemptible, or not
# --timeout: seconds, or a duration of days, hours, minutes and seconds in that order (90m, 4h, 1h30m, 2d).
DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
SHM_SIZE = re.compile(r"[1-9][0-9]*[bkmg]")  # Docker's --shm-size, as Azure ML takes it
# DataLoader workers hand every batch to their training process through /dev/shm (prefetch_factor batches each), and
# Docker's default /dev/shm (64 MB) ends a fit with a bus error; 1 GB a worker of each process on the node is ample
# for these tasks' batches (birds: 16 x 3 x 224 x 224 float32, 10 MB), 2 GB at least.
SHM_GB_PER_WORKER, SHM_GB_MIN = 1, 2
REFERENCE = re.compile(r"(?:azureml:)?([A-Za-z0-9][A-Za-z0-9_.-]*):([0-9]+)")


def trainer_setting(configs: list[str], key: str) -> object:
    """What the configs set `trainer.<key>` to (the last config that sets it wins), or None."""
    value = None
    for path in configs:
        trainer = (yaml.safe_load(Path(path).read_text()) or {}).get("trainer") or {}
        value = trainer.get(key, value)
    return value


def experiment_of(configs: list[str], train_args: str = "") -> str:
    """The MLflow experiment the configs' logger names, or --train_args's: Azure ML's MLFLOW_EXPERIMENT_NAME, the job's
    experiment, wins over it in the job's processes (scripts/training/cli.py), so the job must be in that one."""
    logger = trainer_setting(configs, "logger")
    name = DEFAULT_EXPERIMENT
    if isinstance(logger, dict):
        name = (logger.get("init_args") or {}).get("experiment_name", DEFAULT_EXPERIMENT)
    given = train_arg(train_args, "--trainer.logger.init_args.experiment_name", "--trainer.logger.experiment_name")
    return given or name


def job_experiment(experiment: str | None, configs: list[str], train_args: str = "") -> str:
    """The job's experiment: --experiment, else the configs' (experiment_of); one Azure ML takes."""
    name = experiment or str(experiment_of(configs, train_args))
    if not EXPERIMENT_NAME.fullmatch(name):
        given = f"--experiment {name!r}" if experiment else f"experiment {name!r} (the configs' logger's)"
        raise SubmitError(
            f"{given}: Azure ML takes 1-256 letters, digits, '_' and '-', starting with a letter or digit; give "
            "--experiment NAME, e.g. penguins-lr"
        )
    return name


def train_arg(train_args: str, *options: str) -> str | None:
    """The value --train_args gives the last of `options` (`--option value` or `--option=value`, read as the job's
    shell reads the command), or None."""
    tokens, found = shlex.split(train_args), None
    for index, token in enumerate(tokens):
        option, equals, value = token.partition("=")
        if option in options:
            found = value if equals else next(iter(tokens[index + 1 : index + 2]), None)
    return found


def accelerator_of(configs: list[str], train_args: str) -> str:
    """trainer.accelerator as the job's processes get it: --train_args's, else the configs' (the last that sets it)."""
    return train_arg(train_args, "--trainer.accelerator") or str(trainer_setting(configs, "accelerator"))


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


def launch_first(configs: list[str]) -> list[str]:
    """The task's config, then the presets that choose how processes are spread (Horovod's), then the others: the
    Horovod preset sets the CPU build's accelerator, and a GPU preset given with it must win in either order (the last
    config that sets a value wins), or the order would decide between a CPU and a GPU job without a word."""
    launch = [path for path in configs[1:] if "horovod" in str(trainer_setting([path], "strategy")).lower()]
    return [configs[0], *launch, *(path for path in configs[1:] if path not in launch)]


def cpu_image_note(
    configs: list[str], train_args: str, compute: str, processes_per_node: int, instance_type: str | None = None
) -> str | None:
    """A line for a job that gets the CPU image because its configs leave the accelerator to Lightning, where GPUs
    look meant (several processes per node, a compute named for GPUs, a serverless GPU size); None otherwise."""
    accelerator = accelerator_of(configs, train_args)
    gpus_meant = "gpu" in compute.lower() or GPU_SIZE.match(instance_type or "")
    if accelerator not in ("None", "auto") or (processes_per_node < 2 and not gpus_meant):
        return None
    return (
        f"note: {configs[0]} leaves trainer.accelerator to Lightning: the job gets the CPU image and "
        f"{processes_per_node} process(es) per node on CPUs; for GPUs add --presets+ configs/trainer/gpu.yaml"
    )


def resolved_config(configs: list[str], train_args: str = "") -> dict:
    """The config scripts.train fit runs with (its --print_config), or SubmitError with its one line. Imports
    Lightning (a few seconds)."""
    from jsonargparse import ArgumentError

    from scripts.training.cli import cli_main
    from scripts.training.cli_errors import config_error_line

    args = ["fit", *(item for config in configs for item in ("--config", config)), *shlex.split(train_args)]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # LightningCLI's note that this process has arguments of its own
            cli_main([*args, "--print_config"])
    except SystemExit as done:
        if done.code not in (0, None):
            raise SubmitError(f"{' '.join(args[1:])}: the training CLI refused it ({done.code})") from None
    except ArgumentError as error:
        raise SubmitError(config_error_line(error, args)) from None
    return yaml.safe_load(printed.getvalue()) or {}


def parse_duration(text: str) -> int:
    """--timeout's seconds: `3600`, or days, hours, minutes, seconds in that order: `90m`, `4h`, `1h30m`, `2d`."""
    plain = str(text).strip().lower()
    found = DURATION.fullmatch(plain + "s" if plain.isdigit() else plain)
    if not plain or found is None:
        raise SubmitError(f"--timeout {text!r}: give seconds (3600) or a duration such as 90m, 4h, 1h30m or 2d")
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total < 1:
        raise SubmitError(f"--timeout {text!r}: give a limit of 1 second or more")
    return total


def parse_reference(text: str, option: str, example: str) -> str:
    """azureml:NAME:VERSION (or NAME:VERSION) of a registered asset, as azureml:NAME:VERSION."""
    found = REFERENCE.fullmatch(text)
    if found is None:
        raise SubmitError(f"{option} {text!r}: give a registered one as azureml:NAME:VERSION, e.g. {example}")
    return f"azureml:{found.group(1)}:{found.group(2)}"


def dataloader_workers(configs: list[str], train_args: str = "") -> int:
    """The DataLoader workers of each process: the configs' data.init_args.num_workers (the last that sets it), or
    --train_args's."""
    workers = 0
    for path in configs:
        data = (yaml.safe_load(Path(path).read_text()) or {}).get("data") or {}
        workers = ((data.get("init_args") or {}) if isinstance(data, dict) else {}).get("num_workers", workers)
    given = train_arg(train_args, "--data.num_workers", "--data.init_args.num_workers")
    return int(given) if given and given.isdigit() else int(workers or 0)


def shm_size_of(given: str | None, workers: int, processes_per_node: int) -> str | None:
    """The container's /dev/shm: as given, else one that follows the DataLoader workers (None: Azure ML's own)."""
    if given is not None:
        if not SHM_SIZE.fullmatch(given):
            raise SubmitError(f"--shm_size {given!r}: give a number and a unit of b, k, m or g, e.g. 8g")
        return given
    if workers < 1:
        return None
    return f"{max(SHM_GB_MIN, SHM_GB_PER_WORKER * workers * processes_per_node)}g"


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
        if kind == "uri_file":
            check_uploaded_name(Path(path), f"--inputs {item}")
        path = str(Path(path).resolve())
    return JobInput(option, path, kind, given.get("mode", "ro_mount"))


def left_out_file(value: str) -> bool:
    """Whether `value` names a file here that the job's code (this folder as Azure ML uploads it) does not hold."""
    try:
        return bool(value) and Path(value).is_file() and not is_uploaded(Path.cwd(), value)
    except (OSError, ValueError):  # not a path at all: a name too long for one, a NUL
        return False


def check_uploaded_name(path: Path, given: str) -> None:
    """A local file uploaded as an input keeps its name, which ends its path in the job; Azure ML writes that path into
    the job's command as it is, and a shell runs it: a name the shell would split or expand does not reach the CLI."""
    if shlex.quote(path.name) != path.name:
        raise SubmitError(
            f"{given}: Azure ML writes the uploaded file's path, {path.name!r} at its end, into the job's command as "
            "it is, where a shell would split it; give a copy whose name has no spaces, quotes or shell characters"
        )


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
        parts.append(f"--{job_input.option} ${{{{inputs.{job_input.name}}}}}")
    if train_args:
        parts.append(train_args)
    return Plan(" ".join(parts), configs, horovod, gpu, launch, shape, job_inputs, environment, tier, timeout_s, shm)


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
    environment: str | None = None,
    tier: str | None = None,
    timeout: str | int | None = None,
    shm_size: str | None = None,
    instance_type: str | None = None,
    checked_args: str | None = None,
):
    """The azure.ai.ml command job that runs `scripts.train fit` on `configs`; see `submit` for the arguments.
    `checked_args`: the user's own --train_args (not a sweep's placeholders), which the training CLI reads here with
    the configs and the inputs' options, as the job's processes would (Lightning's import: a few seconds)."""
    plan = plan_job(configs, nodes, processes_per_node, distribution, inputs, train_args, image or BASE_IMAGE,
                    checkpoints, environment, tier, timeout, shm_size)  # fmt: skip
    target = check_compute(compute, instance_type, plan.configs, plan.gpu)
    experiment = job_experiment(experiment, plan.configs, train_args)
    if checked_args is not None:  # a typo in an option or a config would end the job on Azure, after its image build
        given = [f"--{i.option} {shlex.quote(i.path if is_local(i.path) else f'inputs/{i.name}')}" for i in plan.inputs]
        resolved_config(plan.configs, " ".join([checked_args, *given]))
    from azure.ai.ml import Input, Output, command

    job_inputs = {i.name: Input(type=i.type, path=i.path, mode=i.mode) for i in plan.inputs}
    configs = plan.configs  # in the order the job's command gives them
    tasks = ", ".join(Path(path).stem for path in configs)
    return command(
        code=".",
        command=plan.command,
        environment=job_environment(plan, image),
        compute=target,
        instance_count=nodes,
        instance_type=instance_type,
        distribution=launch_distribution(plan, processes_per_node),
        inputs=job_inputs or None,
        outputs={"checkpoints": Output(type="uri_folder", mode="rw_mount")} if checkpoints else None,
        experiment_name=experiment,
        display_name=f"{tasks}: fit, {plan.shape}",
        environment_variables=launch_variables(plan),
        job_tier=plan.tier,
        timeout=plan.timeout_s,
        shm_size=plan.shm_size,
    )


def job_environment(plan: Plan, image: str | None = None):
    """What the plan's processes run in: its registered environment, Horovod's image, or environment.yml on Azure ML's
    Open MPI image (its CUDA one for GPUs) or `image`. Pipelines give it to every step."""
    from azure.ai.ml.entities import BuildContext, Environment

    if plan.environment:
        return plan.environment  # registered: the job uploads no conda file and builds no image of its own
    if plan.horovod:
        context = horovod_build_context(plan.gpu)
        return Environment(build=BuildContext(path=str(context), dockerfile_path="Dockerfile"))
    return Environment(image=image or (GPU_IMAGE if plan.gpu else BASE_IMAGE), conda_file="environment.yml")


def launch_distribution(plan: Plan, processes_per_node: int):
    """How Azure ML starts the plan's processes: torch.distributed's variables (`pytorch`), mpirun (`mpi`), or None."""
    from azure.ai.ml import MpiDistribution, PyTorchDistribution

    if not plan.launch:
        return None
    return (PyTorchDistribution if plan.launch == "pytorch" else MpiDistribution)(
        process_count_per_instance=processes_per_node
    )


def launch_variables(plan: Plan) -> dict[str, str] | None:
    return dict(MPI_STOP_GRACE) if plan.launch == "mpi" or plan.horovod else None


def is_local(path: str) -> bool:
    return "://" not in path and not path.startswith("azureml:")


def relative_to(folder: Path, data: dict) -> dict:
    """`data` (a job's YAML as a dict) with every local path in it, the code, a build context, a local input,
    relative to `folder`, where the YAML file is: `az ml job create -f` reads them relative to the file, so the YAML
    works from any folder and on any machine with this checkout, not only at this machine's absolute paths."""
    base = folder.resolve()

    def walk(value, key: str = ""):
        if isinstance(value, dict):
            return {name: walk(item, name) for name, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        if key in ("code", "path", "conda_file") and isinstance(value, str) and is_local(value):
            return os.path.relpath(Path(value).resolve(), base)  # resolve(): a relative path is the cwd's
        return value

    return walk(data)


def job_yaml(job, folder: Path = Path(".")) -> str:
    """The job as `az ml job create -f` takes it from a file in `folder`: every local path in it (code, the Horovod
    build context, local inputs) relative to that folder (the SDK writes this machine's absolute paths)."""
    text = io.StringIO()
    job._to_job().dump(text)  # the job itself, not the node wrapping it in a component
    data = yaml.safe_load(text.getvalue())
    data["code"] = str(Path.cwd())
    for name, given in (job.inputs or {}).items():
        if is_local(given.path):  # the SDK's dump writes a local path as an asset name: "azureml:/home/..."
            data["inputs"][name]["path"] = given.path
    return yaml.safe_dump(relative_to(folder, data), sort_keys=False)


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


def check_yaml_file(given: str) -> None:
    """A --yaml_file that can be written: not a folder, no file where a folder of its path must be (the folders that
    do not exist yet are made)."""
    path = Path(given)
    if path.is_dir() or given.endswith(os.sep):
        raise SubmitError(f"--yaml_file {path}: a folder; give a file name in it, e.g. {path / 'job.yml'}")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise SubmitError(f"--yaml_file {path}: {parent} is a file, not a folder; give another path")
    if path.is_file() and not is_job_yaml(path):  # e.g. the task's own config: a job's YAML written before is replaced
        raise SubmitError(
            f"--yaml_file {path}: a file that is not an Azure ML job's YAML is there, and it would be written over; "
            f"give a new file name, e.g. {path.parent / 'job.yml'}"
        )


def check_yaml_dir(given: str | None, example: str, option: str = "--yaml_dir") -> None:
    """A --yaml_dir that can be written in: a folder, or one to make, no file where a folder of its path must be."""
    if given is None:
        return
    for folder in (Path(given), *Path(given).parents):
        if folder.exists() and not folder.is_dir():
            raise SubmitError(f"{option} {given}: {folder} is a file, not a folder; give a folder, e.g. {example}")


def check_not_written_over(folder: Path, files: dict[str, tuple[str, tuple[str, ...]]], option: str) -> None:
    """A dry run's files in --yaml_dir (name -> (what it is, the keys its YAML has)) may replace the same YAML written
    before, never another file of the user's: such a file is a SubmitError, before any file is written."""
    for name, (what, keys) in files.items():
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, ValueError, yaml.YAMLError):  # unreadable, not text, not YAML
            data = None
        if not (isinstance(data, dict) and all(key in data for key in keys)):
            raise SubmitError(
                f"{option} {folder}: {path} is there and is not {what}, and it would be written over; give another "
                "folder"
            )


def is_job_yaml(path: Path) -> bool:
    """Whether `path` holds a job's YAML (a command, sweep or pipeline job's, as --dry_run writes it)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):  # unreadable, not text, not YAML
        return False
    return isinstance(data, dict) and data.get("type") in ("command", "sweep", "pipeline")


def write_yaml_file(given: str, text: str) -> None:
    """Writes a job's YAML to --yaml_file (checked by check_yaml_file), making its folders; says what to run."""
    path = Path(given)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as error:
        raise SubmitError(f"--yaml_file {given}: cannot write it ({error.strerror}); give another path") from None
    print(f"wrote {given}: az ml job create -f {given}")


def submit_job(client, job, code_holders: list, stream: bool) -> str:
    """Submits `job` with this folder's code snapshot as the code of each of `code_holders` (the job, a sweep's
    trial, a pipeline's components), prints where to see it, follows it with `stream`; returns its name."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    from scripts.azure_ml.code_snapshot import code_snapshot

    try:
        with code_snapshot(Path.cwd()) as code:  # the SDK's own walk of the folder reads .venv's every file
            for holder in code_holders:
                holder.code = str(code)
            try:
                submitted = client.jobs.create_or_update(job)
            except ClientAuthenticationError:  # an HttpResponseError too: the one line below says to sign in
                raise
            except HttpResponseError as error:  # e.g. a compute, environment or data asset the workspace lacks
                message = str(error.message or error).strip().splitlines()[0]
                raise SubmitError(f"Azure ML refused the job: {message}") from None
        print(f"submitted {submitted.name}: {submitted.studio_url}")
        if stream:
            follow(client, submitted.name)
    except ClientAuthenticationError:
        raise SubmitError(not_signed_in("submit")) from None
    return submitted.name
