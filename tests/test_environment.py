"""environment.yml (what Azure ML builds) and pyproject.toml (what `make install` installs) pin the same packages."""

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
