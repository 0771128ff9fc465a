"""A task as an Azure ML pipeline, train -> evaluate -> register -> score, built from components generated from its
config: submit it, print its YAML, run it here, or register its components.

    python -m scripts.pipeline configs/birds.yaml --compute gpu-cluster --data azureml:birds:1 --threshold 0.9 \\
        --presets+ configs/trainer/gpu.yaml --nodes 2 --processes_per_node 4
    python -m scripts.pipeline configs/penguins.yaml --compute cpu-cluster --score_data configs/examples/penguins.csv \\
        --dry_run true                                   # its YAML, for az ml job create -f
    python -m scripts.pipeline configs/penguins.yaml --local true --score_data configs/examples/penguins.csv
    python -m scripts.pipeline configs/birds.yaml --compute gpu-cluster --components true --version 1   # register them
    python -m scripts.pipeline configs/birds.yaml --compute serverless --instance_type Standard_NC4as_T4_v3 \
        --presets+ configs/trainer/gpu.yaml --data azureml:birds:1   # no cluster: serverless VMs, a GPU one to train

docs/pipelines.md says what each step does. Every check runs before the Azure SDK is imported, but --nodes against the
cluster's maximum, as for scripts.submit; each mistake is one line and exit 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scripts.azure_ml.errors import SubmitError, service_line
from scripts.azure_ml.job_configs import cpu_image_note
from scripts.azure_ml.job_inputs import is_local
from scripts.azure_ml.options import JobOptions, Workspace, run_command
from scripts.azure_ml.submission import submit_job
from scripts.azure_ml.workspace import check_cluster_size, check_workspace_ids, not_signed_in, workspace_client
from scripts.azure_ml.yaml_files import check_yaml_dir, check_yaml_file, print_or_write_yaml


def pipeline(
    task: str,
    data: str | None = None,
    test_data: str | None = None,
    score_data: str | None = None,
    model_name: str | None = None,
    metric: str = "test_acc",
    threshold: float = 0.9,
    name: str | None = None,
    local: bool = False,
    local_dir: str = "outputs",
    components: bool = False,
    version: str | None = None,
    **given,
) -> str:
    """Builds the pipeline and submits it (or prints its YAML, runs it here, registers its components).

    Args:
        task: the task's config, e.g. configs/birds.yaml.
        data: the training data: a local folder or file (as the task reads; uploaded), azureml:NAME:VERSION or a URI;
            default: the config's own (penguins: the palmerpenguins package; birds, MNIST: their download). The table
            task also takes an MLTable: a local folder holding an MLTable file, or an asset or URI followed by
            `,type=mltable` (azureml:penguins-table:3,type=mltable); the score step then needs --score_data, a CSV.
        test_data: what the evaluate step tests on (its test split); default: --data.
        score_data: what the score step scores (a folder of images, a CSV); default: --test_data, else --data.
        model_name: the name the register step registers the model under; default: TASK-classifier.
        metric: the evaluation's metric the threshold is for: test_acc (reached at or above) or test_loss (at or below).
        threshold: the value --metric must reach for the model to be registered.
        name: the components' names' start (NAME_train, NAME_evaluate, ...); default: the config's file name.
        local: run the pipeline on this machine, step after step, instead of submitting it.
        local_dir: with local, where its folders (local_dir/pipelines/...) and MLflow store (local_dir/mlflow.db) go.
        components: register the four components in the workspace (a version each: --version) instead of a pipeline.
        version: with components, the version to register them as, a number.
        given: the train step's launch and the steps' settings, a dry run's output, the workspace
            (scripts/azure_ml/options.py's JobOptions).
    """
    options = JobOptions(**given)
    compute, nodes, processes_per_node = options.compute, options.nodes, options.processes_per_node
    train_args, dry_run, yaml_file, stream = options.train_args, options.dry_run, options.yaml_file, options.stream
    environment, image, instance_type = options.environment, options.image, options.instance_type
    if not compute and not local and not components:
        raise SubmitError("give the compute cluster to run on: --compute NAME (or --local true to run it here)")
    if local and (dry_run or components or stream):
        raise SubmitError("--local true runs the pipeline here: leave out --dry_run, --components and --stream")
    for folder in (Path(local_dir), *Path(local_dir).parents) if local else ():  # the first that exists: a folder
        if folder.exists():
            if not folder.is_dir():
                raise SubmitError(f"--local_dir {local_dir}: {folder} is a file, not a folder; give a folder")
            break
    if stream and dry_run:
        raise SubmitError("--stream follows a submitted pipeline: leave out --dry_run")
    if yaml_file and not dry_run:
        raise SubmitError("--yaml_file writes the YAML instead of submitting: add --dry_run true")
    if yaml_file and not components:
        check_yaml_file(yaml_file)
    if yaml_file and components:  # a folder of the components' files
        check_yaml_dir(yaml_file, "components/", "--yaml_file")
    if components:
        from scripts.azure_ml.assets import check_version

        if stream:
            raise SubmitError("--stream follows a pipeline: leave it out with --components true")
        check_version(version or "")
    elif version is not None:
        raise SubmitError("--version is the components' version: add --components true, or leave it out")
    check_workspace_ids(*options.workspace_ids(), not (dry_run or local))
    from scripts.azure_ml.pipelines import plan_pipeline

    plan = plan_pipeline([task, *(options.presets or [])], compute, nodes, processes_per_node, options.distribution,
                         train_args, data, test_data, score_data, model_name, metric, threshold, name,
                         options.experiment, image, environment, options.tier, options.timeout, options.shm_size,
                         options.sweep, components, instance_type)  # fmt: skip
    note = None if local or environment or image else cpu_image_note(plan.components.configs, train_args, compute,
                                                                      processes_per_node, instance_type)  # fmt: skip
    if note:  # as scripts.submit's: GPUs look meant, and the steps get the CPU image
        print(note, file=sys.stderr)
    if plan.sweep is not None and plan.job.launch == "mpi" and not plan.job.horovod and not local:
        print(  # Horovod's image sets the variable itself (strategies/horovod/Dockerfile)
            "note: a pipeline's sweep trials take no environment variables, so under --distribution mpi Open MPI "
            "kills a cancelled or preempted trial 1 s after its SIGTERM, before it saves last.ckpt; --distribution "
            "pytorch stops it at a batch's end",
            file=sys.stderr,
        )
    if local:
        from scripts.azure_ml.local_pipeline import run_local

        return str(run_local(plan, Path(local_dir)))
    if components:
        return create_components(plan, version, dry_run, yaml_file, options)
    from scripts.azure_ml.pipelines import build_pipeline, pipeline_yaml

    job = build_pipeline(plan)
    if dry_run:
        return print_or_write_yaml(job, pipeline_yaml, yaml_file)
    from azure.ai.ml.exceptions import MlException

    client = workspace_client(*options.workspace_ids())
    check_cluster_size(client, plan.compute, nodes)  # the train step's (each trial's); the others run on one node
    steps = [step.trial if step.type == "sweep" else step.component for step in job.jobs.values()]
    given = (("--data", data), ("--test_data", test_data), ("--score_data", score_data))
    uploads = [f"{option} {value}" for option, value in given if value and is_local(value.split(",")[0])]
    try:
        return submit_job(client, job, steps, stream, uploads)
    except MlException as error:  # the SDK's checks against the workspace, e.g. a compute it does not have
        raise SubmitError(f"Azure ML refused the pipeline: {refusal(str(error))}") from None


def refusal(text: str) -> str:
    """The first error of the SDK's validation report (a JSON object of errors, each with its path and value)."""
    import json

    try:
        error = json.loads(text)["errors"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return service_line(Exception(text))  # its first line that holds text, without the SDK's colour codes
    message = service_line(Exception(str(error.get("message", ""))))
    return f"{error.get('path')} {error.get('value')}: {message}"


def create_components(plan, version: str, dry_run: bool, yaml_file: str | None, workspace: Workspace) -> str:
    """Registers (or prints) the task's four components; returns their references (or YAML)."""
    from scripts.azure_ml.components import component_yaml
    from scripts.azure_ml.pipelines import build_components_of

    built = build_components_of(plan, version)
    if dry_run:
        folder = Path(yaml_file) if yaml_file else Path(".")
        texts = {step: component_yaml(component, folder) for step, component in built.items()}
        if yaml_file:
            folder.mkdir(parents=True, exist_ok=True)
            for step, text in texts.items():
                (folder / f"{built[step].name}.yml").write_text(text)
                print(
                    f"wrote {folder / built[step].name}.yml: az ml component create -f {folder / built[step].name}.yml"
                )
        else:
            print("---\n".join(texts.values()), end="")
        return "---\n".join(texts.values())
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    from scripts.azure_ml.code_snapshot import code_snapshot

    client = workspace_client(*workspace.workspace_ids())
    created = []
    try:
        with code_snapshot(Path.cwd()) as code:
            for component in built.values():
                component.code = str(code)
                done = client.components.create_or_update(component)
                created.append(f"azureml:{done.name}:{done.version}")
                print(f"created component azureml:{done.name}:{done.version}")
    except ClientAuthenticationError:
        raise SubmitError(not_signed_in("submit")) from None
    except HttpResponseError as error:  # e.g. the version exists with other content: versions are immutable
        message = service_line(error)
        raise SubmitError(
            f"Azure ML refused component {component.name}:{version}: {message}; give the next --version"
        ) from None
    return " ".join(created)


def main(args: list[str] | None = None) -> None:
    """A bad config, option, input, threshold, name or login ends in one line on stderr and exit status 1; so does a
    step that fails here (--local true) or a followed pipeline that does not complete."""
    run_command(pipeline, "scripts.pipeline", (SubmitError,), args)


if __name__ == "__main__":
    main()
