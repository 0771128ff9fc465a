"""The serving environment's pins: scripts/serving/uv.lock (the lock of scripts/serving/environment.yml's pip list,
what `make serve-env` installs into .venv-serve and Azure ML deployments build), every file with its hash, and the
versions it shares with the training environment (tests/test_environment.py).

    .venv/bin/python -m pytest -q tests/serving/test_serving_environment.py
"""

from __future__ import annotations

import os
import sys
import tomllib

import pytest

from tests.conftest import REPO
from tests.test_environment import PROJECT, UV, conda_pip_list, locked_versions, pins, run_uv

SERVING = REPO / "scripts" / "serving"


def test_the_serving_lock_is_what_its_pyproject_asks_for():
    checked = run_uv("lock", "--check", "--offline", "--python", sys.executable, "--no-python-downloads", cwd=SERVING)
    assert checked.returncode == 0, checked.stderr


def test_every_file_of_the_serving_lock_has_its_hash():
    for package in tomllib.loads((SERVING / "uv.lock").read_text())["package"]:
        if "registry" not in package["source"]:
            continue  # the project itself
        files = package.get("wheels", []) + ([package["sdist"]] if "sdist" in package else [])
        assert files and all(file["hash"].startswith("sha256:") for file in files), package["name"]


def test_the_serving_lock_pins_what_the_serving_environment_yml_pins():
    serving = conda_pip_list(SERVING / "environment.yml")
    assert sorted(serving) == sorted(tomllib.loads((SERVING / "pyproject.toml").read_text())["project"]["dependencies"])
    locked = locked_versions(tomllib.loads((SERVING / "uv.lock").read_text()))
    assert {name: locked[name] for name in pins(serving)} == pins(serving)
    assert not {"torch", "lightning"} & set(locked)


def test_the_serving_environment_pins_every_package_and_shares_the_training_versions():
    """scripts/serving/environment.yml: .venv-serve (make serve-env) and the Azure ML deployment's conda file."""
    pip_section = conda_pip_list(SERVING / "environment.yml")
    assert all("==" in requirement for requirement in pip_section)
    serving = pins(pip_section)
    assert "azureml-inference-server-http" in serving
    locked = locked_versions()
    assert {name: version for name, version in serving.items() if name in locked} == {
        name: locked[name] for name in serving if name in locked
    }
    assert not {"torch", "torchvision", "lightning"} & set(serving)  # the registered model's predict needs neither
    # What the model's predict imports (Pillow decodes and resizes, numpy and ONNX Runtime compute) is the training
    # environment's version too: predict there and the model here give the same numbers.
    assert {"numpy", "pillow", "onnxruntime", "pandas"} <= set(serving) & set(locked)
    assert serving["mlflow-skinny"] == pins(PROJECT["dependencies"])["mlflow"]


@pytest.mark.skipif(not (REPO / ".venv-serve" / "bin" / "python").is_file(), reason="needs .venv-serve: make serve-env")
def test_the_serving_environment_is_exactly_its_lock():
    checked = run_uv(
        "sync", "--check", "--locked", "--offline", cwd=SERVING, UV_PROJECT_ENVIRONMENT=str(REPO / ".venv-serve")
    )
    assert checked.returncode == 0, checked.stderr


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A penguin model saved as scripts.train saves one, from the repository's root (a uv project itself)."""
    import torch

    from datamodules.penguins import PenguinDataModule
    from datamodules.preprocessing.penguins import FEATURES
    from scripts.serving.mlflow_model import save_model, serving_inputs

    data = PenguinDataModule()
    data.prepare_data()
    data.setup("fit")
    model = tmp_path_factory.mktemp("saved") / "model"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        save_model(torch.nn.Linear(len(FEATURES), 3), torch.randn(4, len(FEATURES)), data.class_names, model,
                   serving_inputs(data))  # fmt: skip
    return model


TRAINING_ONLY = {"torch", "torchvision", "lightning", "pytorch-lightning"}


