"""A task's Azure ML pipeline job, train -> evaluate -> register -> score, built from its components
(scripts/azure_ml/components.py) with the launch rules, images, tier, timeout and shared memory of single jobs
(scripts/azure_ml/job_plan.py); checked before the SDK is imported. scripts.pipeline submits it, prints it or runs it
here.

    python -m scripts.pipeline configs/penguins.yaml --compute cpu-cluster --dry_run true
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from scripts.azure_ml.components import TaskComponents, plan_components, value_at
from scripts.azure_ml.errors import SubmitError, sweeps_for_azure
from scripts.azure_ml.job_inputs import (
    check_data_paths,
    check_unset_arguments,
    check_uploaded_name,
    is_local,
    split_pattern,
)
from scripts.azure_ml.job_plan import PRESETS, Plan, plan_job
from scripts.azure_ml.option_values import parse_reference
from scripts.azure_ml.workspace import GPU_SIZE, SERVERLESS
from scripts.azure_ml.yaml_files import dumped

STEPS = ("train", "evaluate", "register", "score")
METRICS = ("test_acc", "test_loss")  # what the evaluate step's test writes; acc reaches at or above, loss at or below


@dataclass
class DataInput:
    path: str
    type: str


@dataclass
class PipelinePlan:
    components: TaskComponents
    job: Plan  # the train step's launch, environment, tier, timeout and shared memory
    compute: str  # a cluster's name, SERVERLESS, or "" (run here)
    nodes: int
    processes_per_node: int
    experiment: str
    model_name: str
    metric: str
    threshold: float
    training_data: DataInput | None
    test_data: DataInput | None
    score_data: DataInput | None
    sweep: object = None  # a scripts.sweeps.space.Sweep: the train step is a sweep node over it
    image: str | None = None
    shm_size: str | None = None  # as given
    train_args: str = ""
    instance_type: str | None = None  # serverless compute's VM size for train and evaluate (and the others if a CPU's)

    @property
    def launch_config(self) -> str | None:
        """The DDP preset the train step adds (none for one process, nor for Horovod, whose config joins mpirun's)."""
        return PRESETS[self.job.launch] if self.job.launch and not self.job.horovod else None


def check_threshold(metric: str, threshold: float) -> None:
    if metric not in METRICS:
        raise SubmitError(f"--metric {metric!r}: give {' or '.join(METRICS)} (what the evaluate step measures)")
    if metric == "test_acc" and not 0 <= threshold <= 1:
        raise SubmitError(f"--threshold {threshold}: test_acc is a fraction; give 0 to 1, e.g. 0.9")
    if metric == "test_loss" and not threshold >= 0:
        raise SubmitError(f"--threshold {threshold}: test_loss is 0 or more; give such a value, e.g. 0.3")


MLTABLE, URI_FOLDER = ",type=mltable", ",type=uri_folder"


def data_input(given: str, option: str, wanted: str, mltable: bool = False) -> DataInput:
    """A local path (checked: a folder or a file as the task reads), a data asset azureml:NAME:VERSION, or a URI.
    `mltable`: the task reads an MLTable too (a local folder holding an MLTable file; an asset or URI followed by
    `,type=mltable`), which is then the input's type."""
    what = "a folder" if wanted == "uri_folder" else "a file"
    for suffix, kind, name in ((MLTABLE, "mltable", "MLTable"), (URI_FOLDER, "uri_folder", "folder of tables")):
        if given.endswith(suffix) and wanted != kind:
            if not mltable:
                raise SubmitError(f"{option} {given}: this task reads no {name}; give {what}, as the task reads")
            given, wanted = given.removesuffix(suffix), kind
    if given.startswith("azureml:") and "://" not in given:
        return DataInput(parse_reference(given, option, "azureml:birds:1"), wanted)
    if not is_local(given):
        return DataInput(given, wanted)
    path = Path(given)
    if not path.exists():
        raise SubmitError(f"{option} {given}: no such file or folder; give {what}, as the task reads")
    if mltable and path.is_dir() and (path / "MLTable").is_file():
        return DataInput(str(path.resolve()), "mltable")
    if wanted == "mltable":
        raise SubmitError(f"{option} {given}{MLTABLE}: not a folder holding an MLTable file; give one, or the file")
    if mltable and path.is_dir():  # a table's folder of files (datamodules/table_sources.py)
        return DataInput(str(path.resolve()), "uri_folder")
    if path.is_dir() != (wanted == "uri_folder"):
        raise SubmitError(f"{option} {given}: {'a folder' if path.is_dir() else 'a file'}; this task reads {what}")
    if wanted == "uri_file":  # --local true too: what runs here runs as in Azure ML
        check_uploaded_name(path, f"{option} {given}")
    return DataInput(str(path.resolve()), wanted)


def check_has_an_image(folder: Path, given: str) -> None:
    """A folder the score step scores holds an image at some depth (by its name, or by its first bytes), the files
    scripts.score leaves out left out: else the pipeline would train and register a model, then fail at its end.
    Called after the configs went through the training CLI, which imported torch."""
    from datamodules.preprocessing.images import IMAGE_SUFFIXES, ignored, is_image

    for top, folders, names in os.walk(folder, followlinks=True):
        folders[:] = sorted(name for name in folders if not ignored(name))
        files = [Path(top) / name for name in sorted(names) if not ignored(name)]
        if any(path.suffix.lower() in IMAGE_SUFFIXES for path in files) or any(map(is_image, files)):
            return
    raise SubmitError(
        f"{given}: no image in it (looked for {', '.join(IMAGE_SUFFIXES)} and image files by their bytes); "
        "give the folder of images the score step scores"
    )


def plan_pipeline(
    configs: list[str],
    compute: str,
    nodes: int = 1,
    processes_per_node: int = 1,
    distribution: str = "pytorch",
    train_args: str = "",
    data: str | None = None,
    test_data: str | None = None,
    score_data: str | None = None,
    model_name: str | None = None,
    metric: str = "test_acc",
    threshold: float = 0.9,
    name: str | None = None,
    experiment: str | None = None,
    image: str | None = None,
    environment: str | None = None,
    tier: str | None = None,
    timeout: str | None = None,
    shm_size: str | None = None,
    sweep: str | None = None,
    components_only: bool = False,
    instance_type: str | None = None,
) -> PipelinePlan:
    """Every check that needs no SDK: the cheap ones first, then the configs through the training CLI.
    `components_only`: for the components alone, which name no data."""
    from scripts.azure_ml.assets import check_name
    from scripts.azure_ml.components import check_prefix
    from scripts.azure_ml.images import BASE_IMAGE
    from scripts.azure_ml.job_configs import experiment_of, job_experiment
    from scripts.azure_ml.workspace import check_compute, compute_name

    for option, given in (("--data", data), ("--test_data", test_data), ("--score_data", score_data)):
        given = given and given.removesuffix(MLTABLE)
        if not given or not is_local(given) or Path(given).exists():
            continue
        folder, pattern = split_pattern(given)
        if pattern:  # the steps' commands take an input's path whole
            raise SubmitError(f"{option} {given}: a pipeline's data is a file or a folder, not a pattern; give the "
                              f"folder: {option} {folder}{URI_FOLDER} (the task reads the files in it)")  # fmt: skip
        raise SubmitError(f"{option} {given}: no such file or folder; give the data as the task reads it")  # pre-import
    if instance_type is not None and not compute:
        raise SubmitError(
            f"--instance_type {instance_type}: the VM size of serverless compute; give --compute serverless with it, "
            "or leave it out"
        )
    if compute:
        compute = compute_name(compute)
        if compute.lower() == "local":  # the SDK fails on a pipeline with it, past its own checks
            raise SubmitError(
                "--compute local: Azure ML's local runs are not supported for pipelines; give --local true to run it "
                "here step after step, or a compute cluster's name"
            )
    check_threshold(metric, threshold)
    if name is not None:
        check_prefix(name)
    task = Path(configs[0]).stem
    model_name = model_name or f"{task}-classifier"
    check_name(model_name, "--model_name")
    if sweep and timeout is not None:
        raise SubmitError("--timeout with --sweep: a sweep's limits are its file's budget.time and budget.trial_time")
    job = plan_job(configs, nodes, processes_per_node, distribution, None, train_args, image or BASE_IMAGE, True,
                   environment, tier, timeout, shm_size)  # fmt: skip
    if compute:  # a cluster's name, or serverless with a VM size that fits the configs (a GPU one for GPUs)
        compute = check_compute(compute, instance_type, job.configs, job.gpu) or SERVERLESS
    spec, sweep_args, sweep_inputs = None, "", {}
    if sweep:
        sweeps = sweeps_for_azure()
        try:
            spec = sweeps.load_for_azure(sweep, configs)
        except sweeps.SweepError as error:
            raise SubmitError(f"--sweep {error}") from None
        names = sweeps.search_space_names(spec)
        # A sweep node searches its component's inputs: the trial's options, each from the input of its name.
        sweep_args = sweeps.trial_args(spec).replace("${{search_space.", "${{inputs.")
        sweep_inputs = {names[p.option]: sweep_input_type(p) for p in spec.params}
    # The configs in the order the job reads them (Horovod's before a GPU preset, which wins: launch_first), the order
    # its image was chosen by.
    components = plan_components(job.configs, train_args, name, sweep_args, sweep_inputs)
    wanted, mltable = components.data_type, components.reads_mltable
    training = data_input(data, "--data", wanted, mltable) if data else None
    if training is not None and not components.data_option:
        raise SubmitError(f"--data: {configs[0]}'s datamodule takes no data_dir or csv_path to give it as")
    testing = data_input(test_data, "--test_data", wanted, mltable) if test_data else None
    for name, data_given in (("training_data", training), ("test_data", testing or training)):
        if data_given is not None and data_given.type != components.data_type:  # a table's MLTable or folder
            components.input_types[name] = data_given.type
    # The config's own data path, where --data does not replace it, reaches the steps: in the code, or as --data.
    given = {components.data_option} if training is not None else set()
    fix = {components.data_option: f"--data {value_at(components.config, components.data_option)}"}
    check_data_paths(components.config, given, fix if components.data_option else None)
    check_unset_arguments(components.config, given, configs[0], {components.data_option: "--data PATH"})
    scoring = data_input(score_data, "--score_data", wanted, mltable) if score_data else (testing or training)
    if scoring is not None and wanted == "uri_folder" and is_local(scoring.path):  # the score step would fail on it
        given = next(
            (o, g) for o, g in (("--score_data", score_data), ("--test_data", test_data), ("--data", data)) if g
        )
        check_has_an_image(Path(scoring.path), " ".join(given))
    if scoring is not None and mltable and scoring.type != "uri_file":  # scripts.score reads a CSV of rows
        option = "--score_data" if score_data else "--test_data" if test_data else "--data"
        what = "an MLTable" if scoring.type == "mltable" else "a folder"
        raise SubmitError(
            f"{option} is {what}, which the score step (scripts.score) does not read; give --score_data a CSV of "
            "rows (a local file, or a uri_file asset azureml:NAME:VERSION)"
        )
    if scoring is None and not components_only:
        what = "a folder of images" if wanted == "uri_folder" else "a CSV, e.g. configs/examples/penguins.csv"
        raise SubmitError(f"--score_data: give what the score step scores ({what}); without --data it has no default")
    # An Azure ML experiment's name; a local run's (no compute) is an MLflow experiment's, which takes any.
    experiment = (
        job_experiment(experiment, configs, train_args) if compute else experiment or experiment_of(configs, train_args)
    )
    return PipelinePlan(components, job, compute, nodes, processes_per_node, experiment,
                        model_name, metric, threshold, training, testing, scoring, spec, image, shm_size,
                        train_args, instance_type)  # fmt: skip


def sweep_input_type(param) -> str:
    if param.kind == "int":
        return "integer"
    if param.kind == "choice":
        values = param.grid_values()
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return "integer"
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            return "number"
        return "string"
    return "number"


def build_components_of(plan: PipelinePlan, version: str | None = None) -> dict:
    """The plan's four components by step, on the train step's environment (one image for all four)."""
    from scripts.azure_ml.components import build_components
    from scripts.azure_ml.jobs import job_environment

    environment = job_environment(plan.job, plan.image)
    return build_components(plan.components, environment, version, plan.model_name, plan.metric, plan.threshold)


def build_pipeline(plan: PipelinePlan):
    """The azure.ai.ml PipelineJob: train (or a sweep over it) -> evaluate -> register -> score."""
    from azure.ai.ml import Input
    from azure.ai.ml.entities import PipelineJob

    from scripts.azure_ml.job_configs import dataloader_workers
    from scripts.azure_ml.jobs import launch_distribution, launch_variables
    from scripts.azure_ml.option_values import shm_size_of

    serverless = plan.compute == SERVERLESS
    components = build_components_of(plan)
    job = plan.job
    sizes = step_sizes(plan)

    def given(data: DataInput | None):
        return None if data is None else Input(type=data.type, path=data.path, mode="ro_mount")

    train_inputs = {"nodes": plan.nodes, "processes_per_node": plan.processes_per_node}
    if plan.launch_config:
        train_inputs["launch_config"] = plan.launch_config
    if plan.training_data:
        train_inputs["training_data"] = given(plan.training_data)
    train = components["train"](**train_inputs)
    train.name = "train"  # before another step names its outputs: ${{parent.jobs.train.outputs.model}}
    train.resources = {"instance_count": plan.nodes, **({"shm_size": job.shm_size} if job.shm_size else {}),
                       **sizes["train"]}  # fmt: skip
    train.distribution = launch_distribution(job, plan.processes_per_node)
    train.environment_variables = launch_variables(job) or {}
    evaluate_inputs = {"checkpoints": None}
    if plan.components.data_option and (plan.test_data or plan.training_data):
        evaluate_inputs["test_data"] = given(plan.test_data or plan.training_data)
    if job.tier:  # before a sweep over it: the SDK's sweep keeps the tier of queue settings the node has, else none
        train.queue_settings = {"job_tier": job.tier}
    steps = {"train": train}
    if plan.sweep is not None:
        steps["train"] = sweeps_for_azure().sweep_node(
            train, plan.sweep, None if serverless else plan.compute, job.tier
        )
        steps["train"].name = "train"
        # The SDK's sweep node copies the component alone: the node's nodes, shared memory and VM size go on the sweep
        # node's resources (its trials'), how their processes start on the trial.
        steps["train"].resources = train.resources
        steps["train"].trial.distribution = train.distribution
    evaluate_inputs["checkpoints"] = steps["train"].outputs.checkpoints
    steps["evaluate"] = components["evaluate"](**evaluate_inputs)
    steps["evaluate"].name = "evaluate"
    steps["register"] = components["register"](
        model=steps["train"].outputs.model,
        metrics=steps["evaluate"].outputs.metrics,
        model_name=plan.model_name,
        metric=plan.metric,
        threshold=plan.threshold,
    )
    steps["register"].name = "register"
    steps["score"] = components["score"](model=steps["register"].outputs.model, data=given(plan.score_data))
    steps["score"].name = "score"
    evaluate_shm = shm_size_of(plan.shm_size, dataloader_workers(plan.components.configs, plan.train_args), 1)
    if evaluate_shm:  # one process
        steps["evaluate"].resources = {"shm_size": evaluate_shm, **sizes["evaluate"]}
    elif sizes["evaluate"]:
        steps["evaluate"].resources = sizes["evaluate"]
    for name in ("register", "score"):
        if sizes[name]:
            steps[name].resources = sizes[name]
    for name, step in steps.items():
        if job.tier and name != "train":
            step.queue_settings = {"job_tier": job.tier}
        if job.timeout_s:  # each step's own limit (a sweep's are its file's: --timeout is refused with it)
            step.limits = {"timeout": job.timeout_s}
    shape = job.shape if plan.sweep is None else f"sweep {plan.sweep.name}"
    pipeline = PipelineJob(
        jobs=steps,
        compute=None if serverless else plan.compute,
        experiment_name=plan.experiment,
        display_name=f"{plan.components.task}: train ({shape}) -> evaluate -> register -> score",
        description=f"scripts.pipeline of {' + '.join(plan.components.configs)}",
        tags={"metric": plan.metric, "threshold": str(plan.threshold), "model_name": plan.model_name},
    )
    if serverless:  # Azure ML's documented way for pipelines: serverless as the default compute of every step
        pipeline.settings.default_compute = SERVERLESS
    return pipeline


def step_sizes(plan: PipelinePlan) -> dict[str, dict[str, str]]:
    """Each step's serverless VM size, as its resources take it: --instance_type for train and evaluate (a GPU size
    when the configs run on GPUs: evaluate's `scripts.train test` runs on them too); register and score run on CPUs
    (MLflow, ONNX Runtime), so they get a CPU size given, and with a GPU size none: Azure ML picks a CPU VM."""
    given = {"instance_type": plan.instance_type} if plan.instance_type else {}
    cpu = {} if GPU_SIZE.match(plan.instance_type or "") else given
    return {"train": given, "evaluate": given, "register": cpu, "score": cpu}


def pipeline_yaml(job, folder: Path = Path(".")) -> str:
    """The pipeline as `az ml job create -f` takes it from a file in `folder`: every step's code path relative to that
    folder (the SDK writes this machine's absolute path), local inputs as the paths they are."""
    data = dumped(job)
    code = os.path.relpath(Path.cwd(), folder.resolve())
    for name, step in data["jobs"].items():
        component = step.get("trial") if step.get("type") == "sweep" else step.get("component")
        if isinstance(component, dict) and "code" in component:
            component["code"] = code
        node = job.jobs[name]
        for key, given in (node.inputs or {}).items():
            path = getattr(getattr(given, "_data", None), "path", None)
            if path and is_local(path) and isinstance(step.get("inputs", {}).get(key), dict):
                step["inputs"][key]["path"] = path
    return yaml.safe_dump(data, sort_keys=False)
