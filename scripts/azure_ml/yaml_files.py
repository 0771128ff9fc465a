"""A job's YAML, as --dry_run prints or writes it for `az ml job create -f`, and the checks that keep a dry run from
writing over a file of the user's (--yaml_file, --yaml_dir of scripts.submit, pipeline, assets and deploy).

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --dry_run true --yaml_file jobs/penguins.yml
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import yaml

from scripts.azure_ml.errors import SubmitError
from scripts.azure_ml.job_inputs import is_local


def dumped(entity) -> dict:
    """The YAML the SDK's `dump` writes of an azure.ai.ml entity (a job, component, asset or deployment), as a dict."""
    text = io.StringIO()
    entity.dump(text)
    return yaml.safe_load(text.getvalue())


def relative_to(folder: Path, data: dict) -> dict:
    """`data` (a job's YAML as a dict) with every local path in it, the code, a build context, a local input,
    relative to `folder`, where the YAML file is: `az ml job create -f` reads them relative to the file, so the YAML
    works from any folder and on any machine with this checkout, not only at this machine's absolute paths."""
    base = folder.resolve()

    def walk(value, key: str = ""):
        if isinstance(value, dict):
            return {name: walk(item, name) for name, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        if key in ("code", "path", "conda_file") and isinstance(value, str) and is_local(value):
            return os.path.relpath(Path(value).resolve(), base)  # resolve(): a relative path is the cwd's
        return value

    return walk(data)


def job_yaml(job, folder: Path = Path(".")) -> str:
    """The job as `az ml job create -f` takes it from a file in `folder`: every local path in it (code, the Horovod
    build context, local inputs) relative to that folder (the SDK writes this machine's absolute paths)."""
    data = dumped(job._to_job())  # the job itself, not the node wrapping it in a component
    data["code"] = str(Path.cwd())
    for name, given in (job.inputs or {}).items():
        if is_local(given.path):  # the SDK's dump writes a local path as an asset name: "azureml:/home/..."
            data["inputs"][name]["path"] = given.path
    return yaml.safe_dump(relative_to(folder, data), sort_keys=False)


def check_yaml_file(given: str) -> None:
    """A --yaml_file that can be written: not a folder, no file where a folder of its path must be (the folders that
    do not exist yet are made)."""
    path = Path(given)
    if path.is_dir() or given.endswith(os.sep):
        raise SubmitError(f"--yaml_file {path}: a folder; give a file name in it, e.g. {path / 'job.yml'}")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise SubmitError(f"--yaml_file {path}: {parent} is a file, not a folder; give another path")
    if path.is_file() and not is_job_yaml(path):  # e.g. the task's own config: a job's YAML written before is replaced
        raise SubmitError(
            f"--yaml_file {path}: a file that is not an Azure ML job's YAML is there, and it would be written over; "
            f"give a new file name, e.g. {path.parent / 'job.yml'}"
        )


def check_yaml_dir(given: str | None, example: str, option: str = "--yaml_dir") -> None:
    """A --yaml_dir that can be written in: a folder, or one to make, no file where a folder of its path must be."""
    if given is None:
        return
    for folder in (Path(given), *Path(given).parents):
        if folder.exists() and not folder.is_dir():
            raise SubmitError(f"{option} {given}: {folder} is a file, not a folder; give a folder, e.g. {example}")


def check_not_written_over(folder: Path, files: dict[str, tuple[str, tuple[str, ...]]], option: str) -> None:
    """A dry run's files in --yaml_dir (name -> (what it is, the keys its YAML has)) may replace the same YAML written
    before, never another file of the user's: such a file is a SubmitError, before any file is written."""
    for name, (what, keys) in files.items():
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, ValueError, yaml.YAMLError):  # unreadable, not text, not YAML
            data = None
        if not (isinstance(data, dict) and all(key in data for key in keys)):
            raise SubmitError(
                f"{option} {folder}: {path} is there and is not {what}, and it would be written over; give another "
                "folder"
            )


def is_job_yaml(path: Path) -> bool:
    """Whether `path` holds a job's YAML (a command, sweep or pipeline job's, as --dry_run writes it)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):  # unreadable, not text, not YAML
        return False
    return isinstance(data, dict) and data.get("type") in ("command", "sweep", "pipeline")


def write_yaml_file(given: str, text: str) -> None:
    """Writes a job's YAML to --yaml_file (checked by check_yaml_file), making its folders; says what to run."""
    path = Path(given)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as error:
        raise SubmitError(f"--yaml_file {given}: cannot write it ({error.strerror}); give another path") from None
    print(f"wrote {given}: az ml job create -f {given}")


def print_or_write_yaml(job, as_yaml, yaml_file: str | None) -> str:
    """A dry run's YAML of `job` (`as_yaml(job, folder)`): written to --yaml_file, its local paths relative to that
    file's folder, or printed with them relative to this one; returns it. The large files `az ml job create -f` would
    upload with the code are named on stderr, as a submission names them."""
    from scripts.azure_ml.code_snapshot import name_large_files, uploaded_files

    name_large_files(Path.cwd(), uploaded_files(Path.cwd()))
    if yaml_file:
        text = as_yaml(job, Path(yaml_file).parent)
        write_yaml_file(yaml_file, text)
        return text
    text = as_yaml(job)
    print(text, end="")
    return text
