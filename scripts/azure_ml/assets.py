"""Named, versioned Azure ML assets: the tasks' data (a file or a folder, the penguin CSV also as an MLTable) and the
training and serving environments. Checked before the Azure SDK is imported; then the SDK's entities and their YAML.

    python -m scripts.assets data penguins data/penguins.csv --version 3 --mltable true --dry_run true
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from scripts.azure_ml.errors import SubmitError
from scripts.azure_ml.images import BASE_IMAGE, GPU_IMAGE
from scripts.azure_ml.job_inputs import check_uploaded_name
from scripts.azure_ml.yaml_files import dumped
from scripts.training.asset_names import name_problem

# Numbers only, so a team's versions sort and the next one is plain; no leading zero, for Azure ML keeps the
# text: '01' and '1' would be two versions of one asset.
VERSION = re.compile(r"0|[1-9][0-9]*")
MLTABLE_ROOT = Path("outputs/assets")  # where an MLTable's folder (the MLTable file, the CSV) is made to upload
DELIMITERS = {".csv": ",", ".tsv": "\t"}


@dataclass(frozen=True)
class EnvironmentRecipe:
    conda_file: str
    image: str
    what: str


# The environments jobs and deployments build inline today, under the names they are registered by.
ENVIRONMENTS = {
    "training": EnvironmentRecipe(
        "environment.yml", BASE_IMAGE, "scripts.train's packages on Azure ML's Open MPI image"
    ),
    "training-gpu": EnvironmentRecipe(
        "environment.yml", GPU_IMAGE, "scripts.train's packages on Azure ML's CUDA Open MPI image with InfiniBand"
    ),
    "serving": EnvironmentRecipe(
        "scripts/serving/environment.yml", BASE_IMAGE, "the inference server and scripts/score.py's packages"
    ),
}


def default_kind(reference: str) -> str | None:
    """The kind of ENVIRONMENTS an environment reference (azureml:NAME:VERSION) names by the name plan_environment
    gives it, lightning-KIND; None for any other name."""
    name = reference.removeprefix("azureml:").rsplit(":", 1)[0]
    return next((kind for kind in ENVIRONMENTS if name == f"lightning-{kind}"), None)


class AssetError(SubmitError):  # a SubmitError too: submit and deploy check the references jobs name assets by
    """A bad asset name, version, path or reference; the message names it and what to give instead."""


@dataclass(frozen=True)
class Asset:
    """One asset to create, decided before azure.ai.ml is imported."""

    kind: str  # "data" or "environment"
    name: str
    version: str
    description: str
    type: str = ""  # data: uri_file, uri_folder or mltable
    path: str = ""  # data: the local file or folder uploaded
    image: str = ""  # environment
    conda_file: str = ""  # environment
    source: str = ""  # mltable: the CSV its folder is made of

    @property
    def reference(self) -> str:
        return f"azureml:{self.name}:{self.version}"

    @property
    def file_name(self) -> str:  # its YAML's, for `az ml data create -f` / `az ml environment create -f`
        return f"{self.kind}-{self.name}.yml"


def check_name(name: str, option: str = "name") -> None:
    if problem := name_problem(name, option):
        raise AssetError(problem)


def check_version(version: str) -> None:
    if VERSION.fullmatch(str(version)):
        return
    if str(version) == "":  # the option's default: not given
        raise AssetError("--version is missing: give the version to create, a number, e.g. --version 3 (versions are "
                         "immutable: changed data is the next one)")  # fmt: skip
    if str(version).isdigit():
        plain = str(version).lstrip("0") or "0"
        raise AssetError(f"--version {version!r}: give it as {plain} (Azure ML would keep {version!r} and "
                         f"{plain!r} as two versions)")  # fmt: skip
    raise AssetError(f"--version {version!r}: give a number, e.g. --version 3 (the asset's next version)")


def plan_data(name: str, path: str, version: str, mltable: bool = False, description: str = "") -> list[Asset]:
    """The data asset of a local file or folder (uri_file, uri_folder), and with `mltable` also NAME-table, an MLTable
    that reads the CSV with its delimiter and header."""
    check_name(name)
    check_version(version)
    local = Path(path)
    if not local.exists():
        raise AssetError(
            f"{path}: no such file or folder; give the data's file or folder (a CSV, data/mnist, data/birds)"
        )
    if local.is_dir() and not any(item.is_file() for item in local.rglob("*")):
        raise AssetError(f"{path}: no file in this folder, and Azure ML registers none; give the folder the data is in")
    kind = "uri_file" if local.is_file() else "uri_folder"
    if kind == "uri_file":  # registered, it keeps its name, which ends its path in the jobs that take it
        check_uploaded_name(local, path)
    assets = [Asset("data", name, str(version), description or f"{name} from {local.name}", kind, str(local.resolve()))]
    if mltable:
        if not local.is_file() or local.suffix.lower() not in DELIMITERS:
            raise AssetError(f"--mltable true: {path} is not a .csv or .tsv file; an MLTable here reads one such file")
        table = f"{name}-table"
        check_name(table)
        folder = MLTABLE_ROOT / table
        assets.append(Asset("data", table, str(version), f"{name} as a table: {local.name}", "mltable", str(folder),
                            source=str(local.resolve())))  # fmt: skip
    return assets


def plan_environment(kind: str, name: str | None, version: str, description: str = "") -> Asset:
    recipe = ENVIRONMENTS.get(kind)
    if recipe is None:
        raise AssetError(f"environment {kind!r}: give one of {', '.join(ENVIRONMENTS)}")
    name = name or f"lightning-{kind}"
    check_name(name, "--name")
    check_version(version)
    if not Path(recipe.conda_file).is_file():
        raise AssetError(f"{recipe.conda_file} is not in this folder: run from the repository's root")
    return Asset("environment", name, str(version), description or recipe.what, image=recipe.image,
                 conda_file=recipe.conda_file)  # fmt: skip


def mltable_text(csv_name: str, delimiter: str) -> str:
    """An MLTable file that reads `csv_name` (next to it) as mltable.load(...).to_pandas_dataframe() and Azure ML do:
    its first line the header, cells of the CSV's delimiter, UTF-8."""
    table = {
        "$schema": "https://azuremlschemas.azureedge.net/latest/MLTable.schema.json",
        "type": "mltable",
        "paths": [{"file": f"./{csv_name}"}],
        "transformations": [
            {
                "read_delimited": {
                    "delimiter": delimiter,
                    "header": "all_files_same_headers",
                    "encoding": "utf8",
                    "empty_as_string": False,
                }
            }
        ],
    }
    return yaml.safe_dump(table, sort_keys=False)


