"""What the MLflow store keeps: runs that trained or evaluated, each named apart; a run whose process was killed is
ended as KILLED by the next run; a start that failed before measuring anything leaves no run and no folder."""

from __future__ import annotations

import os
import time

import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType

from tests import warm_launcher
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def runs(outputs, view=ViewType.ACTIVE_ONLY):
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, run_view_type=view) if experiments else []


def test_runs_of_the_same_config_and_seed_get_different_names(train_cli, tmp_path):
    for _ in range(2):
        result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", 1)
        assert result.returncode == 0, result.stderr[-2000:]
    names = [run.info.run_name for run in runs(tmp_path / "outputs")]
    assert len(names) == 2 and len(set(names)) == 2
    assert all(name.startswith("fit-") for name in names)


def test_a_start_that_fails_before_measuring_anything_leaves_no_run_and_no_folder(train_cli, tmp_path):
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--model.optimizer.init_args.lr", "-0.1")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: model.optimizer: Invalid learning rate: -0.1; correct its init_args (see --print_config)"
    )
    outputs = tmp_path / "outputs"
    assert runs(outputs, ViewType.ALL) == []  # the run starts with the first step: none, not even a deleted one
    assert sorted(path.name for path in outputs.iterdir()) == ["mlflow.db", "mlflow.db.lock"]


def test_a_run_killed_with_sigkill_is_ended_as_killed_by_the_next_run(train_cli, tmp_path):
    outputs = tmp_path / "outputs"
    args = ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "100000",
            "--trainer.default_root_dir", str(outputs), "--trainer.logger.init_args.flush_every_s", "0"]  # fmt: skip
    process = warm_launcher.start("scripts.train", args, REPO)
    try:
        deadline = time.monotonic() + 120
        # config.yaml is written once the store exists (opening it here earlier would race the fit creating it).
        while not list(outputs.glob("*/*/config.yaml")) or not any(run.data.metrics for run in runs(outputs)):
            assert time.monotonic() < deadline and process.poll() is None, "the fit never logged a metric"
            time.sleep(1)
    finally:
        process.kill()
        process.wait()
    (killed,) = runs(outputs)
    assert killed.info.status == "RUNNING"  # nothing of the dead process could end it
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", 1)
    assert result.returncode == 0, result.stderr[-2000:]
    statuses = {run.info.run_id: run.info.status for run in runs(outputs)}
    assert statuses.pop(killed.info.run_id) == "KILLED"
    assert list(statuses.values()) == ["FINISHED"]


def test_mlflow_experiment_name_is_the_experiment_of_the_run(train_cli, tmp_path):
    env = {**os.environ, "MLFLOW_EXPERIMENT_NAME": "mine"}
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", 1, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "experiment 'mine' (MLFLOW_EXPERIMENT_NAME), not the config's 'penguins'" in result.stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    assert [e.name for e in client.search_experiments() if e.name != "Default"] == ["mine"]
