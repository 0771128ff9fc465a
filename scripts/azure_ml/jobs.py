"""Azure ML command jobs built from a job's plan (scripts/azure_ml/job_plan.py): its environment, how its processes
are started, its inputs and outputs. scripts.submit runs them; scripts/sweeps/azure.py makes one a sweep's trial and
scripts/azure_ml/pipelines.py reuses the environment and launch rules for its steps.

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --dry_run true
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Literal

from scripts.azure_ml.images import BASE_IMAGE, GPU_IMAGE, horovod_build_context
from scripts.azure_ml.job_configs import job_experiment, resolved_config
from scripts.azure_ml.job_inputs import check_data_paths, check_unset_arguments, is_local
from scripts.azure_ml.job_plan import Plan, plan_job
from scripts.azure_ml.workspace import check_compute

# mpirun answers a SIGTERM (Azure ML's at preemption and cancel) with SIGTERM to its processes after this many
# seconds and SIGKILL as many after that; Open MPI's default, 1, kills a fit before it stops at its next batch with
# last.ckpt kept (scripts/training/sigterm.py). Open MPI's own MCA parameter, read from the environment.
MPI_STOP_GRACE = {"OMPI_MCA_odls_base_sigkill_timeout": "10"}


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
        given = [f"--{i.option} {shlex.quote(i.value(i.path, quote=False) if is_local(i.path) else f'inputs/{i.name}')}"
                 for i in plan.inputs]  # fmt: skip
        config = resolved_config(plan.configs, " ".join([checked_args, *given]))
        check_data_paths(config, {i.option for i in plan.inputs})
        check_unset_arguments(config, {i.option for i in plan.inputs}, plan.configs[0])
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
