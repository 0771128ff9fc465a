"""What a fit guards against that a careless user or a failing server brings: a table's exact copies across the
split, a constant penguin column, two fits in one --checkpoint_dir at once, a tracking server that answers HTTP 500,
and what a fit stopped by SIGTERM says.

.venv/bin/python -m pytest -q tests/test_fit_guards.py
"""

from __future__ import annotations

import http.server
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from datamodules.base import row_hashes
from datamodules.errors import DataError
from datamodules.penguins import FEATURES, PenguinDataModule
from tests import warm_launcher
from tests.conftest import REPO, run_module


def penguins_twice(tmp_path: Path) -> Path:
    from palmerpenguins import load_penguins

    table = load_penguins()
    path = tmp_path / "twice.csv"
    pd.concat([table, table]).to_csv(path, index=False)
    return path


def test_a_table_s_exact_copies_stay_in_one_split_and_are_counted(tmp_path, capsys):
    path = penguins_twice(tmp_path)
    data = PenguinDataModule(csv_path=str(path))
    data.setup("fit")
    assert "342 rows are exact copies of others" in capsys.readouterr().err
    from datamodules.penguins import read_penguins

    table = read_penguins(str(path))
    copies = row_hashes(table[[*FEATURES, "species"]]).tolist()
    train, val, test = ({copies[i] for i in rows.tolist()} for rows in data.split_rows)
    assert not train & test and not train & val and not val & test


def test_the_any_table_task_keeps_copies_together_too(tmp_path, capsys):
    from datamodules.table import TableDataModule

    rows = pd.DataFrame({"x": range(60), "colour": ["red", "blue", "green"] * 20, "kind": ["a", "b"] * 30})
    pd.concat([rows, rows, rows]).to_csv(tmp_path / "t.csv", index=False)
    data = TableDataModule(csv_path=str(tmp_path / "t.csv"), label="kind")
    data.setup("fit")
    assert "120 rows are exact copies of others" in capsys.readouterr().err
    names = {split: {str(row.tolist()) for row in data.raw[split][0].to_numpy()} for split in ("train", "val", "test")}
    assert not names["train"] & names["test"] and not names["train"] & names["val"]


def test_a_constant_penguin_column_is_named_at_fit(tmp_path):
    from palmerpenguins import load_penguins

    table = load_penguins()
    table["flipper_length_mm"] = 200.0  # a plausible flipper, the same for every penguin
    table.to_csv(tmp_path / "flat.csv", index=False)
    with pytest.raises(DataError, match=r"column flipper_length_mm is 200 in every training row \(a constant\)"):
        PenguinDataModule(csv_path=str(tmp_path / "flat.csv")).setup("fit")


def fit(folder: Path, *args: str) -> list[str]:
    return ["fit", "--config", "configs/penguins.yaml", "--checkpoint_dir", str(folder / "checkpoints"),
            "--trainer.default_root_dir", str(folder / "outputs"), *args]  # fmt: skip


def started(folder: Path, *args: str) -> warm_launcher.Command:
    """A long fit (forked from the warm launcher), once its first epoch's last.ckpt is written."""
    process = warm_launcher.start("scripts.train", fit(folder, "--trainer.max_epochs", "100000", *args), REPO)
    deadline = time.monotonic() + 300
    while not (folder / "checkpoints" / "last.ckpt").exists():
        assert process.poll() is None and time.monotonic() < deadline, "the fit wrote no last.ckpt"
        time.sleep(0.2)
    return process


@pytest.mark.slow
def test_a_second_fit_in_a_busy_checkpoint_dir_is_one_line_and_a_killed_one_leaves_no_lock(tmp_path):
    first = started(tmp_path)
    try:
        second = run_module("scripts.train", *fit(tmp_path), "--trainer.max_epochs", "100000")  # the same command
        assert second.returncode == 1 and "Traceback" not in second.stderr
        assert second.stderr.strip().splitlines()[-1] == (
            f"error: --checkpoint_dir {tmp_path / 'checkpoints'}: another fit is writing there (it holds "
            f"{tmp_path / 'checkpoints' / 'fit.lock'}); wait for it to end, or give another folder"
        )
    finally:
        first.kill()
        first.communicate()
    again = run_module("scripts.train", *fit(tmp_path), "--trainer.max_epochs", "100000", "--trainer.max_time",
                       "00:00:00:02")  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming from {tmp_path / 'checkpoints' / 'last.ckpt'}" in again.stdout


@pytest.mark.slow
def test_sigterm_says_where_the_fit_stopped_and_how_to_go_on(tmp_path):
    process = started(tmp_path)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    last = tmp_path / "checkpoints" / "last.ckpt"
    epoch = torch.load(last, weights_only=False)["epoch"]
    lines = [line for line in stderr.splitlines() if line.startswith("stopped by SIGTERM")]
    assert lines and lines[0].startswith(f"stopped by SIGTERM at epoch {epoch + 1}: {last} holds the last finished")
    assert lines[0].endswith(f"with --checkpoint_dir {tmp_path / 'checkpoints'} (the same MLflow run) goes on from it")


class Failing(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(500, "Internal Server Error")

    do_POST = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
def test_a_tracking_server_that_answers_500_is_one_line_and_leaves_nothing(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_port}"
    try:
        result = run_module("scripts.train", *fit(tmp_path), env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: MLFLOW_TRACKING_URI {uri}: the tracking server answers HTTP 500 (Internal Server Error); check the "
        "server (its log says why), or unset MLFLOW_TRACKING_URI to track to outputs/mlflow.db"
    )
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_a_resume_from_data_moved_elsewhere_goes_on_in_the_same_run(tmp_path):
    """docs/tracking.md lets a resume change where the data is found: the run keeps its first parameters (MLflow
    refuses a changed value) and records the new config in its config.yaml."""
    import shutil

    import yaml
    from mlflow import MlflowClient

    first, moved = tmp_path / "a.csv", tmp_path / "moved" / "a.csv"
    penguins_twice(tmp_path).rename(first)
    moved.parent.mkdir()
    shutil.copy(first, moved)
    args = fit(tmp_path, "--data.init_args.csv_path", str(first), "--trainer.max_epochs", "1")
    assert run_module("scripts.train", *args).returncode == 0
    args = fit(tmp_path, "--data.init_args.csv_path", str(moved), "--trainer.max_epochs", "2")
    result = run_module("scripts.train", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.params["data.init_args.csv_path"] == str(first)
    (config,) = (tmp_path / "outputs").glob("*/*/config.yaml")
    assert yaml.safe_load(config.read_text())["data"]["init_args"]["csv_path"] == str(moved)
