"""A sweep file (configs/sweeps/<task>.yaml), read and checked: what both runners of a sweep take, Optuna on this
machine (scripts.sweep) and an Azure ML sweep job (scripts.submit --sweep).

    python -m scripts.sweep configs/sweeps/penguins.yaml
    python -m scripts.submit configs/penguins.yaml --sweep configs/sweeps/penguins.yaml --compute cpu-cluster

The file names the task's config, the objective (an epoch metric the module logs, and its goal), how trials are
drawn, the budget, the early-termination policy, options every trial gets (`fixed`) and the search space: options
by their dotted CLI name (as `--print_config` prints them), each with one distribution:

    model.optimizer.init_args.lr: {loguniform: [1.0e-4, 1.0e-1]}   # log10 of it uniform between the bounds
    model.optimizer.init_args.momentum: {uniform: [0.0, 0.99]}
    data.init_args.batch_size: {choice: [10, 20, 40]}               # any values: numbers, strings, true/false
    model.network.init_args.hidden: {int: [5, 32]}                  # integers lo..hi (a step: [4, 64, 4])
    model.network.init_args.dropout: {quniform: [0.0, 0.5, 0.05]}   # uniform, rounded to a multiple of 0.05

Reading the file is plain Python: a mistake in it costs no import of torch, Optuna or the Azure SDK. Whether each
option exists and takes its values is asked of the training CLI itself (`check_options`), and whether the fit logs
the objective of a short fit of two batches (`check_metric`), both before any trial.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import warnings
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


def check_options(sweep: Sweep, configs: list[str] | None = None) -> dict:
    """Asks the training CLI (scripts.train's parser, in this process) whether every option of the search space and
    of `fixed` exists in `configs` (default: the sweep's) and takes every value the sweep may give it; raises
    SweepError naming the first that does not. Imports Lightning (a few seconds, once). Returns the first trial's
    config, flattened, which check_metric's short fit follows where it must."""
    from jsonargparse import ArgumentError

    from scripts.training.cli import cli_main, flatten
    from scripts.training.cli_errors import config_error_line

    configs = list(configs or sweep.configs)
    base = ["fit", *(item for config in configs for item in ("--config", config))]
    first = {param.option: param.representatives()[0] for param in sweep.params}

    def parse(values: dict, culprit: str) -> dict:
        args = [*base, *option_args(values), "--print_config"]
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # LightningCLI's note that this process has arguments of its own
                cli_main(args)
        except SystemExit as done:
            if done.code not in (0, None):
                raise SweepError(f"{sweep.path}: {culprit}: the CLI refused {' '.join(args[1:-1])}") from None
        except ArgumentError as error:
            line = config_error_line(error, args)
            raise SweepError(f"{sweep.path}: {culprit}: {line}") from None
        return flatten(yaml.safe_load(printed.getvalue()) or {})

    known = parse(dict(sweep.fixed), "fixed")
    for where, options in (("fixed", sweep.fixed), ("search_space", [p.option for p in sweep.params])):
        for option in options:
            if option not in known:
                close = [key for key in known if key.rsplit(".", 1)[-1] == option.rsplit(".", 1)[-1]]
                hint = f"; did you mean {close[0]}?" if close else ""
                raise SweepError(
                    f"{sweep.path}: {where}.{option}: no such option in {' + '.join(configs)}{hint} "
                    f"(python -m scripts.train fit --config {configs[0]} --print_config lists them)"
                )
    # Every representative value of every option, several options' at once (a parse costs ~0.3 s of jsonargparse):
    # round i gives each option its i-th value (or its first). Only a round the CLI refuses is tried again an option
    # at a time, to name the culprit.
    representatives = {param.option: param.representatives() for param in sweep.params}
    taken: dict[str, dict[str, object]] = {param.option: {} for param in sweep.params if param.kind == "choice"}
    first_config: dict = {}
    for i in range(max(map(len, representatives.values()), default=0)):
        combined = {option: values[i] if i < len(values) else values[0] for option, values in representatives.items()}
        try:
            parsed = parse({**sweep.fixed, **combined}, "search_space")
        except SweepError:
            for option, value in combined.items():
                if i == 0 or value != first[option]:  # beside the others' first values, which round 0 took
                    values = {**(first if i else {}), option: value}
                    parse({**sweep.fixed, **values}, f"search_space.{option} = {cli_value(value)}")
            raise
        first_config = first_config or parsed
        problem = never_validates(sweep, parsed, combined, configs)
        if problem:
            raise SweepError(f"{sweep.path}: {problem}")
        # Two choices the CLI takes as one value (10 and '10', true and 'true') would be one trial's config twice.
        for option, values in taken.items():
            if i < len(representatives[option]):
                value = json.dumps(parsed.get(option), sort_keys=True, default=str)
                if value in values:
                    raise SweepError(
                        f"{sweep.path}: search_space.{option}: choice {values[value]!r} and "
                        f"{representatives[option][i]!r} are one value for the CLI ({cli_value(parsed.get(option))}); "
                        "give each once"
                    )
                values[value] = representatives[option][i]
    return first_config


def never_validates(sweep: Sweep, config: dict, values: dict, configs: list[str]) -> str | None:
    """Why trials of this (flattened) config would never validate, or None. The objective is reported at
    validation's end, so such trials all fail ('logged no val_loss') one after the other; check_metric cannot see it,
    as its one epoch validates whatever the trials do (check_val_every_n_epoch 2 of 10 epochs is fine)."""

    def named(option: str) -> str:
        where = "fixed." if option in sweep.fixed else "search_space." if option in values else ""
        origin = "" if where else f" (in {' + '.join(configs)})"
        return f"{where}{option} {cli_value(config.get(option))}{origin}"

    never = f"the trials would never validate, so none would log {sweep.metric}"
    limit, every, epochs = (config.get(f"trainer.{key}") for key in ("limit_val_batches", "check_val_every_n_epoch",
                                                                       "max_epochs"))  # fmt: skip
    if is_number(limit) and limit == 0:
        return f"{named('trainer.limit_val_batches')}: {never}; give it above 0 (or leave it out)"
    if is_int(every) and is_int(epochs) and 0 < epochs < every:
        return (
            f"{named('trainer.check_val_every_n_epoch')} with {named('trainer.max_epochs')}: {never}; give "
            f"check_val_every_n_epoch {epochs} or less"
        )
    return None


def check_metric(sweep: Sweep, outputs: Path, config: dict | None = None) -> None:
    """Runs one epoch of two batches of the first trial's fit in this process, without tracking, and checks that the
    objective is among the metrics logged when validation ends (where trials report it: an epoch's train metrics come
    after); a fit that cannot start is reported as its one line. `config` is the first trial's (check_options's): an
    integer val_check_interval there takes that many batches (at most the epoch's), as two would be refused by
    Lightning as above an epoch's batches where the trials' epochs have enough, and one above the epoch's still is."""
    import logging
    import tempfile

    from scripts.train import main as train_main

    first = {param.option: param.representatives()[0] for param in sweep.params}
    interval = (config or {**sweep.fixed, **first}).get("trainer.val_check_interval")
    batches = max(2, interval) if is_int(interval) else 2
    with tempfile.TemporaryDirectory(dir=outputs, prefix=".sweep-check-") as folder:
        names = Path(folder) / "metrics.txt"
        callback = {"class_path": "scripts.sweeps.trial.MetricNames", "init_args": {"path": str(names)}}
        args = [
            "fit", *(item for config in sweep.configs for item in ("--config", config)),
            *option_args({**sweep.fixed, **first}),
            "--trainer.max_epochs", "1", "--trainer.limit_train_batches", str(batches), "--trainer.limit_val_batches",
            "2",
            "--trainer.check_val_every_n_epoch", "1",  # its one epoch validates, whichever epochs the trials do
            "--trainer.num_sanity_val_steps", "0", "--trainer.logger", "false", "--trainer.enable_progress_bar",
            "false", "--trainer.enable_model_summary", "false", "--trainer.default_root_dir", folder,
            "--checkpoint_dir", folder, "--test_after_fit", "false", "--trainer.callbacks+", json.dumps(callback),
        ]  # fmt: skip
        quiet = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
        levels = [logger.level for logger in quiet]
        for logger in quiet:
            logger.setLevel(logging.WARNING)
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                train_main(args)
        except SystemExit as error:
            if error.code not in (0, None):
                message = str(error.code).removeprefix("error: ")
                raise SweepError(f"{sweep.path}: a trial's fit would fail: {message}") from None
        except Exception as error:  # a crash, not a user's mistake: still one line, the trial would meet it too
            raise SweepError(f"{sweep.path}: a trial's fit would fail: {type(error).__name__}: {error}") from None
        finally:
            for logger, level in zip(quiet, levels):
                logger.setLevel(level)
        logged = names.read_text().split() if names.is_file() else []
    if sweep.metric not in logged:
        raise SweepError(
            f"{sweep.path}: objective.metric {sweep.metric} is not a metric the fit logs by each validation's end; "
            f"give one of {', '.join(logged) or '(none logged)'}"
        )
