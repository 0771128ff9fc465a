"""Tracking against a real `mlflow server` on loopback (what `make mlflow-ui` starts), and the loss plot."""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import REPO, run_module


@pytest.mark.slow
def test_fit_tracks_to_a_real_mlflow_server(mlflow_server, train_cli, tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server}
    env.pop("MLFLOW_RUN_ID", None)
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", 3, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("penguins").experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [0, 1, 2]
    assert run.data.params["trainer.logger.init_args.synchronous"] == "False"  # queued: a server is remote
    assert "test_acc" in run.data.metrics  # logged after fit ended the run's first queue
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "best", "last"} <= names  # uploaded through the server's artifact proxy
    with urllib.request.urlopen(mlflow_server) as response:  # the UI itself is served
        assert b"MLflow" in response.read()

    plot = run_module("scripts.plot", run.info.run_id, "--tracking-uri", mlflow_server, "--output", tmp_path / "a.png")
    assert plot.returncode == 0, plot.stderr[-2000:]
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_the_newest_local_run(train_cli, tmp_path):
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", 3)
    assert result.returncode == 0, result.stderr[-2000:]
    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    plot = run_module("scripts.plot", "--tracking-uri", uri, "--output", tmp_path / "loss.png")
    assert plot.returncode == 0, plot.stderr[-2000:]
    png = tmp_path / "loss.png"
    assert plot.stdout.strip() == str(png) and png.stat().st_size > 5000

    missing = run_module("scripts.plot", "0123abc", "--tracking-uri", uri)
    assert missing.returncode != 0 and re.search(r"error: .*0123abc", missing.stderr)


def test_make_mlflow_ui_serves_on_loopback_only():
    dry = subprocess.run(["make", "-n", "mlflow-ui"], cwd=REPO, capture_output=True, text=True)
    assert "mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db --host 127.0.0.1" in dry.stdout


@pytest.mark.slow
def test_a_password_in_the_tracking_uri_reaches_the_server_and_nothing_a_run_writes(
    azure_tracking, train_cli, tmp_path
):
    import base64

    secret = "s3cret-Pa55"
    env = {**os.environ, "MLFLOW_TRACKING_URI": azure_tracking.url.replace("://", f"://alice:{secret}@")}
    env.pop("MLFLOW_RUN_ID", None)
    args = ["--trainer.max_epochs", 2, "--trainer.logger.init_args.experiment_name", "credentials"]
    result = train_cli("fit", "--config", "configs/penguins.yaml", *args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Basic {base64.b64encode(f'alice:{secret}'.encode()).decode()}" in azure_tracking.authorizations
    assert secret not in result.stdout + result.stderr
    written = [path for path in (tmp_path / "outputs").rglob("*") if path.is_file()]
    assert written and not [path for path in written if secret.encode() in path.read_bytes()]
    client = MlflowClient(azure_tracking.url)
    (run,) = client.search_runs([client.get_experiment_by_name("credentials").experiment_id])
    assert run.data.params["trainer.logger.init_args.tracking_uri"] == azure_tracking.url
    assert secret not in repr(run.data.params) + repr(run.data.tags)
    artifacts = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts")))
    assert not [path for path in artifacts.rglob("*") if path.is_file() and secret.encode() in path.read_bytes()]