def test_a_saved_models_environment_files_are_the_serving_environments(saved_model):
    """MLflow 3.15 copies the uv.lock and pyproject.toml of the folder it saves a model from into the model, for
    `--env-manager uv` to `uv sync`: saved from the repository, the training project's (torch, Lightning and ~130
    other packages for a model that imports neither). The model's environment files (requirements.txt, conda.yaml,
    python_env.yaml, uv.lock, pyproject.toml) are the serving environment's, wherever it is saved from."""
    import re

    import yaml

    from scripts.serving.mlflow_model import serving_requirements

    model = saved_model
    assert (model / "uv.lock").read_bytes() == (SERVING / "uv.lock").read_bytes()
    assert (model / "pyproject.toml").read_bytes() == (SERVING / "pyproject.toml").read_bytes()
    assert (model / "requirements.txt").read_text().split() == serving_requirements()
    (conda_pip,) = [entry["pip"] for entry in yaml.safe_load((model / "conda.yaml").read_text())["dependencies"]
                    if isinstance(entry, dict)]  # fmt: skip
    assert conda_pip == serving_requirements()
    named = {
        "requirements.txt": [line.split("==")[0] for line in (model / "requirements.txt").read_text().split()],
        "conda.yaml": [requirement.split("==")[0] for requirement in conda_pip],
        "python_env.yaml": yaml.safe_load((model / "python_env.yaml").read_text())["dependencies"],
        "uv.lock": [package["name"] for package in tomllib.loads((model / "uv.lock").read_text())["package"]],
        "pyproject.toml": [re.split(r"[=<>\[ ]", r)[0] for r in tomllib.loads((model / "pyproject.toml").read_text())
                           ["project"]["dependencies"]],
    }  # fmt: skip
    for name, packages in named.items():
        assert not TRAINING_ONLY & set(packages), name


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / ".venv-serve" / "bin" / "python").is_file(), reason="needs .venv-serve: make serve-env")
def test_mlflow_models_predict_with_env_manager_uv_builds_the_serving_environment(saved_model, tmp_path):
    """`mlflow models predict --env-manager uv` restores the model's environment with `uv sync` of its uv.lock:
    the serving environment's packages (offline, from uv's cache, which `make serve-env` filled), no torch, and the
    model answers the course's penguin."""
    import json
    import subprocess

    rows = tmp_path / "rows.csv"
    rows.write_text("".join((REPO / "configs/examples/penguins.csv").read_text().splitlines(True)[:2]))
    environment = {**os.environ, "PATH": f"{UV.parent}:{os.environ['PATH']}", "UV_OFFLINE": "1",
                   "UV_NO_PROGRESS": "1"}  # fmt: skip
    done = subprocess.run([UV.parent / "mlflow", "models", "predict", "-m", saved_model, "-i", rows, "-t", "csv",
                           "--env-manager", "uv"], cwd=tmp_path, capture_output=True, text=True, env=environment,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])["predictions"]
    assert len(answer) == 1 and answer[0]["class"] in ("Adelie", "Gentoo", "Chinstrap")
    installed = {line.split()[1].split("==")[0] for line in done.stderr.splitlines() if line.startswith(" + ")}
    assert "onnxruntime" in installed and not TRAINING_ONLY & installed  # uv sync's own list of what it installed


@pytest.mark.slow
def test_the_serving_pages_models_snippet_loads_the_registered_model_from_the_projects_store(saved_model, tmp_path):
    """docs/serving.md's `mlflow.pyfunc.load_model("models:/penguins-classifier/1")`, run from the repository as
    written, looked in MLflow 3's default store, a new ./mlflow.db, and failed ('Registered Model ... not found'),
    leaving that file behind. The penguin half of the snippet, run where scripts.train registered the model (in
    outputs/mlflow.db), answers, and writes no ./mlflow.db."""
    import re
    import subprocess

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    client.create_registered_model("penguins-classifier")
    client.create_model_version("penguins-classifier", str(saved_model))
    page = (REPO / "docs" / "serving.md").read_text()
    (snippet,) = [block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "models:/" in block]
    penguins = snippet.split('model = mlflow.pyfunc.load_model("models:/birds-classifier/1")')[0]
    lines = [line for line in penguins.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    penguins = "\n".join([*lines[:-1], f"print({lines[-1]})"])  # its answer, which the page shows
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    done = subprocess.run([sys.executable, "-c", penguins], cwd=tmp_path, capture_output=True, text=True,
                          env=environment, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[:2] == ["class", "probability"]
    assert not (tmp_path / "mlflow.db").exists()
