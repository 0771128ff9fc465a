"""environment.yml (what Azure ML builds) and pyproject.toml (what `make install` installs) pin the same packages."""

import contextlib
import json
import subprocess
import tomllib

import yaml

from tests.conftest import REPO


def test_environment_yml_pins_what_pyproject_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    conda = yaml.safe_load((REPO / "environment.yml").read_text())
    (pip_section,) = [d["pip"] for d in conda["dependencies"] if isinstance(d, dict)]
    assert sorted(pip_section) == sorted(project["dependencies"])
    assert "python=3.11" in conda["dependencies"]
    assert all("==" in requirement for requirement in project["dependencies"])


def test_installed_versions_match_the_pins():
    from importlib.metadata import version

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name, pinned = requirement.split("==")
        assert version(name.split("[")[0]) == pinned, requirement


def test_the_serving_environment_pins_every_package_and_shares_the_training_versions():
    """scripts/serving/environment.yml: .venv-serve (make serve-env) and the Azure ML deployment's conda file."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    serve = yaml.safe_load((REPO / "scripts" / "serving" / "environment.yml").read_text())
    (pip_section,) = [d["pip"] for d in serve["dependencies"] if isinstance(d, dict)]
    assert "python=3.11" in serve["dependencies"]
    assert all("==" in requirement for requirement in pip_section)
    training = dict(requirement.split("==") for requirement in project["dependencies"])
    serving = dict(requirement.split("==") for requirement in pip_section)
    assert "azureml-inference-server-http" in serving
    assert {name: version for name, version in serving.items() if name in training} == {
        name: training[name] for name in serving if name in training
    }
    assert not {"torch", "torchvision", "lightning"} & set(serving)  # the registered model's predict needs neither
    # What the model's predict imports (Pillow decodes and resizes, numpy and ONNX Runtime compute) is the training
    # environment's version too: predict there and the model here give the same numbers.
    from importlib.metadata import PackageNotFoundError, version

    for name, pinned in serving.items():
        with contextlib.suppress(PackageNotFoundError):  # azureml-inference-server-http is the server's alone
            assert version(name) == pinned, name
    assert serving["mlflow-skinny"] == training["mlflow"]
    venv = REPO / ".venv-serve" / "bin" / "python"
    if venv.is_file():  # what make serve-env installed is what the file pins
        listed = subprocess.run([venv, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True)
        installed = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
        assert {name: installed.get(name.lower()) for name in serving} == serving
