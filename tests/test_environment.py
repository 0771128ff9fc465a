"""One set of pins: pyproject.toml's, locked with every package they bring and its hashes in uv.lock (what `make
install` installs into .venv); environment.yml (what Azure ML builds for jobs) at the same versions. A pin changed in
one place and not the others, or without `make lock`, fails here. The serving environment's lock:
tests/serving/test_serving_environment.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from tests.conftest import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
LOCK = tomllib.loads((REPO / "uv.lock").read_text())
# The uv of this environment: pyproject's dev extra, the one `make install` installs with.
UV = Path(sys.executable).parent / "uv"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()


def pins(requirements: list[str]) -> dict[str, str]:
    return {normalized(name): version for name, version in (r.split(" ")[0].split("==") for r in requirements)}


def conda_pip_list(path: Path) -> list[str]:
    conda = yaml.safe_load(path.read_text())
    assert "python=3.11" in conda["dependencies"]
    (pip_section,) = [d["pip"] for d in conda["dependencies"] if isinstance(d, dict)]
    return pip_section


def run_uv(*args: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess:
    assert UV.is_file(), f"{UV} is missing: `make install` installs it (pyproject's dev extra)"
    environment = {**os.environ, "UV_NO_PROGRESS": "1", **env}
    return subprocess.run([UV, *args], cwd=cwd, capture_output=True, text=True, env=environment)


def locked_versions(lock: dict = LOCK) -> dict[str, str]:
    return {package["name"]: package["version"] for package in lock["package"] if "version" in package}


def test_every_pin_is_exact_and_the_lock_holds_it():
    extras = [r for requirements in PROJECT["optional-dependencies"].values() for r in requirements]
    droppable = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["template"]["extras"]
    assert set(PROJECT["optional-dependencies"]) - {"dev"} <= set(droppable)  # each a folder `make drop` removes
    assert all("==" in requirement for requirement in PROJECT["dependencies"] + extras)
    locked = locked_versions()
    assert {name: locked.get(name) for name in pins(PROJECT["dependencies"] + extras)} == pins(
        PROJECT["dependencies"] + extras
    )


def test_the_lock_is_what_pyproject_asks_for(project=REPO):
    """uv's own check, from the lock alone (no index): a pin changed in pyproject without `make lock` fails it."""
    checked = run_uv("lock", "--check", "--offline", "--python", sys.executable, "--no-python-downloads", cwd=project)
    assert checked.returncode == 0, checked.stderr


def test_a_pin_changed_without_make_lock_fails_the_check(tmp_path):
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(REPO / name, tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"pandas==2.3.3"', '"pandas==2.3.2"'))
    checked = run_uv("lock", "--check", "--offline", "--python", sys.executable, "--no-python-downloads", cwd=tmp_path)
    assert checked.returncode != 0


def test_every_locked_file_has_its_hash():
    for package in LOCK["package"]:
        if "registry" not in package["source"]:
            continue  # the project itself
        files = package.get("wheels", []) + ([package["sdist"]] if "sdist" in package else [])
        assert files, package["name"]
        assert all(file["hash"].startswith("sha256:") for file in files), package["name"]
    torch = [package for package in LOCK["package"] if package["name"] == "torch"]
    assert [package["version"] for package in torch] == ["2.14.1"]
    wheels = [wheel["url"].rsplit("/", 1)[1] for wheel in torch[0]["wheels"]]
    assert "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl" in wheels


def test_this_environment_is_exactly_the_lock():
    """What `make install` made: every package of the lock at its version and nothing else, but Horovod (built from
    its sdist by `make horovod`, so not in the lock)."""
    checked = run_uv("sync", "--check", "--locked", "--all-extras", "--offline", UV_PROJECT_ENVIRONMENT=sys.prefix)
    differences = [line.strip() for line in checked.stderr.splitlines() if line.strip()[:2] in ("+ ", "- ")]
    assert [line for line in differences if not line.startswith("- horovod==")] == [], checked.stderr


def test_environment_yml_pins_the_jobs_packages_at_the_locked_versions():
    """Jobs fit, sweep, log to the workspace and export: the core, and of the extras this checkout has, azure's
    azureml-mlflow, serving's and sweeps'."""
    extras = PROJECT["optional-dependencies"]
    logging = [requirement for requirement in extras.get("azure", []) if requirement.startswith("azureml-mlflow==")]
    job = PROJECT["dependencies"] + logging + extras.get("serving", []) + extras.get("sweeps", [])
    pip_section = conda_pip_list(REPO / "environment.yml")
    assert sorted(pip_section) == sorted(job)
    locked = locked_versions()
    assert {name: locked[name] for name in pins(pip_section)} == pins(pip_section)


def test_uv_is_bootstrapped_as_the_lock_pins_it():
    """uv-bootstrap.txt (what pip installs uv from, hashes required) is the lock's uv, every wheel's hash."""
    text = (REPO / "uv-bootstrap.txt").read_text()
    (uv,) = [package for package in LOCK["package"] if package["name"] == "uv"]
    assert f"uv=={uv['version']} \\" in text
    hashes = set(re.findall(r"--hash=(sha256:[0-9a-f]{64})", text))
    assert hashes == {file["hash"] for file in uv["wheels"]} | {uv["sdist"]["hash"]}
