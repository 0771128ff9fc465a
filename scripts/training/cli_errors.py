"""How scripts.train ends after an error (`exit_for`), which errors are a user's (`user_errors`: printed as one
line), and one line for a command-line mistake that jsonargparse explains over many: the option, the value given and
what fits; a --config file that is not valid YAML with its line and column. Every command prints these; loaded only
when something went wrong, or by the other commands' `run_cli`.

    python -m scripts.train fit --config configs/penguins.yaml --trainer.max_epochs many   # one line, exit 1
"""

from __future__ import annotations

import errno
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from jsonargparse import ArgumentError


def config_error_line(error: ArgumentError, args: list[str]) -> str:
    """jsonargparse explains a bad option over many lines; this keeps the culprit, what was given and what fits."""
    text = str(error)
    if text.startswith("Problems parsing config"):  # a YAML syntax error, in one of the --config files
        return yaml_error_line(args) or text.splitlines()[0]
    if missing := re.search(r"File does not exist: '([^']+)'", text):
        return f"--config {missing[1]}: no such file; give a YAML file such as configs/penguins.yaml"
    lines = [line.strip(" -") for line in text.splitlines() if line.strip(" -")]
    keys = re.findall(r'Parser key "([^"]+)"', text)
    # A class's own option (data: a datamodule's, model.optimizer: the optimizer's) is reported by its own name.
    key = f"{keys[0]}.init_args.{'.'.join(keys[1:])}" if len(keys) > 1 else keys[0] if keys else ""
    class_path = re.search(r"class_path='([\w.]+)'|NestedArg\(key='class_path', val='([\w.]+)'\)", text)
    if key and (option := re.search(r"Option '(\w+)' is not accepted", text)):  # an argument the class does not take
        owner = re.search(r"class_path '([\w.]+)'|class_path='([\w.]+)'", text)
        of = f"{owner[1] or owner[2]} takes no such argument; " if owner else ""
        return f"unrecognized arguments: --{key}.init_args.{option[1]} ({of}check the name against --print_config)"
    missing = re.search(r"module '([\w.]+)' has no attribute '(\w+)'", text)
    if key and missing and (line := no_such_name_line(key, missing[1], missing[2])):  # a typo in a class's name
        return line
    unusable = re.search(
        r"has no attribute|No module named|to be a subclass of|does not correspond to a subclass", text
    )
    if key and class_path and unusable:  # a class that cannot be imported, or is not of the kind the option takes
        name = class_path[1] or class_path[2]
        if wanted := re.search(r"does not correspond to a subclass of (\w+)", text):
            return f"{key}: {name} is not a {wanted[1]}; give a class derived from it, as configs/ do"
        reason = re.search(r"callable class: (.+?)\.*(?: Got value|$)", text, re.M)
        return f"{key}: {name} cannot be used here ({reason[1] if reason else lines[-1]}); give a class as configs/ do"
    given = re.search(r"(?:Given value|Got value): (.*?)(?:\. Got value: |\n|$)", text)
    if key and given:
        expected = [name for name in re.findall(r"Expected a <class '([\w.]+)'>", text) if name != "NoneType"]
        for values in re.findall(r"Expected a typing\.Literal\[(.*)\]", text):  # choices: list them
            expected += [value.strip().strip("'") for value in values.split(",")]
        wanted = f"; give {' or '.join(dict.fromkeys(expected))}" if expected else ""
        return f"{key}: {given.group(1).strip()!r} is not a valid value{wanted}"
    if "unrecognized arguments" in text or "does not accept" in text:
        return f"{lines[0]} (check the name against --print_config)"
    return lines[0]


