"""Tracking against a real `mlflow server` on loopback (what `make mlflow-ui` starts), and the loss plot."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests import warm_launcher
from tests.conftest import REPO, free_port, run_module


@pytest.mark.slow
def test_fit_tracks_to_a_real_mlflow_server(mlflow_server, train_cli, tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server}
    env.pop("MLFLOW_RUN_ID", None)
    experiment = tmp_path.name  # its own: the server is the whole test run's, other tests' runs are on it too
    args = ["--trainer.max_epochs", 3, "--trainer.logger.init_args.experiment_name", experiment]
    result = train_cli("fit", "--config", "configs/penguins.yaml", *args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
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
    log = tmp_path / "ui.log"
    with open(log, "w") as out:
        ui = subprocess.Popen(make, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
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
        assert "Warning" not in log.read_text()  # the libraries' deprecations are not the user's to act on
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


class OutageProxy:
    """A TCP proxy in front of the session's MLflow server that can fail as servers do: `down()` refuses connections
    and cuts those open (a killed server), `hang()` takes connections and never answers (a hung one), `up()` forwards
    again on the same port."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.mode = "up"
        self.held = 0  # requests taken while hung (a connection opened, or bytes that were not passed on)
        self.sockets: list[socket.socket] = []
        self.listener: socket.socket | None = None
        self.up()

    def up(self) -> None:
        self.mode = "up"
        if self.listener is None:
            self.listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
            threading.Thread(target=self.accept, args=(self.listener,), daemon=True).start()

    def down(self) -> None:
        self.mode = "down"
        listener, self.listener = self.listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes its accept(), which close() alone does not
            listener.close()
        self.cut()

    def hang(self) -> None:
        self.mode = "hang"
        self.up()
        self.mode = "hang"

    def cut(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.sockets.clear()

    def accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self.sockets.append(client)
            self.held += self.mode == "hang"
            if self.mode == "up":
                server = socket.create_connection(self.upstream)
                self.sockets.append(server)
                for source, target in ((client, server), (server, client)):
                    threading.Thread(target=self.pump, args=(source, target), daemon=True).start()

    def pump(self, source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self.held += self.mode == "hang"
                while self.mode == "hang":  # a hung server: bytes in, nothing out
                    time.sleep(0.1)
                if self.mode == "down":
                    return
                target.sendall(data)


def wait_for(path: Path, process: warm_launcher.Command, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"the fit did not reach {path.name}"
        time.sleep(0.1)


def held_fit(url: str, tmp_path: Path, epochs: int, held_at: list[int]) -> warm_launcher.Command:
    """A penguin fit tracking to `url` (forked from the warm launcher) that stops at the end of each epoch of
    `held_at` until the test says go."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": url}
    env.pop("MLFLOW_RUN_ID", None)
    callbacks = f"[{{class_path: tests.stopping.WaitAt, init_args: {{folder: {tmp_path}, epochs: {held_at}}}}}]"
    args = ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", str(epochs),
            "--trainer.callbacks", callbacks, "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", str(tmp_path / "outputs"),
            "--trainer.logger.init_args.experiment_name", tmp_path.name]  # fmt: skip
    return warm_launcher.start("scripts.train", args, REPO, env)


@pytest.mark.slow
def test_a_tracking_outage_mid_fit_costs_training_no_wait_and_no_metric(mlflow_server, tmp_path):
    proxy = OutageProxy(mlflow_server)
    fit = held_fit(proxy.url, tmp_path, epochs=8, held_at=[1, 5])
    try:
        wait_for(tmp_path / "at-1", fit)
        proxy.down()  # the server dies after epoch 1's metrics are queued
        (tmp_path / "go-1").touch()
        # Epochs 2-5 train while the server is gone: each checkpoint waits for one failed request at most, not for
        # MLflow's ~4 min of retries (the deadline is a bound on that, well above what the epochs take).
        wait_for(tmp_path / "at-5", fit, timeout_s=180)
        proxy.up()  # it is back
        (tmp_path / "go-5").touch()
        stdout, stderr = fit.communicate(timeout=600)
    finally:
        fit.kill()
        proxy.down()
    assert fit.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "lost" not in stderr, stderr[-3000:]
    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name(tmp_path.name).experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == list(range(8))
    assert run.info.status == "FINISHED"


def sigterm(fit: warm_launcher.Command, bound_s: float) -> tuple[str, float]:
    """SIGTERM to the fit; its stderr and the seconds it took to end. A fit still running after `bound_s` is sent
    SIGUSR1 (tests.stopping.WaitAt writes every thread's stack to stderr then): the failure shows where it waited."""
    fit.send_signal(signal.SIGTERM)
    started = time.monotonic()
    try:
        _, stderr = fit.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        fit.send_signal(signal.SIGUSR1)
        _, stderr = fit.communicate(timeout=120)
    return stderr, time.monotonic() - started


@pytest.mark.slow
def test_sigterm_cuts_a_checkpoint_s_wait_for_a_hung_tracking_server_short(mlflow_server, tmp_path):
    """A checkpoint waits up to CHECKPOINT_WAIT_S (10 s) for the server to take the metrics so far; SIGTERM ends the
    wait at once, not after it."""
    proxy = OutageProxy(mlflow_server)
    fit = held_fit(proxy.url, tmp_path, epochs=10_000, held_at=[1])
    try:
        wait_for(tmp_path / "at-1", fit)
        proxy.hang()
        (tmp_path / "go-1").touch()
        deadline = time.monotonic() + 60
        while not proxy.held:  # epoch 2's metrics: sent, not answered; its checkpoint waits for them next
            assert fit.poll() is None and time.monotonic() < deadline, "no request reached the hung server"
            time.sleep(0.05)
        time.sleep(1.5)
        stderr, stopped_in = sigterm(fit, bound_s=9)
    finally:
        fit.kill()
        proxy.down()
    assert fit.returncode == 143, stderr[-3000:]
    # 2.6 s idle, up to 6.3 s at a load of 12 on 2 cores: the run's end waits 2 s for the server. Had the checkpoint
    # waited its 10 s, 8.5 s more: 11 s at the least.
    assert stopped_in < 9, f"{stopped_in:.1f} s; the fit's stderr:\n{stderr[-8000:]}"


@pytest.mark.slow
def test_sigterm_ends_a_fit_within_seconds_while_the_tracking_server_hangs(mlflow_server, tmp_path):
    proxy = OutageProxy(mlflow_server)
    fit = held_fit(proxy.url, tmp_path, epochs=10_000, held_at=[1, 3])
    try:
        wait_for(tmp_path / "at-1", fit)
        proxy.hang()  # takes every request, answers none: each of MLflow's waits its timeout
        (tmp_path / "go-1").touch()
        wait_for(tmp_path / "at-3", fit)
        (tmp_path / "go-3").touch()
        time.sleep(1)
        stderr, stopped_in = sigterm(fit, bound_s=20)
    finally:
        fit.kill()
        proxy.down()
    assert fit.returncode == 143, stderr[-3000:]
    # The requirement: within seconds, whatever MLflow is doing.
    assert stopped_in < 20, f"{stopped_in:.1f} s; the fit's stderr:\n{stderr[-8000:]}"
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"warning: the tracking server {proxy.url} has not answered since ")
    assert " (a request still unanswered): " in last  # none has failed yet: MLflow's retries take ~33 s
    assert re.search(r": \d+ metrics, the checkpoints' upload, the run's end \(failed\) of run \w+ were not", last)
    assert last.endswith("were not recorded there and are lost; the checkpoints are on disk")
