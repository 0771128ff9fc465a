"""A sweep's checks before any trial starts, so that a mistake is one line and not a sweep of failed trials: the
training CLI itself (in this process) asked whether every option of the sweep file exists and takes every value the
sweep may give it (`check_options`), and a short fit of two batches whether it logs the objective (`check_metric`).
scripts.sweep runs both; scripts.submit --sweep and scripts.pipeline --sweep the first.

    python -m scripts.sweep configs/sweeps/penguins.yaml
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

from scripts.sweeps.space import Sweep, SweepError, cli_value, is_int, is_number, option_args


def check_options(sweep: Sweep, configs: list[str] | None = None) -> dict:
    """Asks the training CLI (scripts.train's parser, in this process) whether every option of the search space and
    of `fixed` exists in `configs` (default: the sweep's) and takes every value the sweep may give it; raises
    SweepError naming the first that does not. Imports Lightning (a few seconds, once). Returns the first trial's
    config, flattened, which check_metric's short fit follows where it must."""
    from scripts.training.checkpoints import flatten
    from scripts.training.printed_config import printed_config

    configs = list(configs or sweep.configs)
    base = ["fit", *(item for config in configs for item in ("--config", config))]
    first = {param.option: param.representatives()[0] for param in sweep.params}

    def parse(values: dict, culprit: str) -> dict:
        args = [*base, *option_args(values)]
        return flatten(printed_config(args, lambda line: SweepError(f"{sweep.path}: {culprit}: {line}")))

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
    # Every representative value of every option, several options' at once (each parse is a jsonargparse run):
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
