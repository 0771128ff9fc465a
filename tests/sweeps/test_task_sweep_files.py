"""Every task has a sweep file (configs/sweeps/<task>.yaml), and each passes the sweep's own checks against its task:
its options exist and take every value it may give them, and a short fit of its first trial, on data of the task's
shape, logs its objective.

    .venv/bin/python -m pytest -q tests/sweeps/test_task_sweep_files.py
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from scripts.sweeps.preflight import check_metric, check_options
from scripts.sweeps.space import load_sweep
from tests.conftest import REPO
from tests.test_small_data import write_digits

# configs/mnist_tutorial.yaml is the Synapse tutorial's fixed recipe, run as it was; configs/mnist.yaml's file tunes
# the same task.
UNTUNED = {"mnist_tutorial"}
TASKS = sorted(path.stem for path in (REPO / "configs").glob("*.yaml") if path.stem not in UNTUNED)
SWEEP_FILES = sorted(path.stem for path in (REPO / "configs/sweeps").glob("*.yaml"))


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # config paths in sweep files are relative to it


def test_every_task_has_a_sweep_file_and_every_sweep_file_a_task():
    # `make sweep TASK=table` was refused: no configs/sweeps/table.yaml.
    assert SWEEP_FILES == TASKS


@pytest.mark.parametrize("task", SWEEP_FILES)
def test_each_sweep_file_is_valid_and_its_options_take_its_values(task):
    sweep = load_sweep(f"configs/sweeps/{task}.yaml")
    assert sweep.configs == (f"configs/{task}.yaml",)
    check_options(sweep)


def write_table(path) -> None:
    """200 rows: a number and a category that decide the class, a label column of text."""
    generator = np.random.default_rng(0)
    number = generator.normal(size=200)
    colour = generator.choice(["red", "green", "blue"], 200)
    outcome = np.where(number + (colour == "red") > 0.3, "yes", "no")
    lines = ["number,colour,outcome", *(f"{n:.4f},{c},{o}" for n, c, o in zip(number, colour, outcome))]
    path.write_text("\n".join(lines) + "\n")


def table_data(folder) -> dict:
    write_table(folder / "table.csv")
    return {"csv_path": str(folder / "table.csv"), "label": "outcome"}


def digits_data(folder) -> dict:
    write_digits(folder / "digits", {"train": 10, "val": 4})
    return {"data_dir": str(folder / "digits")}


@pytest.mark.slow  # two short fits, one of an ImageNet backbone
@pytest.mark.parametrize(("task", "data"), [("table", table_data), ("digits_folder", digits_data)])
def test_a_short_fit_of_the_first_trial_logs_the_objective_on_the_tasks_data(tmp_path, task, data):
    """The data a user gives in a config after the task's (the file's comment says how) is all the sweep lacks."""
    given = tmp_path / "my_data.yaml"
    given.write_text(yaml.safe_dump({"data": {"init_args": data(tmp_path)}}))
    sweep = load_sweep(f"configs/sweeps/{task}.yaml")
    sweep = dataclasses.replace(sweep, configs=(*sweep.configs, str(given)))
    first = check_options(sweep)
    check_metric(sweep, tmp_path, first)