def no_such_name_line(key: str, module_name: str, name: str) -> str | None:
    """`key` names `module_name.name`, and the module has no such class (nor, for a package, submodule): the names
    closest to it, as a typo of a module's name gets them from Python."""
    import difflib
    import importlib
    import pkgutil

    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 (whatever the module raises, the line without the names)
        return None
    names = [attribute for attribute, value in vars(module).items() if isinstance(value, type)]
    if hasattr(module, "__path__"):
        names += [found.name for found in pkgutil.iter_modules(module.__path__)]
    close = difflib.get_close_matches(name, [n for n in names if not n.startswith("_")], n=3)
    closest = f" (closest: {', '.join(f'{module_name}.{n}' for n in close)})" if close else ""
    return (
        f"{key}: {module_name}.{name}: {module_name} has no class or module {name}{closest}; give a class that "
        "exists, as configs/ do"
    )


def yaml_error_line(args: list[str]) -> str | None:
    """The first --config file that is not valid YAML, with the line and column of the mistake."""
    import yaml

    paths = [value for option, value in zip(args, args[1:]) if option == "--config"]
    paths += [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]
    for path in paths:
        try:
            yaml.safe_load(Path(path).read_text())
        except OSError:
            continue
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            return f"{path}{where}: not valid YAML ({getattr(error, 'problem', None) or error}); fix the file there"
    return None


def argument_error_line(text: str) -> str:
    """jsonargparse's many lines about a bad option, as one: the option, the value given, what it takes."""
    key = re.search(r'Parser key "([^"]+)"', text)
    given = re.search(r"(?:Got|Given) value: (.*?)(?:\n|$)", text)  # Given: of an Optional[...] option
    if key and given:
        expected = re.search(r"Expected a (?:typing\.Literal\[(.*?)\]|<class '(\w+)'>)", text)
        wanted = ""
        if expected:
            wanted = f"; give {expected.group(1).replace(chr(39), '') if expected.group(1) else expected.group(2)}"
        return f"--{key.group(1)}: {given.group(1).strip()!r} is not a valid value{wanted}"
    return text.strip().splitlines()[0]


def run_cli(
    components: Callable | dict[str, Callable],
    command: str,
    errors: tuple[type[Exception], ...],
    args: list[str] | None = None,
) -> Any:
    """Runs `components` (a function, or subcommands by name) as jsonargparse's auto_cli does, on `args` (else
    sys.argv's), for `python -m command`; a bad option or any of `errors` ends in one line on stderr and exit status 1.
    Returns the function's answer."""
    from jsonargparse import auto_cli

    try:
        return auto_cli(components, args=args, as_positional=True, exit_on_error=False)
    except ArgumentError as error:
        sys.exit(f"error: {argument_error_line(str(error))} (python -m {command} --help lists the options)")
    except errors as error:
        sys.exit(f"error: {error}")


def full_disk_line(error: BaseException) -> str | None:
    """One line for a write that found its disk full (the system's ENOSPC or a quota; sqlite's own words for it),
    wherever in `error`'s chain it is; None when it is not that."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f"{cause.filename}: " if cause.filename else ""
            return f"{where}no space left on the device; free space there, or write to a folder on another disk"
        if isinstance(cause, OSError) and cause.errno == errno.EFBIG:
            return file_too_large_line(cause)
        if "disk I/O error" in str(cause) and file_size_limit() is not None:  # sqlite's words for EFBIG
            return file_too_large_line(OSError(errno.EFBIG, "File too large"))
        if "database or disk is full" in str(cause):
            return (
                "the MLflow store's disk is full (sqlite: database or disk is full); free space there, or give "
                "--trainer.default_root_dir (or MLFLOW_TRACKING_URI) a store on another disk"
            )
        cause = cause.__cause__ or cause.__context__
    return None


def file_size_limit() -> int | None:
    """This process's file-size limit in bytes (`ulimit -f`, RLIMIT_FSIZE), None where there is none."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def file_too_large_line(error: OSError) -> str:
    """A write past the process's file-size limit, or past the largest file its filesystem holds (FAT32's 4 GiB)."""
    where = f"{error.filename}: " if error.filename else ""
    if (limit := file_size_limit()) is None:
        return f"{where}file too large for its filesystem; write to a folder on another filesystem"
    size = f"{limit / 2**20:.1f} MiB" if limit >= 2**20 else f"{limit} bytes"
    return (
        f"{where}file too large: this shell limits files to {size} (`ulimit -f`); raise the limit (`ulimit -f "
        "unlimited`), or write where it does not apply"
    )