def write_mltable(csv: Path, folder: Path) -> Path:
    """`folder` made an MLTable's: the MLTable file and a copy of the CSV it reads (an MLTable's paths are relative
    to its own folder, which is what Azure ML uploads)."""
    # Made beside it, then put in its place: the CSV may be the one an earlier registration left in `folder`.
    staging = folder.with_name(f".{folder.name}.new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copy(csv, staging / csv.name)
    (staging / "MLTable").write_text(mltable_text(csv.name, DELIMITERS[csv.suffix.lower()]))
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def build(asset: Asset):
    """The azure.ai.ml Data or Environment; an MLTable's folder is written first."""
    from azure.ai.ml.entities import Data, Environment

    if asset.kind == "environment":
        return Environment(name=asset.name, version=asset.version, description=asset.description, image=asset.image,
                           conda_file=asset.conda_file)  # fmt: skip
    if asset.type == "mltable":
        write_mltable(Path(asset.source), Path(asset.path))
    return Data(name=asset.name, version=asset.version, description=asset.description, type=asset.type,
                path=asset.path)  # fmt: skip


def asset_yaml(entity, folder: Path = Path(".")) -> str:
    """The asset's YAML as `az ml data create -f` / `az ml environment create -f` take it from a file in `folder`: a
    data asset's local path relative to that folder (the SDK writes this machine's absolute path), an environment's
    conda file inline."""
    data = dumped(entity)
    if "path" in data and "://" not in data["path"]:
        data["path"] = os.path.relpath(data["path"], folder.resolve())
    return yaml.safe_dump(data, sort_keys=False)
