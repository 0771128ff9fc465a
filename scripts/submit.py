"""Run any training config as an Azure ML command job: the same `python -m scripts.train fit` line, on a cluster.

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster
    python -m scripts.submit configs/mnist.yaml --presets+ configs/trainer/gpu.yaml --compute gpu-cluster --nodes 2 \\
        --processes_per_node 4 --inputs+ data.init_args.data_dir=azureml:mnist:1 --train_args "--trainer.max_epochs 5"
    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --dry_run true  # print the job's YAML
    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --stream true  # follow it to its end
    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --environment azureml:lightning-training:1 \\
        --inputs+ data.init_args.csv_path=azureml:penguins:3,type=uri_file --tier spot --timeout 2h
    python -m scripts.submit configs/penguins.yaml --compute serverless --instance_type Standard_DS3_v2

The job uploads this folder (less `.amlignore`), builds `environment.yml` on Azure ML's image and runs the same
`python -m scripts.train fit` line in every process (docs/azure-ml.md: launch, preemption, shared memory, assets).
Every check runs before the Azure SDK is imported (the configs, --train_args and inputs through the training CLI), but
--nodes against a named cluster's maximum, read before the upload; each mistake is one line.
"""

from __future__ import annotations

import sys

from scripts.azure_ml.assets import default_kind
from scripts.azure_ml.errors import SubmitError, sweeps_for_azure
from scripts.azure_ml.job_configs import GPU_ACCELERATORS, accelerator_of, cpu_image_note
from scripts.azure_ml.job_inputs import is_local
from scripts.azure_ml.jobs import build_job
from scripts.azure_ml.options import JobOptions, run_command
from scripts.azure_ml.submission import submit_job
from scripts.azure_ml.workspace import check_cluster_size, check_workspace_ids, workspace_client
from scripts.azure_ml.yaml_files import check_yaml_file, job_yaml, print_or_write_yaml


def submit(task: str, inputs: list[str] | None = None, **given) -> str:
    """Builds the job and submits it (or prints its YAML); returns the job's name (or the YAML).

    Args:
        task: the task's config, e.g. configs/mnist.yaml.
        inputs: OPTION=PATH[,type=uri_folder|uri_file][,mode=ro_mount|download|direct|eval_mount|eval_download]:
            the data at PATH (a local path, uploaded; a datastore URI; azureml:NAME:VERSION) is given to the job and
            its path passed as --OPTION. A local path is a file or folder as on disk; anything else a folder unless
            `type=uri_file`; mode ro_mount unless given.
        given: the job's options (scripts/azure_ml/options.py's JobOptions).
    """
    options = JobOptions(**given)
    compute, nodes, processes_per_node = options.compute, options.nodes, options.processes_per_node
    train_args, dry_run, yaml_file = options.train_args, options.dry_run, options.yaml_file
    environment, image, instance_type = options.environment, options.image, options.instance_type
    sweep, timeout, tier = options.sweep, options.timeout, options.tier
    if not compute:
        raise SubmitError("give the compute cluster to run on: --compute NAME (or --compute serverless)")
    if options.stream and dry_run:
        raise SubmitError("--stream follows a submitted job: leave out --dry_run")
    if yaml_file and not dry_run:
        raise SubmitError(f"--yaml_file {yaml_file} writes the job's YAML instead of submitting it: add --dry_run true")
    if yaml_file:
        check_yaml_file(yaml_file)
    check_workspace_ids(*options.workspace_ids(), not dry_run)  # before build_job imports the SDK
    if environment and default_kind(environment) == "serving":  # the job would fail at its first import
        raise SubmitError(
            f"--environment {environment}: the serving environment (scripts/serving/environment.yml: no torch, no "
            "Lightning), where scripts.train cannot run; give the training one, e.g. azureml:lightning-training:1 "
            "(lightning-training-gpu for configs on GPUs)"
        )
    if sweep and timeout is not None:
        raise SubmitError("--timeout with --sweep: a sweep's limits are its file's budget.time and budget.trial_time")
    configs = [task, *(options.presets or [])]
    settings = {"environment": environment, "tier": tier, "timeout": timeout, "shm_size": options.shm_size,
                "instance_type": instance_type}  # fmt: skip
    as_yaml = job_yaml
    if sweep:
        sweeps = sweeps_for_azure()
        try:
            spec = sweeps.load_for_azure(sweep, configs)
        except sweeps.SweepError as error:
            raise SubmitError(f"--sweep {error}") from None
        args = " ".join(part for part in (sweeps.trial_args(spec), train_args) if part)
        trial = build_job(configs, compute, nodes, processes_per_node, options.distribution, inputs, args,
                          options.experiment, image, False, checked_args=train_args, **settings)  # fmt: skip
        job, as_yaml = sweeps.build_sweep_job(trial, spec, trial.compute, tier), sweeps.sweep_yaml  # None: serverless
    else:
        job = build_job(configs, compute, nodes, processes_per_node, options.distribution, inputs, train_args,
                        options.experiment, image, checked_args=train_args, **settings)  # fmt: skip
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
        return print_or_write_yaml(job, as_yaml, yaml_file)
    client = workspace_client(*options.workspace_ids())
    check_cluster_size(client, job.compute, nodes)  # before the code and environment go up
    uploads = [f"--inputs+ {item}" for item in inputs or [] if is_local(item.partition("=")[2].split(",")[0])]
    return submit_job(client, job, [job.trial if sweep else job], options.stream, uploads)


def main(args: list[str] | None = None) -> None:
    """A bad config path, option, workspace or login ends in one line on stderr and exit status 1; so does a job
    followed with --stream that does not complete."""
    run_command(submit, "scripts.submit", (SubmitError,), args)


if __name__ == "__main__":
    main()
