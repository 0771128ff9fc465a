"""A sweep file (configs/sweeps/<task>.yaml), read and checked: what both runners of a sweep take, Optuna on this
machine (scripts.sweep) and an Azure ML sweep job (scripts.submit --sweep).

    python -m scripts.sweep configs/sweeps/penguins.yaml
    python -m scripts.submit configs/penguins.yaml --sweep configs/sweeps/penguins.yaml --compute cpu-cluster

The file names the task's config, the objective, how trials are drawn, the budget, the early-termination policy,
options every trial gets (`fixed`) and the search space, each option with one distribution (docs/sweeps.md, "The
sweep file").

Reading the file is plain Python: a mistake in it costs no import of torch, Optuna or the Azure SDK. What only the
training CLI can tell (an option it has not, a value it refuses, an objective the fit does not log) is checked by
scripts/sweeps/preflight.py, before any trial.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

KINDS = ("choice", "uniform", "loguniform", "quniform", "int")
ALGORITHMS = ("random", "grid", "bayesian")  # Azure ML's words; bayesian runs as Optuna's TPE locally
POLICIES = ("median", "bandit", "none")
GOALS = ("maximize", "minimize")
# Options the sweep sets itself: each trial's seed, where its run and checkpoints go; and the data split's seed,
# which must stay the config's so that every trial is measured on the same validation rows.
RESERVED = {
    "seed_everything": "each trial's seed is the sweep's seed plus the trial number",
    "checkpoint_dir": "each trial has its own folder",
    "trainer.logger": "each trial logs into its own MLflow run",
    "data.init_args.seed": "the split must be the same for every trial, or their metrics do not compare",
}
SECTIONS = {
    "config": "the task's config, e.g. config: configs/penguins.yaml",
    "objective": "objective: {metric: val_acc, goal: maximize}",
    "sampling": "sampling: {algorithm: random, seed: 42}",
    "budget": "budget: {trials: 20}",
    "early_termination": "early_termination: {policy: median, delay_evaluation: 5}",
    "fixed": "options every trial gets, e.g. fixed: {trainer.max_epochs: 30}",
    "search_space": "search_space: {model.optimizer.init_args.lr: {loguniform: [1.0e-4, 1.0e-1]}}",
}


class SweepError(Exception):
    """A sweep file that cannot run; the message names the file, the key and what to give."""


@dataclass(frozen=True)
class Param:
    option: str  # the dotted CLI name, e.g. model.optimizer.init_args.lr
    kind: str  # one of KINDS
    args: tuple  # choice: the values; uniform, loguniform: (lo, hi); quniform: (lo, hi, q); int: (lo, hi, step)

    def representatives(self) -> list:
        """Values to try the option with before any trial: every choice, the bounds of a range."""
        if self.kind == "choice":
            return list(self.args)
        return [self.args[0], self.args[1]]

    def grid_values(self) -> list | None:
        """Every value, for grid sampling; None for a continuous range."""
        if self.kind == "choice":
            return list(self.args)
        if self.kind == "int":
            return list(range(self.args[0], self.args[1] + 1, self.args[2]))
        return None


@dataclass(frozen=True)
class Termination:
    policy: str = "none"
    delay_evaluation: int = 0  # epochs before a trial may be stopped
    evaluation_interval: int = 1  # epochs between evaluations
    startup_trials: int = 5  # median, locally: trials that must have finished before any is stopped
    slack_factor: float | None = None  # bandit: stop a trial worse than the best by this ratio...
    slack_amount: float | None = None  # ...or by this amount


@dataclass(frozen=True)
class Sweep:
    path: str
    configs: tuple[str, ...]
    metric: str
    goal: str
    algorithm: str
    seed: int
    trials: int | None
    time_s: int | None
    trial_time_s: int | None
    concurrent_trials: int
    termination: Termination
    fixed: dict = field(default_factory=dict)
    params: tuple[Param, ...] = ()

    @property
    def name(self) -> str:
        return Path(self.path).stem

    def fingerprint(self) -> dict:
        """What makes two runs of a file the same study: the configs, the objective, the fixed options, the space.
        The configs by their contents too, and the config files they or the options point to (`nested`): trials
        trained on a config file since edited are not comparable. Not the data a config points to (a dataset may
        be gigabytes, read at every start): a dataset changed in place is the user's to give a new study."""
        values = [*self.fixed.values(), *(p.args for p in self.params if p.kind == "choice")]
        return {
            "configs": list(self.configs),
            "contents": {config: digest(config) for config in self.configs},
            "nested": {path: digest(path) for path in nested_configs(self.configs, values)},
            "objective": [self.metric, self.goal],
            "fixed": {key: self.fixed[key] for key in sorted(self.fixed)},
            "search_space": {p.option: [p.kind, list(p.args)] for p in self.params},
        }


def digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def nested_configs(configs: tuple[str, ...] | list[str], values: list) -> list[str]:
    """The YAML files that `configs`, and then those files, point to, and those that option `values` (fixed, choices)
    name, each once: jsonargparse reads a value that names a file as that file's contents where it takes a config
    (`config: base.yaml`, `model: model.yaml`, `data: data.yaml`, `model.network: net.yaml`, a callback), a file's
    path relative to the folder of the file naming it, an option's relative to this one. YAML only: the data files
    a config names (a CSV, an idx file) are not its definition, and may be large."""
    found: list[str] = []
    seen = {os.path.normpath(config) for config in configs}

    def walk(value, folder: Path) -> None:
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list | tuple):
            for item in value:
                walk(item, folder)
            return
        if not isinstance(value, str) or not value.endswith((".yaml", ".yml")):
            return
        path = os.path.normpath(folder / value)
        if path in seen or not Path(path).is_file():
            return
        seen.add(path)
        found.append(path)
        read(path)

    def read(path: str) -> None:
        # One the CLI cannot read, it says so itself; here only its digest counts.
        with contextlib.suppress(OSError, UnicodeDecodeError, yaml.YAMLError):
            walk(yaml.safe_load(Path(path).read_text()), Path(path).parent)

    for config in configs:
        read(config)
    walk(values, Path("."))
    return found


