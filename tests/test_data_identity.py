"""Every run knows which data it saw: a row's split is a function of the row (edits and appended rows move no tested
row into training), a checkpoint keeps its split's rule, digest and schema, test and resume compare with them, and
the run logs its datasets to MLflow.

    .venv/bin/python -m pytest -q tests/test_data_identity.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from datamodules.errors import DataError
from datamodules.table import TableDataModule
from tests.conftest import run_module


def wine(rows: int, seed: int = 0) -> pd.DataFrame:
    """A messy wine-like table: three qualities told apart by alcohol and acidity, a colour, missing cells, copies."""
    generator = np.random.default_rng(seed)
    quality = generator.integers(0, 3, rows)
    table = pd.DataFrame({
        "alcohol": np.round(9 + 1.5 * quality + generator.normal(0, 0.4, rows), 2),
        "acidity": np.round(3.5 - 0.3 * quality + generator.normal(0, 0.1, rows), 3),
        "colour": generator.choice(["red", "white", "rosé"], rows),
        "quality": quality,
    })  # fmt: skip
    table.loc[generator.choice(rows, 5, replace=False), "acidity"] = np.nan
    return pd.concat([table, table.iloc[:6]], ignore_index=True)  # six exact copies


def contents(frame: pd.DataFrame) -> set[str]:
    return {frame.iloc[i].to_json() for i in range(len(frame))}


def split_of(path: Path, **options) -> TableDataModule:
    data = TableDataModule(str(path), "quality", **options)
    data.setup("fit")
    return data


def test_appending_editing_and_reordering_rows_moves_no_tested_row_into_training(tmp_path):
    table = wine(300)
    table.to_csv(tmp_path / "before.csv", index=False)
    edited = table.copy()
    edited.loc[[3, 50, 120], "alcohol"] += 0.01  # three rows corrected
    later = pd.concat([edited, wine(60, seed=1)]).sample(frac=1, random_state=0)  # appended, re-exported shuffled
    later.to_csv(tmp_path / "after.csv", index=False)
    before, after = split_of(tmp_path / "before.csv"), split_of(tmp_path / "after.csv")
    tested_before = contents(before.raw["test"][0]) | contents(before.raw["val"][0])
    assert not tested_before & contents(after.raw["train"][0])
    every_after = set().union(*(contents(after.raw[name][0]) for name in ("train", "val", "test")))
    unchanged = contents(before.raw["test"][0]) & every_after  # all but the edited ones: each still tested
    assert len(unchanged) >= len(contents(before.raw["test"][0])) - 3 and unchanged <= contents(after.raw["test"][0])
    assert before.identity["digest"] != after.identity["digest"]
    for name in ("train", "val", "test"):  # every class reaches every split, and copies stay together
        assert set(after.raw[name][2].tolist()) == {0, 1, 2}
    train, test = contents(after.raw["train"][0]), contents(after.raw["test"][0]) | contents(after.raw["val"][0])
    assert not train & test


def test_the_id_column_alone_decides_so_an_edited_row_keeps_its_split(tmp_path):
    table = wine(200).assign(bottle=lambda frame: [f"b{i % 190}" for i in range(len(frame))])
    table.to_csv(tmp_path / "ids.csv", index=False)
    edited = table.assign(alcohol=table["alcohol"] + 0.5)
    edited.to_csv(tmp_path / "edited.csv", index=False)
    before, after = (
        split_of(tmp_path / "ids.csv", id_column="bottle"),
        split_of(tmp_path / "edited.csv", id_column="bottle"),
    )
    for name in ("train", "val", "test"):
        assert set(before.raw[name][0]["bottle"]) == set(after.raw[name][0]["bottle"])
    assert "bottle" not in [column["name"] for column in before.state["columns"]]  # it names rows, it is not learnt
    with pytest.raises(DataError, match=r"no column 'cork'; give data.init_args.id_column one of its columns"):
        split_of(tmp_path / "ids.csv", id_column="cork")


def test_a_checkpoint_s_split_rule_wins_over_the_config_s(tmp_path, capsys):
    """The wine case: a model fit with split seed 0, tested with the config's 42, was scored on its training rows."""
    wine(300).to_csv(tmp_path / "wine.csv", index=False)
    fitted = split_of(tmp_path / "wine.csv", seed=0)
    state = fitted.state_dict()
    tested = TableDataModule(str(tmp_path / "wine.csv"), "quality", seed=42)
    tested.setup("test")
    assert contents(tested.raw["test"][0]) & contents(fitted.raw["train"][0])  # seed 42's test rows: trained ones
    capsys.readouterr()
    tested.load_state_dict(state)
    assert contents(tested.raw["test"][0]) == contents(fitted.raw["test"][0])
    assert "data.init_args.seed 0, not 42" in capsys.readouterr().err
    assert tested.identity["splits"]["test"] == fitted.identity["splits"]["test"]


