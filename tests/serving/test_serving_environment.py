"""The serving environment's pins: scripts/serving/uv.lock (the lock of scripts/serving/environment.yml's pip list,
what `make serve-env` installs into .venv-serve and Azure ML deployments build), every file with its hash, and the
versions it shares with the training environment (tests/test_environment.py).

    .venv/bin/python -m pytest -q tests/serving/test_serving_environment.py
"""

from __future__ import annotations

import sys
import tomllib

import pytest

from tests.conftest import REPO
from tests.test_environment import PROJECT, conda_pip_list, locked_versions, pins, run_uv

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