def load_sweep(path: str) -> Sweep:
    """Reads and checks the sweep file at `path`; a mistake raises SweepError naming the key and the fix."""
    file = Path(path)
    if not file.is_file():
        raise SweepError(f"{path}: no such sweep file; give one like configs/sweeps/penguins.yaml")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SweepError(f"{path}{where}: not valid YAML ({getattr(error, 'problem', None) or error})") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: give a mapping with {', '.join(SECTIONS)}")
    for key in data:
        if key not in SECTIONS:
            raise SweepError(f"{path}: unknown key {key!r}; the keys are {', '.join(SECTIONS)}")
    for key in ("config", "objective", "search_space"):
        if data.get(key) in (None, {}, []):
            raise SweepError(f"{path}: {key} is missing; give {SECTIONS[key]}")

    def fail(key: str, message: str):
        raise SweepError(f"{path}: {key}: {message}")

    configs = data["config"] if isinstance(data["config"], list) else [data["config"]]
    for config in configs:
        if not isinstance(config, str) or not Path(config).is_file():
            fail("config", f"{config!r} is not a config file here; give a path like configs/penguins.yaml")

    objective = section(data, "objective", ("metric", "goal"), fail)
    metric, goal = objective.get("metric"), objective.get("goal")
    if not isinstance(metric, str) or not metric:
        fail("objective.metric", "missing; give the epoch metric to optimise, e.g. val_acc or val_loss")
    if goal not in GOALS:
        fail("objective.goal", f"{goal!r}; give maximize or minimize")
    # The modules log <split>_loss and <split>_acc (the register step compares them so too): the other goal of one of
    # them makes the worst trial the best, and best.yaml its values, without a word.
    natural = next((v for end, v in (("_loss", ("a loss", "minimize")), ("_acc", ("an accuracy", "maximize")))
                    if metric.endswith(end)), None)  # fmt: skip
    if natural and goal != natural[1]:
        fail(
            "objective.goal", f"{goal} of {metric}, {natural[0]}, picks the worst trial as the best; give {natural[1]}"
        )

    sampling = section(data, "sampling", ("algorithm", "seed"), fail)
    algorithm = sampling.get("algorithm", "random")
    if algorithm not in ALGORITHMS:
        fail("sampling.algorithm", f"{algorithm!r}; give one of {', '.join(ALGORITHMS)}")
    seed = sampling.get("seed", 0)
    if not is_int(seed) or seed < 0:
        fail("sampling.seed", f"{seed!r}; give a whole number, 0 or more")

    budget = section(data, "budget", ("trials", "time", "trial_time", "concurrent_trials"), fail)
    trials = budget.get("trials")
    if trials is not None and (not is_int(trials) or trials < 1):
        fail("budget.trials", f"{trials!r}; give a whole number of trials, 1 or more")
    time_s = duration(budget.get("time"), "budget.time", fail)
    if trials is None and time_s is None:
        fail("budget", "give trials, time, or both, e.g. budget: {trials: 20, time: 1h}")
    concurrent = budget.get("concurrent_trials", 1)
    if not is_int(concurrent) or concurrent < 1:
        fail("budget.concurrent_trials", f"{concurrent!r}; give a whole number, 1 or more")

    termination = read_termination(section(data, "early_termination", tuple(Termination.__dataclass_fields__), fail))
    if isinstance(termination, str):
        fail("early_termination", termination)

    fixed = data.get("fixed") or {}
    if not isinstance(fixed, dict):
        fail("fixed", "give a mapping of option: value, e.g. {trainer.max_epochs: 30}")
    space = data["search_space"]
    if not isinstance(space, dict):
        fail("search_space", f"give a mapping of option: distribution, e.g. {SECTIONS['search_space'][14:]}")
    params = []
    for option, spec in space.items():
        params.append(read_param(str(option), spec, lambda message, o=option: fail(f"search_space.{o}", message)))
    for option in [*fixed, *space]:
        for reserved, why in RESERVED.items():
            if option == reserved or str(option).startswith(f"{reserved}."):
                where = "fixed" if option in fixed else "search_space"
                fail(f"{where}.{option}", f"the sweep sets it itself: {why}")
        if option in fixed and option in space:
            fail(f"fixed.{option}", "also in search_space; give it in one of them")
    if algorithm == "grid":
        for param in params:
            if param.grid_values() is None:
                fail(f"search_space.{param.option}", f"grid sampling needs choice or int, not {param.kind}")
    return Sweep(
        path=str(path),
        configs=tuple(configs),
        metric=metric,
        goal=goal,
        algorithm=algorithm,
        seed=seed,
        trials=trials,
        time_s=time_s,
        trial_time_s=duration(budget.get("trial_time"), "budget.trial_time", fail),
        concurrent_trials=concurrent,
        termination=termination,
        fixed=dict(fixed),
        params=tuple(sorted(params, key=lambda p: not p.option.endswith(".class_path"))),  # a class before its args
    )


