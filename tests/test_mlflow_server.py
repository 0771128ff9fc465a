"""Tracking against a real `mlflow server` on loopback (what `make mlflow-ui` starts), and the loss plot."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import REPO, free_port, run_module


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


@pytest.mark.slow
def test_plot_of_the_newest_local_run(train_cli, tmp_path):
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", 3)
    assert result.returncode == 0, result.stderr[-2000:]
    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    plot = run_module("scripts.plot", "--tracking-uri", uri, "--output", tmp_path / "loss.png")
    assert plot.returncode == 0, plot.stderr[-2000:]
    png = tmp_path / "loss.png"
    assert plot.stdout.strip() == str(png) and png.stat().st_size > 5000


@pytest.mark.slow
def test_make_mlflow_ui_shows_the_runs_of_a_store_on_loopback_only(train_cli, tmp_path):
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", 1)
    assert result.returncode == 0, result.stderr[-2000:]
    port, store = free_port(), tmp_path / "outputs" / "mlflow.db"
    client = MlflowClient(f"sqlite:///{store}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    make = ["make", "--no-print-directory", "mlflow-ui", f"MLFLOW_PORT={port}", f"MLFLOW_STORE={store}"]
    make.append(f"VENV={Path(sys.executable).parent.parent}")
    ui = subprocess.Popen(make, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        body = json.dumps({"experiment_ids": [run.info.experiment_id]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/runs/search", body, {"Content-Type": "application/json"}
        )
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    shown = json.load(response)["runs"]
                break
            except OSError:
                assert ui.poll() is None and time.monotonic() < deadline, "make mlflow-ui did not serve"
                time.sleep(1)
        assert [r["info"]["run_id"] for r in shown] == [run.info.run_id]  # the store given, not outputs/mlflow.db
        address = socket.gethostbyname(socket.gethostname())
        if not address.startswith("127."):  # this machine's own address answers nothing: loopback only
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=5):
                pass
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)


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
