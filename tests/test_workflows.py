"""What a fork gets with the code, checked here since no run can reach GitHub: the workflows under .github/workflows/
against GitHub's schema (check-jsonschema's copy) and zizmor's audits, Dependabot's file against its schema, each
workflow running what the README says, and .pre-commit-config.yaml running `make lint`'s ruff on a commit's files.

    .venv/bin/python -m pytest tests/test_workflows.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent  # check-jsonschema, zizmor and pre-commit: pyproject's dev extra


def run(*command: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    assert (BIN / command[0]).is_file(), f"{BIN / command[0]} is missing: `make install` installs it (dev extra)"
    return subprocess.run([BIN / command[0], *command[1:]], cwd=cwd, capture_output=True, text=True)


def steps(workflow: str, job: str) -> list[str]:
    jobs = yaml.safe_load((REPO / ".github" / "workflows" / workflow).read_text())["jobs"]
    return [step["run"] for step in jobs[job]["steps"] if "run" in step]


def triggers(workflow: str) -> dict:
    loaded = yaml.safe_load((REPO / ".github" / "workflows" / workflow).read_text())
    return loaded[True]  # YAML 1.1 reads the key `on` as True


def test_the_workflows_and_dependabot_follow_githubs_schemas():
    assert [path.name for path in WORKFLOWS] == ["docs.yml", "tests.yml"]
    checked = run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *WORKFLOWS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    checked = run("check-jsonschema", "--builtin-schema", "vendor.dependabot", REPO / ".github" / "dependabot.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_zizmor_finds_nothing_in_the_workflows():
    checked = run("zizmor", "--offline", "--no-progress", "--min-severity", "low", REPO / ".github" / "workflows")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_broken_workflow_fails_the_schema(tmp_path):
    broken = tmp_path / "tests.yml"
    broken.write_text((REPO / ".github" / "workflows" / "tests.yml").read_text().replace("runs-on:", "runs_on:", 1))
    checked = run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", broken)
    assert checked.returncode != 0


def test_every_push_runs_test_fast_and_the_schedule_the_whole_suite():
    on = triggers("tests.yml")
    assert {"push", "pull_request", "schedule", "workflow_dispatch"} <= set(on)
    assert steps("tests.yml", "fast") == ["make install", "make test-fast"]
    full = steps("tests.yml", "full")
    expected = [
        "make install",
        "make horovod",  # extra: horovod
        "make horovod-gpu",  # extra: horovod
        "make serve-env",  # extra: serving
        "make core-env",
        "make test",
    ]
    assert full[-len(expected) :] == expected
    assert all(package in full[0] for package in ("openmpi-bin", "libopenmpi-dev"))
    assert any("openjdk-17-jre-headless" in step for step in full)  # extra: spark
    jobs = yaml.safe_load((REPO / ".github" / "workflows" / "tests.yml").read_text())["jobs"]
    assert "push" in jobs["fast"]["if"] and "schedule" in jobs["full"]["if"]
    for job in jobs.values():
        (python,) = [step["with"]["python-version"] for step in job["steps"] if "setup-python" in step.get("uses", "")]
        assert python == "3.11"
        (cache,) = [step["with"] for step in job["steps"] if "actions/cache" in step.get("uses", "")]
        assert "~/.cache/uv" in cache["path"] and "hashFiles('uv.lock'" in cache["key"]


def test_the_docs_workflow_runs_test_files_that_exist():
    commands = [text for text in steps("docs.yml", "check") if "pytest" in text]
    files = [word for command in commands for word in command.split() if word.startswith("tests/")]
    assert "tests/test_documented_commands.py" in files
    assert "tests/azure" in files  # extra: azure
    assert all((REPO / name).exists() for name in files), files


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """A git repository with this one's ruff settings and hooks and a link to this environment as its .venv."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    folder = tmp_path_factory.mktemp("hooks")
    for name in ("pyproject.toml", ".pre-commit-config.yaml"):
        shutil.copy(REPO / name, folder)
    (folder / ".venv").symlink_to(Path(sys.prefix))
    for command in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", *command], cwd=folder, check=True)
    return folder


@pytest.mark.parametrize(
    ("source", "passes"),
    [
        ("import os\n\nprint(os.sep)\n", True),
        ("import os\nimport sys\n\nprint(os.sep)\n", False),  # ruff check: F401, sys unused
        ("print( 'x' )\n", False),  # ruff format --check
    ],
)
def test_the_pre_commit_hooks_run_make_lints_ruff(repository, source, passes):
    (repository / "module.py").write_text(source)
    subprocess.run(["git", "add", "module.py", "pyproject.toml", ".pre-commit-config.yaml"], cwd=repository)
    checked = run("pre-commit", "run", "--files", "module.py", cwd=repository)
    assert (checked.returncode == 0) == passes, checked.stdout + checked.stderr
