"""The data a job takes from this machine or from Azure (--inputs OPTION=PATH): its type and mode, and whether a local
file reaches the job's processes (in the uploaded code, under a name the job's shell keeps whole).

    python -m scripts.submit configs/mnist.yaml --compute gpu-cluster --inputs+ data.init_args.data_dir=azureml:mnist:1
    python -m scripts.submit configs/table.yaml --compute cpu-cluster --train_args "--data.init_args.label y" \
        --inputs+ 'data.init_args.csv_path=lake/sales/part-*.parquet'
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from scripts.azure_ml.code_snapshot import is_uploaded
from scripts.azure_ml.errors import SubmitError

INPUT_TYPES = ("uri_folder", "uri_file", "mltable")  # mltable: a folder with an MLTable file (datamodules/table.py)
INPUT_MODES = ("ro_mount", "download", "direct", "eval_mount", "eval_download")
WILDCARDS = "*?["  # a local path holding one is a pattern (datamodules/table_sources.py reads its matches)


@dataclass
class JobInput:
    option: str  # the scripts.train option it is given as, e.g. data.init_args.data_dir
    path: str
    type: str
    mode: str
    pattern: str = ""  # a local pattern's part under `path`, its folder (uploaded whole): `part-*.parquet`

    @property
    def name(self) -> str:
        return self.option.rsplit(".", 1)[-1]  # data.init_args.data_dir -> ${{inputs.data_dir}}

    def value(self, where: str, quote: bool = True) -> str:
        """The option's value, `where` the input's path: the pattern after it, quoted for the job's shell (which would
        otherwise match it itself) unless `quote` is False."""
        return f"{where}/{shlex.quote(self.pattern) if quote else self.pattern}" if self.pattern else where


def split_pattern(path: str) -> tuple[str, str]:
    """A local pattern's folder (its parts before the first with a wildcard) and the pattern under it; (path, "") for a
    path without wildcards."""
    parts = Path(path).parts
    for index, part in enumerate(parts):
        if any(character in part for character in WILDCARDS):
            return (str(Path(*parts[:index])) if index else "."), "/".join(parts[index:])
    return path, ""


def parse_input(item: str) -> JobInput:
    """OPTION=PATH[,type=uri_folder|uri_file|mltable][,mode=ro_mount|download|...]: the type of a local path is what it
    is on disk (a folder holding an MLTable file may be given as mltable); anything else (a data asset
    azureml:NAME:VERSION, a datastore or https URI) is a folder unless given."""
    option, _, rest = item.partition("=")
    path, *settings = rest.split(",")
    if not option or not path or option.startswith("-"):
        raise SubmitError(f"--inputs {item}: give OPTION=PATH, e.g. data.init_args.data_dir=azureml:mnist:1")
    given = {}
    for setting in settings:
        key, _, value = setting.partition("=")
        allowed = {"type": INPUT_TYPES, "mode": INPUT_MODES}.get(key)
        if allowed is None or value not in allowed:
            raise SubmitError(
                f"--inputs {item}: {setting!r} is not type=({'|'.join(INPUT_TYPES)}) or mode=({'|'.join(INPUT_MODES)})"
            )
        given[key] = value
    kind = given.get("type", "uri_folder")
    if is_local(path) and not Path(path).exists() and split_pattern(path)[1]:  # its folder uploaded, matched there
        folder, pattern = split_pattern(path)
        if given.get("type", "uri_folder") != "uri_folder":
            raise SubmitError(f"--inputs {item}: a pattern is uploaded as its folder, {folder}: give type=uri_folder")
        if not Path(folder).is_dir():
            raise SubmitError(f"--inputs {item}: no such folder {folder}")
        if not any(match.is_file() for match in Path(folder).glob(pattern)):
            raise SubmitError(f"--inputs {item}: no file in {folder} matches {pattern}; give a pattern that does")
        return JobInput(option, str(Path(folder).resolve()), "uri_folder", given.get("mode", "ro_mount"), pattern)
    if is_local(path):  # uploaded with the job
        if not Path(path).exists():
            raise SubmitError(f"--inputs {item}: no such file or folder {path}")
        kind = "uri_file" if Path(path).is_file() else "uri_folder"
        if kind == "uri_folder" and given.get("type") == "mltable" and (Path(path) / "MLTable").is_file():
            kind = "mltable"
        if given.get("type", kind) != kind:
            raise SubmitError(f"--inputs {item}: {path} is a {'file' if Path(path).is_file() else 'folder'}")
        if kind == "uri_file":
            check_uploaded_name(Path(path), f"--inputs {item}")
        path = str(Path(path).resolve())
    return JobInput(option, path, kind, given.get("mode", "ro_mount"))


def is_local(path: str) -> bool:
    return "://" not in path and not path.startswith("azureml:")


def left_out_file(value: str) -> bool:
    """Whether `value` names a file here that the job's code (this folder as Azure ML uploads it) does not hold."""
    try:
        return bool(value) and Path(value).is_file() and not is_uploaded(Path.cwd(), value)
    except (OSError, ValueError):  # not a path at all: a name too long for one, a NUL
        return False


