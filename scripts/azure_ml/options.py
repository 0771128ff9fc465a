"""The options the Azure ML commands share, declared once: the workspace (scripts.submit, pipeline, assets, deploy),
a dry run's output, and a training job's launch (submit, pipeline). Each command's function takes them as `**given`
and builds one of these from it; jsonargparse reads their fields and docs from there, so `--help` lists them as the
command's own. `run_command` reads a command line and turns every mistake into one line on stderr and exit 1.

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --train_args "--trainer.max_epochs=5"
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal


@dataclass
class Workspace:
    """The workspace: config.json (the studio's "Download config file", found here or above) unless all three name it.

    Args:
        subscription_id: the workspace's Azure subscription, when there is no config.json.
        resource_group: the workspace's resource group, when there is no config.json.
        workspace: the workspace's name, when there is no config.json.
    """

    subscription_id: str | None = None
    resource_group: str | None = None
    workspace: str | None = None

    def workspace_ids(self) -> tuple[str | None, str | None, str | None]:
        return self.subscription_id, self.resource_group, self.workspace


@dataclass
class DryRun(Workspace):
    """What a command would create, printed or written instead.

    Args:
        dry_run: print the YAML of what it would create instead of creating it.
        yaml_dir: with dry_run, write the YAML files to this folder (for `az ml ... create -f`).
    """

    dry_run: bool = False
    yaml_dir: str | None = None


@dataclass
class JobOptions(Workspace):
    """A training job's launch, as scripts.submit and the train step of scripts.pipeline take it.

    Args:
        compute: the Azure ML compute cluster's name, or serverless (Azure ML's serverless compute: no cluster, the
            VM size of --instance_type or one Azure ML picks, a CPU one).
        presets: configs added after the task's, in order, e.g. configs/trainer/gpu.yaml (not ddp*.yaml: the job
            adds those from --nodes, --processes_per_node and --distribution).
        nodes: machines of the training job (its instance count); with processes_per_node > 1 or nodes > 1 it runs
            DDP. At most the cluster's maximum, read from the workspace before the upload (not for serverless compute,
            which has no cluster, nor with dry_run).
        processes_per_node: processes on each machine, one per GPU (process_count_per_instance).
        distribution: how Azure ML starts the processes: `pytorch` (torch.distributed's variables) or `mpi`.
        train_args: more `scripts.train` options, e.g. "--trainer.max_epochs 5" (not devices, num_nodes, strategy).
        sweep: a sweep file (configs/sweeps/TASK.yaml): an Azure ML sweep over its search space, each trial the
            training job with the trial's values (scripts/sweeps/azure.py).
        experiment: the Azure ML experiment; default: the configs' logger's experiment_name.
        image: the Docker base image environment.yml is built on; default: Azure ML's Open MPI image, its CUDA one
            when the configs run on GPUs.
        environment: a registered environment, azureml:NAME:VERSION (python -m scripts.assets environment training),
            instead of building environment.yml on --image.
        tier: Azure ML's job tier (queue settings): spot (preemptible, cheaper; a training job resumes from its
            checkpoints output when restarted) or standard; default: the compute's own.
        timeout: the time limit of a job (of each step of a pipeline): seconds (3600) or a duration of days, hours,
            minutes, seconds: 90m, 4h, 1h30m, 2d. A sweep's limits are its file's budget.time and trial_time.
        shm_size: the container's /dev/shm, e.g. 8g; default: 1g per DataLoader worker of each process on a node
            (data.init_args.num_workers; at least 2g), or Azure ML's own when the data loads in the training process.
        instance_type: with --compute serverless, the VM size, e.g. Standard_NC4as_T4_v3 (a GPU size for configs
            that run on GPUs); a pipeline's register and score steps run on CPUs: a GPU size leaves theirs to Azure ML.
        dry_run: print the YAML instead of submitting; `az ml job create -f` runs it saved at the repository's root.
            Offline: the workspace is not asked, so --nodes is not held to the cluster's maximum.
        yaml_file: with dry_run, write the YAML to this file instead, its code path relative to the file's folder
            (scripts.pipeline --components true: a folder of the components' TASK_STEP.yml files).
        stream: follow the submitted job's (or pipeline's) logs and exit with its status (0 when it completed).
    """

    compute: str = ""
    presets: list[str] | None = None
    nodes: int = 1
    processes_per_node: int = 1
    distribution: Literal["pytorch", "mpi"] = "pytorch"
    train_args: str = ""
    sweep: str | None = None
    experiment: str | None = None
    image: str | None = None
    environment: str | None = None
    tier: Literal["spot", "standard"] | None = None
    timeout: str | None = None
    shm_size: str | None = None
    instance_type: str | None = None
    dry_run: bool = False
    yaml_file: str | None = None
    stream: bool = False


def option_values_kept(args: list[str], options: tuple[str, ...] = ("--train_args",)) -> list[str]:
    """`args` with `--train_args VALUE` written `--train_args=VALUE`: a value that starts with a dash (every
    scripts.train option does) would be read as an option of this command ("expected one argument")."""
    kept: list[str] = []
    index = 0
    while index < len(args):
        if args[index] in options and index + 1 < len(args):
            kept.append(f"{args[index]}={args[index + 1]}")
            index += 2
            continue
        kept.append(args[index])
        index += 1
    return kept


def run_command(components, command: str, errors: tuple[type[Exception], ...], args: list[str] | None = None):
    """Runs `components` (a function, or subcommands by name) on the command line (`args`, else sys.argv's); a bad
    option or any of `errors` ends in one line on stderr and exit status 1. Returns the function's answer."""
    import logging

    from scripts.training.cli_errors import run_cli

    # azure-ai-ml warns of its own experimental schema classes when it writes a job: nothing a user can act on.
    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)
    return run_cli(components, command, errors, option_values_kept(list(sys.argv[1:] if args is None else args)))
