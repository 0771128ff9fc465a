"""What a job's configs and --train_args set, read as the job's processes will read them: the trainer's accelerator
and strategy, the MLflow experiment, the DataLoader workers, and the whole resolved config (through the training CLI).
scripts.submit, scripts.pipeline and scripts.sweep ask them before anything is built.

    python -m scripts.submit configs/mnist.yaml --compute gpu --train_args "--trainer.max_epochs 5" --dry_run true
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from scripts.azure_ml.errors import SubmitError
from scripts.azure_ml.workspace import GPU_SIZE

GPU_ACCELERATORS = ("gpu", "cuda")
DEFAULT_EXPERIMENT = "lightning-template"  # scripts.train's default logger's
# Azure ML's rule for experiment names (its service's own message when it refuses one, after the code is uploaded).
EXPERIMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,255}")


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


def dataloader_workers(configs: list[str], train_args: str = "") -> int:
    """The DataLoader workers of each process: the configs' data.init_args.num_workers (the last that sets it), or
    --train_args's."""
    workers = 0
    for path in configs:
        data = (yaml.safe_load(Path(path).read_text()) or {}).get("data") or {}
        workers = ((data.get("init_args") or {}) if isinstance(data, dict) else {}).get("num_workers", workers)
    given = train_arg(train_args, "--data.num_workers", "--data.init_args.num_workers")
    return int(given) if given and given.isdigit() else int(workers or 0)


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
    from scripts.training.printed_config import printed_config

    args = ["fit", *(item for config in configs for item in ("--config", config)), *shlex.split(train_args)]
    return printed_config(args, SubmitError)