def section(data: dict, key: str, allowed: tuple[str, ...], fail) -> dict:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        fail(key, f"give a mapping, e.g. {SECTIONS[key]}")
    for name in value:
        if name not in allowed:
            fail(f"{key}.{name}", f"unknown; {key} takes {', '.join(allowed)}")
    return value


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def duration(value, key: str, fail) -> int | None:
    """Seconds from 90, '90s', '30m' or '2h'."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*([smh]?)\s*", str(value)) if not isinstance(value, bool) else None
    if not match or int(match.group(1)) < 1:
        fail(key, f"{value!r}; give seconds or a duration like 90s, 30m, 2h")
    return int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def read_termination(given: dict) -> Termination | str:
    """The early-termination section, or what is wrong with it."""
    policy = str(given.get("policy", "none")).lower()
    if policy not in POLICIES:
        return f"policy {given.get('policy')!r}; give median, bandit or none"
    for key in ("delay_evaluation", "evaluation_interval", "startup_trials"):
        value = given.get(key, getattr(Termination, key))
        if not is_int(value) or value < (1 if key == "evaluation_interval" else 0):
            return f"{key} {value!r}: give a whole number of {'trials' if key == 'startup_trials' else 'epochs'}"
    factor, amount = given.get("slack_factor"), given.get("slack_amount")
    if policy == "bandit":
        if (factor is None) == (amount is None):
            return "bandit needs one of slack_factor (a ratio, e.g. 0.1) or slack_amount (in the metric's units)"
        for key, value in (("slack_factor", factor), ("slack_amount", amount)):
            if value is not None and not (is_number(value) and value > 0):
                return f"{key} {value!r}: give a number above 0"
    elif factor is not None or amount is not None:
        return f"slack_factor and slack_amount belong to policy bandit, not {policy}"
    return Termination(
        policy=policy,
        delay_evaluation=given.get("delay_evaluation", 0),
        evaluation_interval=given.get("evaluation_interval", 1),
        startup_trials=given.get("startup_trials", 5),
        slack_factor=factor,
        slack_amount=amount,
    )


def read_param(option: str, spec, fail) -> Param:
    example = "e.g. {loguniform: [1.0e-4, 1.0e-1]} or {choice: [16, 32]}"
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", option):
        fail("not an option name; give its dotted name as --print_config prints it, e.g. model.optimizer.init_args.lr")
    if not isinstance(spec, dict) or len(spec) != 1:
        fail(f"give one distribution ({', '.join(KINDS)}), {example}")
    ((kind, args),) = spec.items()
    if kind not in KINDS:
        fail(f"unknown distribution {kind!r}; give one of {', '.join(KINDS)}")
    if kind == "choice":
        if not isinstance(args, list) or not args:
            fail("choice needs a list of values, e.g. {choice: [16, 32, 64]}")
        if any(isinstance(value, dict | list) for value in args):
            fail("choice values are numbers, strings, true/false or null")
        if len({repr(value) for value in args}) != len(args):
            fail(f"choice has a value twice: {args}")
        return Param(option, kind, tuple(args))
    arity = {"uniform": 2, "loguniform": 2, "quniform": 3, "int": (2, 3)}[kind]
    forms = {"uniform": "[low, high]", "loguniform": "[low, high]", "quniform": "[low, high, q]"}
    form = forms.get(kind, "[low, high] or [low, high, step]")
    if not isinstance(args, list) or len(args) not in (arity if isinstance(arity, tuple) else (arity,)):
        fail(f"{kind} takes {form}; got {args!r}")
    if not all(is_number(value) for value in args):
        fail(f"{kind} takes numbers {form}; got {args!r}")
    low, high = args[0], args[1]
    if not low < high:
        fail(f"{kind}: low {low} must be below high {high}")
    if kind == "loguniform" and low <= 0:
        fail(f"loguniform needs low above 0; got {low}")
    if kind == "quniform":
        if not args[2] > 0:
            fail(f"quniform needs q above 0; got {args[2]}")
        if any(abs(bound / args[2] - round(bound / args[2])) > 1e-9 for bound in (low, high)):
            fail(f"quniform: low {low} and high {high} must be multiples of q {args[2]} (its values are)")
    if kind == "int":
        if not all(is_int(value) for value in args):
            fail(f"int takes whole numbers {form}; got {args!r} (uniform for real numbers)")
        step = args[2] if len(args) == 3 else 1
        if step < 1 or (high - low) % step:
            fail(f"int: step {step} must be 1 or more and divide high - low ({high - low})")
        return Param(option, kind, (low, high, step))
    return Param(option, kind, tuple(float(value) for value in args))


def cli_value(value) -> str:
    """A value as the training CLI takes it after --option."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def option_args(values: dict) -> list[str]:
    """--option value pairs for scripts.train, a class path before its class's arguments."""
    ordered = sorted(values, key=lambda option: not option.endswith(".class_path"))
    return [item for option in ordered for item in (f"--{option}", cli_value(values[option]))]