def test_the_checkpoint_keeps_the_digest_rule_and_schema(tmp_path):
    wine(100).to_csv(tmp_path / "wine.csv", index=False)
    identity = split_of(tmp_path / "wine.csv", seed=3).state_dict()["identity"]
    assert identity["split"] == {"method": "row hash", "seed": 3, "val_fraction": 0.15, "test_fraction": 0.15,
                                 "id_column": None, "columns": ["alcohol", "acidity", "colour", "quality"]}  # fmt: skip
    assert identity["schema"] == {"alcohol": "numeric", "acidity": "numeric", "colour": "categorical",
                                  "quality": "label"}  # fmt: skip
    assert identity["rows"] == 106 and len(identity["digest"]) == 16
    assert sum(part["rows"] for part in identity["splits"].values()) == 106
    assert isinstance(identity["row_hashes"], torch.Tensor) and len(identity["row_hashes"]) == 106


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> dict:
    """One fit of the wine table with split seed 0, one epoch, its checkpoints in a folder of their own."""
    folder = tmp_path_factory.mktemp("wine")
    wine(300).to_csv(folder / "wine.csv", index=False)
    fit = run_module("scripts.train", *table_args(folder, "fit", folder / "wine.csv"), "--data.init_args.seed", "0",
                     "--trainer.max_epochs", "1", "--checkpoint_dir", folder / "checkpoints")  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    return {"folder": folder, "stderr": fit.stderr}


def table_args(folder: Path, command: str, csv: Path) -> list:
    return [command, "--config", "configs/table.yaml", "--data.init_args.csv_path", csv, "--data.init_args.label",
            "quality", "--trainer.default_root_dir", folder / "outputs"]  # fmt: skip


def dataset_inputs(folder: Path) -> dict[str, list[tuple[str, str]]]:
    """Each run's (context, digest) dataset inputs, by run name's command (fit-..., test-...)."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'outputs' / 'mlflow.db'}")
    runs = [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]
    return {run.info.run_name.split("-")[0]: sorted((next(t.value for t in d.tags), d.dataset.digest)
                                                    for d in run.inputs.dataset_inputs) for run in runs}  # fmt: skip


@pytest.mark.slow
def test_a_fit_logs_its_splits_and_a_test_with_another_seed_tests_the_fit_s_test_rows(fitted):
    folder = fitted["folder"]
    test = run_module("scripts.train", *table_args(folder, "test", folder / "wine.csv"), "--ckpt_path",
                      folder / "checkpoints" / "best.ckpt")  # fmt: skip
    assert test.returncode == 0, test.stderr[-3000:]
    assert "split as the checkpoint's fit split it (data.init_args.seed 0, not 42)" in test.stderr
    inputs = dataset_inputs(folder)
    assert [context for context, _ in inputs["fit"]] == ["test", "training", "validation"]
    assert inputs["test"] == [pair for pair in inputs["fit"] if pair[0] == "test"]  # the same test rows, by digest


@pytest.mark.slow
def test_a_resume_on_appended_rows_says_so_and_goes_on(fitted, tmp_path):
    folder = fitted["folder"]
    shutil.copytree(folder / "checkpoints", tmp_path / "checkpoints")
    pd.concat([wine(300), wine(40, seed=5)]).to_csv(tmp_path / "more.csv", index=False)
    resume = run_module("scripts.train", *table_args(tmp_path, "fit", tmp_path / "more.csv"), "--data.init_args.seed",
                        "0", "--trainer.max_epochs", "2", "--checkpoint_dir", tmp_path / "checkpoints")  # fmt: skip
    assert resume.returncode == 0, resume.stderr[-3000:]
    assert "not the table the checkpoint saw (40 rows added, 0 removed;" in resume.stderr


@pytest.mark.slow
def test_a_resume_without_a_column_is_refused_in_one_line(fitted, tmp_path):
    folder = fitted["folder"]
    shutil.copytree(folder / "checkpoints", tmp_path / "checkpoints")
    wine(300).drop(columns="colour").to_csv(tmp_path / "fewer.csv", index=False)
    resume = run_module("scripts.train", *table_args(tmp_path, "fit", tmp_path / "fewer.csv"), "--data.init_args.seed",
                        "0", "--trainer.max_epochs", "2", "--checkpoint_dir", tmp_path / "checkpoints")  # fmt: skip
    assert resume.returncode == 1 and "Traceback" not in resume.stderr
    assert resume.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'fewer.csv'}: no column 'colour', which the checkpoint's split was made by (it hashed "
        "'alcohol', 'acidity', 'colour', 'quality'); give the table it was trained on"
    )


@pytest.mark.slow
def test_a_tracking_server_without_the_datasets_route_costs_one_note(mlflow_server, tmp_path, monkeypatch):
    """Azure ML's MLflow lacks some of MLflow's routes: a store that answers log-inputs 404 gets one line, and the run
    has everything else."""
    import re

    from mlflow import MlflowClient

    from tests import azure_world

    lacks = re.compile(azure_world.AZURE_LACKS.pattern.replace("(logged-models", "(runs/log-inputs|logged-models"))
    monkeypatch.setattr(azure_world, "AZURE_LACKS", lacks)
    proxy = azure_world.AzureTrackingProxy(mlflow_server)
    try:
        env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
        args = ["--trainer.max_epochs", "1", "--trainer.default_root_dir", tmp_path / "outputs",
                "--trainer.logger.init_args.experiment_name", tmp_path.name]  # fmt: skip
        fit = run_module("scripts.train", "fit", "--config", "configs/penguins.yaml", *args,
                         env={**env, "MLFLOW_TRACKING_URI": proxy.url})  # fmt: skip
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert fit.returncode == 0, fit.stderr[-3000:]
    (note,) = [line for line in fit.stderr.splitlines() if "did not take the run's datasets" in line]
    assert (
        note.startswith("note: the tracking store did not take the run's datasets (") and "ENDPOINT_NOT_FOUND" in note
    )
    assert any("runs/log-inputs" in path for path in proxy.refused)
    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name(tmp_path.name).experiment_id])
    assert run.info.status == "FINISHED" and "test_acc" in run.data.metrics and not run.inputs.dataset_inputs