def check_uploaded_name(path: Path, given: str) -> None:
    """A local file uploaded as an input keeps its name, which ends its path in the job; Azure ML writes that path into
    the job's command as it is, and a shell runs it: a name the shell would split or expand does not reach the CLI."""
    if shlex.quote(path.name) != path.name:
        raise SubmitError(
            f"{given}: Azure ML writes the uploaded file's path, {path.name!r} at its end, into the job's command as "
            "it is, where a shell would split it; give a copy whose name has no spaces, quotes or shell characters"
        )


def data_paths(config: dict, prefix: str = "") -> dict[str, str]:
    """The resolved config's values that may name data here, by their dotted option: every string under `data` (its
    class's arguments) and `ckpt_path`."""
    found: dict[str, str] = {}
    for key, value in config.items() if isinstance(config, dict) else enumerate(config):
        option = f"{prefix}{key}"
        if isinstance(value, dict | list):
            found.update(data_paths(value, f"{option}."))
        elif isinstance(value, str) and value and option.split(".")[0] in ("data", "ckpt_path"):
            found[option] = value
    return found


def left_out_kind(value: str) -> str | None:
    """'file' or 'folder' when `value` names one here that the job's code (this folder as Azure ML uploads it) does not
    hold: outside this folder, or left out by .amlignore (data/, outputs/, ...); else None (not a path here at all)."""
    try:
        path = Path(value)
        if not path.exists() and split_pattern(value)[1]:  # a pattern: its files here, if it matches any
            folder, pattern = split_pattern(value)
            path = next((match for match in Path(folder).glob(pattern) if match.is_file()), path)
        if not path.exists():
            return None
        probe = value if path.is_file() else os.path.join(value, "_")  # a folder's files are uploaded with it
        return None if is_uploaded(Path.cwd(), probe) else ("file" if path.is_file() else "folder")
    except (OSError, ValueError):  # not a path at all: a name too long for one, a NUL
        return None


def check_data_paths(config: dict, given: set[str], fix: dict[str, str] | None = None) -> None:
    """Every data path of the resolved config (data_paths) that names a file or folder here reaches the job's
    processes: the options in `given` (the job's inputs) excepted. `fix`: the command's own option for one, by option
    (a pipeline's --data), else --inputs."""
    for option, value in data_paths(config).items():
        kind = option not in given and left_out_kind(value)
        if kind:
            advice = (fix or {}).get(option) or f"--inputs+ {shlex.quote(f'{option}={value}')}"
            raise SubmitError(
                f"{option} {value}: a {kind} here that the job's code leaves out (it is outside this folder, or "
                f".amlignore leaves it out: data/, outputs/, ...), so its processes would not find it; give it as an "
                f"input: {advice}"
            )


def check_unset_arguments(config: dict, given: set[str], where: str, fix: dict[str, str] | None = None) -> None:
    """The datamodule's own refusal of the resolved config's arguments (`config`), where it names one the config
    leaves unset (None) and the job does not give (`given`): the job's fit would stop there at its start, on Azure,
    after its image build, and a dry run instantiates nothing (configs/table.yaml without its table or label column
    printed a job and ended 0). Only such a refusal counts: its checks of arguments that are set are for the job's
    machine to make (a path only the job mounts, that machine's cores). `fix`: the command's own option for one, by
    option (a pipeline's --data); else --inputs+ for a path (an option ending in _path or _dir), --train_args for a
    value."""
    import importlib

    from datamodules.errors import DataError

    data = config.get("data") if isinstance(config, dict) else None
    class_path = data.get("class_path") if isinstance(data, dict) else None
    arguments = dict(data.get("init_args") or {}) if isinstance(data, dict) else {}
    unset = [f"data.init_args.{name}" for name, value in arguments.items() if value is None]
    unset = [option for option in unset if option not in given]
    if not isinstance(class_path, str) or not unset:
        return
    module, _, name = class_path.rpartition(".")
    try:
        getattr(importlib.import_module(module), name)(**arguments)
        return
    except DataError as error:
        reason = str(error)
    except Exception:  # not the user's mistake to name here: the job's own start tells
        return
    named = [option for option in unset if option in reason]
    if not named:
        return

    def advice(option: str) -> str:
        if fix and option in fix:
            return fix[option]
        if option.endswith(("_path", "_dir")):
            return f"--inputs+ {option}=PATH"
        return f'--train_args "--{option} VALUE"'

    raise SubmitError(
        f"{where} leaves {' and '.join(named)} unset, and the job's fit would stop at its start: {reason}; give "
        + " and ".join(advice(option) for option in named)
    )
