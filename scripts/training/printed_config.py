"""The config scripts.train resolves from a command line, as its --print_config prints it, asked in this process: the
commands that launch fits elsewhere (an Azure ML job, a sweep's trials) check and read it before anything starts.

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --dry_run true
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable

import yaml


def printed_config(args: list[str], refused: Callable[[str], Exception]) -> dict:
    """The config of `args` (scripts.train's, e.g. ["fit", "--config", "configs/penguins.yaml"]) as --print_config
    prints it; a command line the training CLI refuses raises `refused(its one line)`. Imports Lightning (a few
    seconds, once)."""
    from jsonargparse import ArgumentError

    from scripts.train import cli_main
    from scripts.training.cli_errors import config_error_line

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # LightningCLI's note that this process has arguments of its own
            cli_main([*args, "--print_config"])
    except SystemExit as done:
        if done.code not in (0, None):
            raise refused(f"{' '.join(args[1:])}: the training CLI refused it ({done.code})") from None
    except ArgumentError as error:
        raise refused(config_error_line(error, args)) from None
    return yaml.safe_load(printed.getvalue()) or {}
