"""A sweep file as an Azure ML sweep job: the same search space, objective, budget and early termination that
scripts.sweep runs with Optuna here, run by Azure ML over the trials of a command job.

    python -m scripts.submit configs/penguins.yaml --sweep configs/sweeps/penguins.yaml --compute cpu-cluster
    python -m scripts.submit configs/mnist.yaml --sweep configs/sweeps/mnist.yaml --compute gpu-cluster \\
        --presets+ configs/trainer/gpu.yaml --nodes 2 --processes_per_node 4 --dry_run true > sweep.yml

Each trial runs scripts.submit's command with the file's `fixed` options and `--<option> ${{search_space.<name>}}`
for each searched one; option names hold dots, which a search space key cannot (`search_space_names` maps them, the
job's tags name them back). How the file's distributions, sampling, objective, early termination and budget map onto
Azure ML's, and how its trials differ from local ones, is in docs/sweeps.md ("As an Azure ML sweep job").
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml

from scripts.sweeps.space import Sweep, SweepError, cli_value, option_args

MAX_AZURE_TRIALS = 1000  # Azure ML's limit on max_total_trials, used when the file gives only a time budget
MAX_CHOICES = 1000  # an int range wider than this is a Choice too long to send: give quniform or a step
BAYESIAN_KINDS = ("choice", "int", "uniform", "quniform")  # int goes as a Choice


def search_space_names(sweep: Sweep) -> dict[str, str]:
    """Option -> the search space key that stands for it in Azure ML (letters, digits and _ only)."""
    names: dict[str, str] = {}
    for param in sweep.params:
        name = re.sub(r"\W", "_", param.option)
        while name in names.values():
            name += "_"
        names[param.option] = name
    return names


def check_for_azure(sweep: Sweep) -> None:
    """What Azure ML refuses that Optuna takes, and options the job sets from its processes; raises SweepError
    before the Azure SDK is imported."""
    from scripts.azure_ml.job_plan import LAUNCH_OPTIONS

    for where, options in (("fixed", list(sweep.fixed)), ("search_space", [p.option for p in sweep.params])):
        for option in options:
            key = option.removeprefix("trainer.")
            if option.startswith("trainer.") and key in LAUNCH_OPTIONS:
                raise SweepError(f"{sweep.path}: {where}.{option}: the job's processes decide it; give submit's "
                                 f"{LAUNCH_OPTIONS[key]}")  # fmt: skip
    if sweep.algorithm == "bayesian" and sweep.termination.policy != "none":
        raise SweepError(
            f"{sweep.path}: Azure ML's bayesian sampling takes no early termination: give sampling.algorithm random, "
            "or early_termination.policy none"
        )
    for param in sweep.params:
        # Azure ML documents it so (Hyperparameter tuning a model (v2)); the SDK sends the job all the same.
        if sweep.algorithm == "bayesian" and param.kind not in BAYESIAN_KINDS:
            raise SweepError(
                f"{sweep.path}: search_space.{param.option}: Azure ML's bayesian sampling takes choice, int, uniform "
                f"and quniform, not {param.kind}; give sampling.algorithm random, or {param.option} a uniform range "
                "or a choice of values"
            )
        for value in param.grid_values() if param.kind == "choice" else ():
            # Azure ML writes the drawn value into the trial's command as it is, and a shell runs that command.
            if isinstance(value, str) and quote(value) != value:
                raise SweepError(
                    f"{sweep.path}: search_space.{param.option}: choice {value!r} would not reach the trial as one "
                    "value (Azure ML writes it into a shell command as it is); give values without spaces, quotes "
                    "or shell characters"
                )
        if param.kind == "int" and len(param.grid_values()) > MAX_CHOICES:
            raise SweepError(
                f"{sweep.path}: search_space.{param.option}: int {list(param.args)} is {len(param.grid_values())} "
                f"values, more than Azure ML's choice takes here ({MAX_CHOICES}); give a step, e.g. "
                f"{{int: [{param.args[0]}, {param.args[1]}, {math.ceil(len(param.grid_values()) / MAX_CHOICES)}]}}"
            )


def trial_args(sweep: Sweep) -> str:
    """The options a trial adds to the training command: the fixed ones, then one search space reference each."""
    names = search_space_names(sweep)
    fixed = option_args(sweep.fixed)
    fixed_text = " ".join(f"{fixed[i]} {quote(fixed[i + 1])}" for i in range(0, len(fixed), 2))
    searched = " ".join(f"--{option} ${{{{search_space.{name}}}}}" for option, name in names.items())
    return " ".join(part for part in (fixed_text, searched) if part)


def quote(value: str) -> str:
    import shlex

    return shlex.quote(value)


def distribution(param):
    """The azure.ai.ml.sweep distribution of a search space entry."""
    from azure.ai.ml.sweep import Choice, LogUniform, QUniform, Uniform

    if param.kind in ("choice", "int"):
        values = param.grid_values()
        # Numbers and strings go as they are; true/false/null as the CLI spells them (Azure ML writes the value).
        return Choice([value if is_plain(value) else cli_value(value) for value in values])
    low, high = param.args[0], param.args[1]
    if param.kind == "uniform":
        return Uniform(min_value=low, max_value=high)
    if param.kind == "loguniform":
        return LogUniform(min_value=math.log(low), max_value=math.log(high))
    return QUniform(min_value=low, max_value=high, q=param.args[2])


def is_plain(value) -> bool:
    return isinstance(value, int | float | str) and not isinstance(value, bool)


def sampling(sweep: Sweep):
    from azure.ai.ml.sweep import BayesianSamplingAlgorithm, GridSamplingAlgorithm, RandomSamplingAlgorithm

    if sweep.algorithm == "grid":
        return GridSamplingAlgorithm()
    if sweep.algorithm == "bayesian":
        return BayesianSamplingAlgorithm()
    return RandomSamplingAlgorithm(seed=sweep.seed)


def early_termination(sweep: Sweep):
    from azure.ai.ml.sweep import BanditPolicy, MedianStoppingPolicy

    termination = sweep.termination
    timing = {"delay_evaluation": termination.delay_evaluation, "evaluation_interval": termination.evaluation_interval}
    if termination.policy == "median":
        return MedianStoppingPolicy(**timing)
    if termination.policy == "bandit":
        slack = {"slack_factor": termination.slack_factor} if termination.slack_factor else {}
        slack = slack or {"slack_amount": termination.slack_amount}
        return BanditPolicy(**slack, **timing)
    return None


def build_sweep_job(command_node, sweep: Sweep, compute: str, tier: str | None = None):
    """The sweep job over `command_node` (scripts.azure_ml.jobs.build_job's command job, whose command already ends with
    trial_args(sweep)), from the sweep file; `tier` is the job tier of its trials (spot, standard)."""
    names = search_space_names(sweep)
    job = sweep_node(command_node, sweep, compute, tier)._to_job()  # the job itself, not the pipeline node wrapping it
    job.display_name = f"{command_node.display_name.split(':')[0]}: sweep {sweep.name}, {sweep.metric} ({sweep.goal})"
    job.experiment_name = command_node.experiment_name
    job.tags = {**(job.tags or {}), **{f"search_space.{name}": option for option, name in names.items()}}
    job.tags["sweep_file"] = sweep.path
    return job


def sweep_node(command_node, sweep: Sweep, compute: str, tier: str | None = None):
    """The sweep node over `command_node`, whose command or inputs take `${{search_space.<name>}}` (a job) or whose
    inputs are named as the search space (a pipeline's train step: scripts/azure_ml/pipelines.py)."""
    names = search_space_names(sweep)
    return command_node.sweep(
        primary_metric=sweep.metric,
        goal=sweep.goal,
        sampling_algorithm=sampling(sweep),
        compute=compute,
        max_total_trials=sweep.trials or MAX_AZURE_TRIALS,
        max_concurrent_trials=sweep.concurrent_trials,
        timeout=sweep.time_s,
        trial_timeout=sweep.trial_time_s,
        early_termination_policy=early_termination(sweep),
        search_space={names[param.option]: distribution(param) for param in sweep.params},
        job_tier=tier,
    )


def sweep_yaml(job, folder: Path = Path(".")) -> str:
    """The sweep job as `az ml job create -f` takes it from a file in `folder`: every local path in it (the trial's
    code, local inputs) relative to that folder."""
    from scripts.azure_ml.job_inputs import is_local
    from scripts.azure_ml.yaml_files import dumped, relative_to

    data = dumped(job)
    data["trial"]["code"] = str(Path.cwd())
    for name, given in (job.inputs or {}).items():
        path = getattr(given, "path", None)
        if path and is_local(path):
            data["inputs"][name]["path"] = path
    return yaml.safe_dump(relative_to(folder, data), sort_keys=False)


def load_for_azure(path: str, configs: list[str]) -> Sweep:
    """The sweep file, checked for Azure ML and against the CLI options of `configs` (the job's configs)."""
    from scripts.sweeps.preflight import check_options
    from scripts.sweeps.space import load_sweep

    sweep = load_sweep(path)
    check_configs(sweep, configs)
    check_for_azure(sweep)
    check_options(sweep, configs)
    return sweep


def check_configs(sweep: Sweep, configs: list[str]) -> None:
    """The job's configs are the file's (its trials train them, as scripts.sweep's do), presets after them allowed."""

    def among(config: str, given: list[str]) -> bool:
        return any(Path(config).resolve() == Path(other).resolve() for other in given)

    if not among(sweep.configs[0], configs[:1]):
        raise SweepError(
            f"{sweep.path}: config {sweep.configs[0]} is not the job's task, {configs[0]} (its trials would train "
            f"that); give the job {sweep.configs[0]}, or a sweep file of {configs[0]}"
        )
    for config in sweep.configs[1:]:
        if not among(config, configs):
            raise SweepError(f"{sweep.path}: config {config} is not among the job's; add --presets+ {config}")
