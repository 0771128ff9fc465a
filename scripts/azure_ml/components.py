"""A task's Azure ML command components, generated from its config (nothing kept by hand that could drift): train (the
designer's "Train PyTorch Model": its parameter names, the config's values as defaults), evaluate, register and score.
scripts.pipeline wires them into a pipeline and registers them.

    python -m scripts.pipeline configs/birds.yaml --compute gpu-cluster --components true --version 1 --dry_run true

What each component takes, runs and writes, and how the train step's parameters map onto the designer's, is in
docs/pipelines.md ("The components, and the designer").
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from scripts.azure_ml.errors import SubmitError
from scripts.azure_ml.job_configs import resolved_config, trainer_setting
from scripts.azure_ml.yaml_files import dumped

# The datamodule argument that names the data it trains on, and the Azure ML input type it takes: a folder or a file.
DATA_OPTIONS = {"data_dir": "uri_folder", "csv_path": "uri_file"}
# The datamodules whose csv_path may also be an MLTable (a folder with an MLTable file naming the table), so a
# pipeline's --data and --test_data may be one: datamodules/table.py.
MLTABLE_READERS = ("datamodules.table.TableDataModule",)
COMPONENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,200}")  # Azure ML's rule for a component's name (and room for _train)
EARLY_STOPPING = "EarlyStopping"
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class Parameter:
    name: str  # the designer's
    option: str  # scripts.train's
    type: str  # Azure ML's: integer or number
    what: str


# Train PyTorch Model's parameters, in the designer's order, and the scripts.train option each sets; where the option
# means other than the designer's parameter, its description says how (docs/pipelines.md, "The components").
PARAMETERS = (
    Parameter("epochs", "trainer.max_epochs", "integer", "epochs to train at most"),
    Parameter("batch_size", "data.init_args.batch_size", "integer", "examples per step and process"),
    Parameter(
        "warmup_step_number",
        "model.warmup_steps",
        "integer",
        "optimizer steps of linear learning rate warm-up "
        "from 0 (the designer's counts epochs: for E epochs give E x an epoch's steps)",
    ),
    Parameter(
        "learning_rate",
        "model.optimizer.init_args.lr",
        "number",
        "the optimizer's learning rate, as given (the "
        "designer's is multiplied by the processes' count and decays polynomially: add --model."
        "scale_lr_by_world_size true and --model.poly_decay_power 1 to train_args for those)",
    ),
    Parameter("random_seed", "seed_everything", "integer", "seed of weights, shuffling and augmentation"),
    Parameter("patience", "trainer.callbacks", "integer", "epochs without a better val_loss before stopping"),
    Parameter("print_freq", "trainer.log_every_n_steps", "integer", "steps between logged train_loss points"),
)


@dataclass
class TaskComponents:
    """What the four components of a task are, decided before azure.ai.ml is imported."""

    task: str  # e.g. birds
    prefix: str  # component names: <prefix>_train, ...
    configs: list[str]
    data_option: str | None  # e.g. data.init_args.data_dir
    data_type: str  # uri_folder or uri_file
    parameters: dict[str, tuple[Parameter, object]] = field(default_factory=dict)  # name -> (parameter, default)
    commands: dict[str, str] = field(default_factory=dict)
    sweep_inputs: dict[str, str] = field(default_factory=dict)  # a sweep's own inputs: name -> Azure ML type
    config: dict = field(default_factory=dict)  # the resolved config of the configs and train_args
    # Inputs (training_data, test_data) given an MLTable, whose type is then mltable rather than data_type.
    input_types: dict[str, str] = field(default_factory=dict)

    @property
    def reads_mltable(self) -> bool:
        return value_at(self.config, "data.class_path") in MLTABLE_READERS

    def name(self, step: str) -> str:
        return f"{self.prefix}_{step}"


def check_prefix(prefix: str) -> str:
    if not COMPONENT_NAME.fullmatch(prefix or ""):
        raise SubmitError(
            f"--name {prefix!r}: Azure ML refuses it as a component name's start; give lower-case letters, digits and "
            "'_', starting with a letter, e.g. birds"
        )
    return prefix


def value_at(config: dict, option: str) -> object:
    for key in option.split("."):
        if not isinstance(config, dict) or key not in config:
            return None
        config = config[key]
    return config


def plan_components(configs: list[str], train_args: str = "", prefix: str | None = None, sweep_args: str = "",
                    sweep_inputs: dict[str, str] | None = None) -> TaskComponents:  # fmt: skip
    """The components of `configs` (the task's config, then presets); `train_args` are more scripts.train options of
    the train step, `sweep_args` the `--option ${{inputs.name}}` a sweep's search space adds, with their inputs."""
    task = Path(configs[0]).stem
    prefix = check_prefix(prefix if prefix is not None else re.sub(r"\W", "_", task.lower()))
    config = resolved_config(configs, train_args)
    data_args = value_at(config, "data.init_args") or {}
    data_name = next((name for name in DATA_OPTIONS if name in data_args), None)
    plan = TaskComponents(task, prefix, configs, data_name and f"data.init_args.{data_name}",
                          DATA_OPTIONS.get(data_name, "uri_folder"), sweep_inputs=dict(sweep_inputs or {}),
                          config=config)  # fmt: skip
    parts = []
    for parameter in PARAMETERS:
        if parameter.name == "patience":
            callbacks = trainer_setting(configs, "callbacks")  # as written: the list the CLI takes whole
            stops = [c for c in callbacks or [] if str(c.get("class_path", "")).endswith(EARLY_STOPPING)]
            if len(stops) != 1 or "patience" not in (stops[0].get("init_args") or {}):
                continue
            plan.parameters["patience"] = (parameter, stops[0]["init_args"]["patience"])
            # jsonargparse sets a callback's argument only on the list's last: the list goes whole, patience in it.
            marker = "__patience__"
            stops[0]["init_args"]["patience"] = marker
            text = json.dumps(callbacks, separators=(",", ":")).replace(f'"{marker}"', "${{inputs.patience}}")
            parts.append(f"--trainer.callbacks '{text}'")
            continue
        default = value_at(config, parameter.option)
        wanted = int if parameter.type == "integer" else float
        if isinstance(default, bool) or not isinstance(default, int | float):
            continue  # not in this config (a seed of true, an optimizer without lr): no such parameter
        plan.parameters[parameter.name] = (parameter, wanted(default))
        parts.append(f"--{parameter.option} ${{{{inputs.{parameter.name}}}}}")
    data = f"$[[--{plan.data_option} ${{{{inputs.training_data}}}}]]" if plan.data_option else ""
    config_args = " ".join(f"--config {shlex.quote(path)}" for path in configs)  # the job's shell reads it
    plan.commands["train"] = " ".join(part for part in (
        f"python -m scripts.train fit {config_args}",
        "$[[--config ${{inputs.launch_config}}]]",
        "--trainer.devices ${{inputs.processes_per_node}} --trainer.num_nodes ${{inputs.nodes}}",
        "--checkpoint_dir ${{outputs.checkpoints}} --model_dir ${{outputs.model}}",
        f"--metrics_file ${{{{outputs.metrics}}}}/{METRICS_FILE}",
        data, *parts, train_args, sweep_args,
    ) if part)  # fmt: skip
    test_data = f"$[[--{plan.data_option} ${{{{inputs.test_data}}}}]]" if plan.data_option else ""
    plan.commands["evaluate"] = " ".join(part for part in (
        f"python -m scripts.train test {config_args} --ckpt_path ${{{{inputs.checkpoints}}}}/best.ckpt", test_data,
        f"--metrics_file ${{{{outputs.metrics}}}}/{METRICS_FILE}", data_options(train_args),
    ) if part)  # fmt: skip
    plan.commands["register"] = (
        "python -m scripts.azure_ml.register_step ${{inputs.model}} ${{inputs.metrics}} --name ${{inputs.model_name}} "
        "--metric ${{inputs.metric}} --threshold ${{inputs.threshold}} --output ${{outputs.model}}"
    )
    plan.commands["score"] = (
        "python -m scripts.score ${{inputs.model}} ${{inputs.data}} --output ${{outputs.predictions}}"
    )
    return plan


def data_options(train_args: str) -> str:
    """The --data.* options of `train_args`: the evaluate step reads the data as the train step does."""
    tokens, kept = shlex.split(train_args), []
    for index, token in enumerate(tokens):
        if token.startswith("--data."):
            kept.append(token)
            if "=" not in token and index + 1 < len(tokens):
                kept.append(tokens[index + 1])
    return shlex.join(kept)


def build_components(plan: TaskComponents, environment, version: str | None = None, model_name: str = "",
                     metric: str = "test_acc", threshold: float = 0.9) -> dict:  # fmt: skip
    """The azure.ai.ml CommandComponents by step (train, evaluate, register, score), all on `environment`."""
    from azure.ai.ml import Input, Output
    from azure.ai.ml.entities import CommandComponent

    kind = "a folder" if plan.data_type == "uri_folder" else "a file"
    train_inputs = {
        "training_data": Input(type=plan.input_types.get("training_data", plan.data_type), optional=True,
                               description=f"the data to train on ({kind}); none: the config's own"),
        **{name: Input(type=parameter.type, default=default, description=parameter.what)
           for name, (parameter, default) in plan.parameters.items()},
        **{name: Input(type=kind_, description="searched by the sweep") for name, kind_ in plan.sweep_inputs.items()},
        "nodes": Input(type="integer", default=1, min=1, description="machines: the node's instance count"),
        "processes_per_node": Input(type="integer", default=1, min=1, description="processes on each, one per GPU"),
        "launch_config": Input(type="string", optional=True,
                               description="with several processes: configs/trainer/ddp.yaml or ddp_mpi.yaml"),
    }  # fmt: skip
    if not plan.data_option:
        del train_inputs["training_data"]
    common = {"version": version, "code": ".", "environment": environment}
    components = {
        "train": CommandComponent(
            name=plan.name("train"),
            display_name=f"{plan.task}: Train PyTorch Model",
            description=f"python -m scripts.train fit of {' + '.join(plan.configs)}: the best checkpoint's network as "
            "an MLflow model, resumable checkpoints, metrics",
            inputs=train_inputs,
            outputs={
                "model": Output(type="mlflow_model"),
                "checkpoints": Output(type="uri_folder", mode="rw_mount"),
                "metrics": Output(type="uri_folder"),
            },
            command=plan.commands["train"],
            is_deterministic=False,  # a new fit each time: Azure ML would reuse the last one's outputs
            **common,
        ),
        "evaluate": CommandComponent(
            name=plan.name("evaluate"),
            display_name=f"{plan.task}: Evaluate Model",
            description="python -m scripts.train test of the best checkpoint: test metrics to MLflow and metrics.json",
            inputs={
                "checkpoints": Input(type="uri_folder", description="the train step's checkpoints (best.ckpt)"),
                **(
                    {
                        "test_data": Input(
                            type=plan.input_types.get("test_data", plan.data_type),
                            optional=True,
                            description="data whose test split is evaluated; none: the config's own",
                        )
                    }
                    if plan.data_option
                    else {}
                ),
            },  # fmt: skip
            outputs={"metrics": Output(type="uri_folder")},
            command=plan.commands["evaluate"],
            **common,
        ),
        "register": CommandComponent(
            name=plan.name("register"),
            display_name=f"{plan.task}: Register Model",
            description="registers the model when the evaluation's metric reaches the threshold; passes it on",
            inputs={
                "model": Input(type="mlflow_model"),
                "metrics": Input(type="uri_folder", description="the evaluate step's metrics (metrics.json)"),
                "model_name": Input(type="string", default=model_name or f"{plan.task}-classifier"),
                "metric": Input(
                    type="string", default=metric, description="test_acc (at least) or test_loss (at most)"
                ),
                "threshold": Input(type="number", default=threshold),
            },
            outputs={"model": Output(type="mlflow_model")},
            command=plan.commands["register"],
            is_deterministic=False,  # registering is its effect: never skipped as already done
            **common,
        ),
        "score": CommandComponent(
            name=plan.name("score"),
            display_name=f"{plan.task}: Score Model",
            description="python -m scripts.score: predictions.csv (input, class, probability) of a folder or a CSV",
            inputs={"model": Input(type="mlflow_model"), "data": Input(type=plan.data_type)},
            outputs={"predictions": Output(type="uri_folder")},
            command=plan.commands["score"],
            **common,
        ),
    }
    return components


def component_yaml(component, folder: Path = Path(".")) -> str:
    """The component as `az ml component create -f` takes it from a file in `folder`: its code path relative to it."""
    import os

    data = dumped(component)
    data["code"] = os.path.relpath(Path.cwd(), folder.resolve())
    return yaml.safe_dump(data, sort_keys=False)
