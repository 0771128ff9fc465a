"""Run any training config as an Azure ML command job: the same `python -m scripts.train fit` line, on a cluster.

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster
    python -m scripts.submit configs/mnist.yaml --presets+ configs/trainer/gpu.yaml --compute gpu-cluster --nodes 2 \\
        --processes_per_node 4 --inputs+ data.init_args.data_dir=azureml:mnist:1 --train_args "--trainer.max_epochs 5"
    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --dry_run true  # print the job's YAML
    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --stream true  # follow it to its end
    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --environment azureml:lightning-training:1 \\
        --inputs+ data.init_args.csv_path=azureml:penguins:3,type=uri_file --tier spot --timeout 2h
    python -m scripts.submit configs/penguins.yaml --compute serverless --instance_type Standard_DS3_v2

Every check of the arguments runs before the Azure SDK is imported; each mistake is one line. The configs, --train_args
and the inputs' options go through the training CLI here, as the job's processes read them: a typo is one line, not
a job that fails on Azure after its image is built. The job uploads this
folder (less `.amlignore`), builds `environment.yml` on Azure ML's Open MPI image (its CUDA one with InfiniBand for
configs that run on GPUs) and runs `python -m scripts.train fit --config TASK [--config PRESET ...]` in every
process. Azure ML hands the job's MLflow run over (MLFLOW_TRACKING_URI, MLFLOW_RUN_ID), so metrics, config and
checkpoints land in the job; ./outputs is uploaded too. Checkpoints go to the job output `checkpoints`, mounted
read-write: a job on low-priority nodes that Azure ML preempts and restarts resumes from its last.ckpt
(scripts/training/checkpoints.py); `--tier spot` asks for such nodes, `--timeout` bounds the job, and `--shm_size`
(by default 1g per DataLoader worker of each process) sizes the container's /dev/shm. Registered assets
(scripts.assets) replace the uploads: `--environment azureml:NAME:VERSION`, `--inputs+ OPTION=azureml:NAME:VERSION`.
Several processes add configs/trainer/ddp.yaml with distribution `pytorch` (Azure ML starts one process per device
with torch.distributed's variables) or configs/trainer/ddp_mpi.yaml with `mpi` (mpirun), and the devices and nodes
to match. A Horovod config
(configs/trainer/horovod.yaml) runs under `mpi` on the image strategies/horovod.Dockerfile builds. The YAML of
`--dry_run` also runs as `az ml job create -f`. The workspace is config.json (the studio's "Download
config file", found here or above) unless --subscription_id, --resource_group and --workspace name it.
Needs azure-ai-ml (pyproject's `azure` extra, which `make install` installs).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from scripts.azure_ml.assets import default_kind
from scripts.azure_ml.errors import SubmitError
from scripts.azure_ml.job_configs import GPU_ACCELERATORS, accelerator_of, cpu_image_note
from scripts.azure_ml.jobs import build_job
from scripts.azure_ml.submission import submit_job
from scripts.azure_ml.workspace import check_workspace_ids, workspace_client
from scripts.azure_ml.yaml_files import check_yaml_file, job_yaml, write_yaml_file
from scripts.training.cli_errors import argument_error_line


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
    environment: str | None = None,
    tier: Literal["spot", "standard"] | None = None,
    timeout: str | None = None,
    shm_size: str | None = None,
    instance_type: str | None = None,
) -> str:
    """Builds the job and submits it (or prints its YAML); returns the job's name (or the YAML).

    Args:
        task: the task's config, e.g. configs/mnist.yaml.
        compute: the Azure ML compute cluster's name, or serverless (Azure ML's serverless compute: no cluster, the
            VM size of --instance_type or one Azure ML picks, a CPU one).
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
            trial this command with the trial's values (scripts/sweeps/azure.py).
        environment: a registered environment, azureml:NAME:VERSION (python -m scripts.assets environment training),
            instead of building environment.yml on --image.
        tier: Azure ML's job tier (queue settings): spot (preemptible, cheaper; the job resumes from its checkpoints
            output when restarted) or standard; default: the compute's own.
        timeout: the job's time limit: seconds (3600) or a duration of days, hours, minutes, seconds: 90m, 4h, 1h30m,
            2d. A sweep's limits are its file's budget.time and trial_time.
        shm_size: the container's /dev/shm, e.g. 8g; default: 1g per DataLoader worker of each process on a node
            (data.init_args.num_workers; at least 2g), or Azure ML's own when the data loads in the training process.
        instance_type: with --compute serverless, the VM size, e.g. Standard_NC4as_T4_v3 (a GPU size for configs
            that run on GPUs).
    """
    if not compute:
        raise SubmitError("give the compute cluster to run on: --compute NAME (or --compute serverless)")
    if stream and dry_run:
        raise SubmitError("--stream follows a submitted job: leave out --dry_run")
    if yaml_file and not dry_run:
        raise SubmitError(f"--yaml_file {yaml_file} writes the job's YAML instead of submitting it: add --dry_run true")
    if yaml_file:
        check_yaml_file(yaml_file)
    check_workspace_ids(subscription_id, resource_group, workspace, not dry_run)  # before build_job imports the SDK
    if environment and default_kind(environment) == "serving":  # the job would fail at its first import
        raise SubmitError(
            f"--environment {environment}: the serving environment (scripts/serving/environment.yml: no torch, no "
            "Lightning), where scripts.train cannot run; give the training one, e.g. azureml:lightning-training:1 "
            "(lightning-training-gpu for configs on GPUs)"
        )
    if sweep and timeout is not None:
        raise SubmitError("--timeout with --sweep: a sweep's limits are its file's budget.time and budget.trial_time")
    configs = [task, *(presets or [])]
    settings = {"environment": environment, "tier": tier, "timeout": timeout, "shm_size": shm_size,
                "instance_type": instance_type}  # fmt: skip
    as_yaml = job_yaml
    if sweep:
        from scripts.sweeps.azure import build_sweep_job, load_for_azure, sweep_yaml, trial_args
        from scripts.sweeps.space import SweepError

        try:
            spec = load_for_azure(sweep, configs)
        except SweepError as error:
            raise SubmitError(f"--sweep {error}") from None
        args = " ".join(part for part in (trial_args(spec), train_args) if part)
        trial = build_job(configs, compute, nodes, processes_per_node, distribution, inputs, args, experiment, image,
                          checkpoints=False, checked_args=train_args, **settings)  # fmt: skip
        job, as_yaml = build_sweep_job(trial, spec, trial.compute, tier), sweep_yaml  # None: serverless
    else:
        job = build_job(configs, compute, nodes, processes_per_node, distribution, inputs, train_args, experiment,
                        image, checked_args=train_args, **settings)  # fmt: skip
    note = None if environment or image else cpu_image_note(configs, train_args, compute, processes_per_node,
                                                            instance_type)  # fmt: skip
    gpu = accelerator_of(configs, train_args) in GPU_ACCELERATORS
    if environment and default_kind(environment) == "training" and gpu and nodes > 1:
        note = (
            f"note: --environment {environment} is the training environment on the CPU image, without InfiniBand: "
            f"NCCL between the {nodes} nodes goes over TCP; for GPU jobs register training-gpu (python -m "
            "scripts.assets environment training-gpu)"
        )
    if note:  # after the checks: the configs are there and parse
        print(note, file=sys.stderr)
    if dry_run:
        if yaml_file:
            text = as_yaml(job, Path(yaml_file).parent)
            write_yaml_file(yaml_file, text)
            return text
        text = as_yaml(job)
        print(text, end="")
        return text
    client = workspace_client(subscription_id, resource_group, workspace)
    return submit_job(client, job, [job.trial if sweep else job], stream)


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