def exit_for(error: BaseException, interrupted: bool, args: list[str], several: bool) -> None:
    """scripts.train's end after `error`: exit status 130 for Ctrl-C (a shell's, not Lightning's 1), one line
    `error: ...` and status 1 for a user's mistake (SystemExit's message: scripts.spark and the sweeps read it), told
    to the other processes of the job when `several`; returns for the caller to raise anything else, a crash
    included, which keeps its traceback (those waiting for it still get its line)."""
    if isinstance(error, KeyboardInterrupt) or (interrupted and isinstance(error, SystemExit)):
        sys.exit(128 + signal.SIGINT)
    if isinstance(error, SystemExit):
        if several and isinstance(error.code, str) and error.code.startswith("error: "):  # the CLI's own
            tell_others(error.code.removeprefix("error: "), met=False)
        return
    if isinstance(error, ArgumentError):
        stop_with(config_error_line(error, args), several)
    if isinstance(error, BrokenPipeError):
        # `predict ... | head -1`: the reader has gone. End quietly, as Unix tools do: no traceback, nor Python's
        # "Exception ignored" when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    if (line := error_line(error)) is not None:
        stop_with(line, several)
    if several:  # another process's stop may explain this one's error
        from scripts.training.peer_errors import crash_line, peer_line

        if line := peer_line(error):
            sys.exit(f"error: {line}")
        tell_others(crash_line(error), met=False)


def stop_with(line: str, several: bool) -> NoReturn:
    """Ends this process with `error: line`, and the other processes of its job with it."""
    if several:
        tell_others(line, met=True)
    sys.exit(f"error: {line}")


def tell_others(line: str, met: bool) -> None:
    from scripts.training.early_stops import tell_others

    tell_others(line, met)


def error_line(error: BaseException) -> str | None:
    """The one line `error` ends the command with: a user's mistake somewhere in its chain (jsonargparse wraps what a
    class raises while it is built), or a full disk; None for anything else (a crash keeps its traceback)."""
    cause: BaseException | None = error
    ours = user_errors()
    while cause is not None and not isinstance(cause, ours):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return full_disk_line(error)
    message = str(cause).strip()
    if "\n" in message:  # raised in a DataLoader worker: PyTorch re-raises it with the worker's traceback
        message = message.splitlines()[-1].split(": ", 1)[-1]  # "datamodules.errors.DataError: <message>"
    return message


def user_errors() -> tuple[type[BaseException], ...]:
    """What a user's config, data, checkpoint, weights, launch or tracking can cause: each says what to give instead.
    Looked up among the modules loaded, by name: a class of a module the command did not load (another task's network,
    several processes, a tracking server) cannot have been raised, and this module imports none of theirs."""
    classes = (
        ("lightning.fabric.utilities.exceptions", "MisconfigurationException"),
        ("datamodules.errors", "DataError"),
        ("lightning_modules.classifier", "OptimizerError"),
        ("lightning_modules.classifier", "DivergedError"),
        ("lightning_modules.classifier", "InputShapeError"),
        ("lightning_modules.checkpoint_fit", "NetworkMismatchError"),
        ("lightning_modules.transfer_net", "WeightsError"),
        ("scripts.training.checkpoints", "CheckpointError"),
        ("scripts.training.cli", "ConfigError"),
        ("scripts.training.tracking_server", "TrackingError"),
        ("scripts.training.extras", "ExtraMissing"),
        ("scripts.serving.model_outputs", "OutputError"),
        ("strategies.mpi_environment", "LaunchError"),
    )
    return tuple(getattr(sys.modules[module], name) for module, name in classes if module in sys.modules)
