"""The penguin task through the real CLI: fit, validate, test, predict, resume, MLflow content, bad input."""

from __future__ import annotations

import os
import re
import sys  # extra: serving
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient
from mlflow.entities import ViewType

from tests.conftest import REPO, run_module

pytestmark = pytest.mark.slow  # every test here runs the CLI, most of them after a real fit

EPOCHS = 8
MODEL = "penguins-classifier"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One short real fit, shared by the tests below: (outputs folder, stdout, best checkpoint)."""
    outputs = tmp_path_factory.mktemp("penguins") / "outputs"
    result = run_module(
        "scripts.train", "fit", "--config", "configs/penguins.yaml",
        "--trainer.max_epochs", EPOCHS, "--trainer.default_root_dir", outputs,
        "--register_model", MODEL,  # extra: serving
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    best = Path(re.search(r"best checkpoint: (\S+)", result.stdout).group(1))
    return outputs, result.stdout, best


def only_run(outputs: Path):
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "penguins"]
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


def test_fit_tests_the_best_checkpoint_and_prints_test_acc(fitted):
    outputs, stdout, best = fitted
    assert best.name == "best.ckpt" and best.is_file() and (best.parent / "last.ckpt").is_file()
    assert best.parent.parent == outputs / best.parts[-4] / best.parts[-3]  # outputs/<exp>/<run>/checkpoints
    accuracy = float(re.search(r"test_acc: ([\d.]+)", stdout).group(1))
    assert 0.4 < accuracy <= 1.0  # 8 epochs of the course recipe: well past chance (1/3), not yet converged


def test_lightning_cli_still_saves_the_private_keys_the_template_reads(fitted):
    """Canary of the README's private names: LightningCLI's `_class_path` in a checkpoint's datamodule
    hyperparameters (scripts/export.py rebuilds the datamodule from it) and `_instantiator` in both (an object's
    address: scripts/training/same_start.py leaves it out of what the processes of a job compare)."""
    saved = torch.load(fitted[2], map_location="cpu", weights_only=False)
    assert saved["datamodule_hyper_parameters"]["_class_path"] == "datamodules.penguins.PenguinDataModule"
    assert "_instantiator" in saved["hyper_parameters"] and "_instantiator" in saved["datamodule_hyper_parameters"]


def test_mlflow_run_holds_params_epoch_metrics_config_and_checkpoint(fitted):
    outputs, _, best = fitted
    client, run = only_run(outputs)
    assert run.info.status == "FINISHED" and run.info.run_id == best.parts[-3]
    params = run.data.params
    assert params["trainer.max_epochs"] == str(EPOCHS)
    assert params["model.optimizer.class_path"] == "torch.optim.Adam"
    assert params["model.optimizer.init_args.lr"] == "0.001"
    assert params["data.init_args.batch_size"] == "20"
    assert params["trainer.logger.init_args.synchronous"] == "None"  # local sqlite: logged synchronously
    for key in ("train_loss", "val_loss", "val_acc", "train_acc", "train_samples_per_sec"):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == list(range(EPOCHS)), key  # the epoch is the step
    assert all(m.value > 0 for m in client.get_metric_history(run.info.run_id, "train_samples_per_sec"))
    # The step-level curve: every log_every_n_steps (50) optimizer steps of the 8 x 12.
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss_step")] == [49]
    assert "test_acc" in run.data.metrics
    artifacts = client.download_artifacts(run.info.run_id, "", str(outputs.parent / "artifacts"))
    config = yaml.safe_load((Path(artifacts) / "config.yaml").read_text())
    assert config["trainer"]["max_epochs"] == EPOCHS
    assert (Path(artifacts) / "best" / "best.ckpt").stat().st_size == best.stat().st_size


def test_validate_and_test_on_the_best_checkpoint_measure_what_fit_did(fitted, train_cli, tmp_path):
    """validate and test of best.ckpt, each a run of its own, give the fit run's validation metrics of the best epoch
    and its test_acc (fit tests the best checkpoint at its end)."""
    outputs, _, best = fitted
    client, fit_run = only_run(outputs)
    best_epoch = torch.load(best, weights_only=False)["epoch"]
    expected = {f"val_{m}": next(x.value for x in client.get_metric_history(fit_run.info.run_id, f"val_{m}")
                                 if x.step == best_epoch) for m in ("loss", "acc")}  # fmt: skip
    expected["test_acc"] = fit_run.data.metrics["test_acc"]
    for subcommand, names in (("validate", ("val_loss", "val_acc")), ("test", ("test_acc",))):
        result = train_cli(subcommand, "--config", "configs/penguins.yaml", "--ckpt_path", best)
        assert result.returncode == 0, result.stderr[-2000:]
        store = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
        experiments = [e.experiment_id for e in store.search_experiments()]
        (run,) = store.search_runs(experiments, f"attributes.run_name LIKE '{subcommand}-%'")
        assert {name: run.data.metrics[name] for name in names} == pytest.approx({n: expected[n] for n in names})


def test_predict_prints_one_species_per_row(fitted, train_cli, tmp_path):
    _, _, best = fitted
    new = tmp_path / "new.csv"
    new.write_text(
        "species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g\n"
        ",Biscoe,50.4,15.3,200,5000\n,Torgersen,,,,\n,Dream,46.5,17.9,192,3500\n"
    )
    result = train_cli("predict", "--config", "configs/penguins.yaml", "--ckpt_path", best, "--data.predict_path", new)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = result.stdout.splitlines()  # stdout is the CSV alone (`predict > out.csv`): no progress bar, no run URL
    assert rows[0] == "input,class,probability" and len(rows) == 3
    assert [r.split(",")[0] for r in rows[1:]] == ["line 2", "line 4"]  # line 3 has no measurements
    skipped = f"{new}: line 3 has no bill_length_mm, bill_depth_mm, flipper_length_mm, body_mass_g: skipped, no answer"
    assert f"{skipped} for it" in result.stderr.splitlines()  # named, not lost without a word
    assert "dirpath has changed" not in result.stderr  # the fit's ModelCheckpoint state: nothing to act on here
    assert all(r.split(",")[1] in ("Adelie", "Gentoo", "Chinstrap") for r in rows[1:])
    assert not (tmp_path / "outputs").exists()  # predict records nothing: no MLflow run, no config.yaml


def test_the_course_example_penguin_is_a_gentoo(fitted, train_cli):
    """The course's example (Biscoe, 50.4 x 15.3 mm culmen, 200 mm flipper, 5 kg) after a full recipe run."""
    result = train_cli(
        "fit",
        "--config",
        "configs/penguins.yaml",
        "--test_after_fit",
        "false",
        "--trainer.enable_checkpointing",
        "true",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    best = re.search(r"best checkpoint: (\S+)", result.stdout).group(1)
    result = train_cli(
        "predict", "--config", "configs/penguins.yaml", "--ckpt_path", best,
        "--data.predict_path", REPO / "configs/examples/penguins.csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-3].split(",")[1] == "Gentoo"


def test_resume_from_last_checkpoint_continues_the_epochs(fitted, train_cli):
    _, _, best = fitted
    result = train_cli(
        "fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", EPOCHS + 2,
        "--ckpt_path", best.parent / "last.ckpt", "--test_after_fit", "false",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"Restoring states from the checkpoint path at {best.parent / 'last.ckpt'}" in result.stderr
    assert f"`max_epochs={EPOCHS + 2}` reached" in result.stderr


def test_mlflow_environment_variables_choose_store_and_run(tmp_path, train_cli):
    """Azure ML hands over MLFLOW_TRACKING_URI and MLFLOW_RUN_ID: metrics must land in that run."""
    uri = f"sqlite:///{tmp_path / 'azure.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("job")).info.run_id
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run_id}
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", 2, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    run = client.get_run(run_id)
    assert {"val_loss", "test_acc"} <= set(run.data.metrics)
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


def test_print_config_shows_the_resolved_recipe(train_cli):
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--print_config")
    assert result.returncode == 0
    config = yaml.safe_load(result.stdout)
    assert config["trainer"]["max_epochs"] == 100
    assert config["data"]["init_args"]["batch_size"] == 20
    assert config["model"]["optimizer"]["init_args"]["lr"] == 0.001
    assert (config["checkpoint"]["monitor"], config["checkpoint"]["filename"]) == ("val_loss", "best")
    assert (config["last_checkpoint"]["monitor"], config["last_checkpoint"]["filename"]) == (None, "last")


def test_unknown_island_at_predict_time(fitted, train_cli, tmp_path):
    _, _, best = fitted
    new = tmp_path / "new.csv"
    new.write_text("Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nAtlantis,50.4,15.3,200,5000\n")
    result = train_cli("predict", "--config", "configs/penguins.yaml", "--ckpt_path", best, "--data.predict_path", new)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert str(new) in last and "unknown island 'Atlantis'" in last


# extra: serving
def test_fit_registers_the_best_network_as_a_pyfunc_with_its_class_names_and_program(fitted):
    import mlflow
    import numpy as np
    import pandas as pd

    from datamodules.penguins import PenguinDataModule
    from datamodules.preprocessing.penguins import ISLANDS
    from lightning_modules.classifier import ClassificationModule

    outputs, stdout, best = fitted
    assert f"registered model: {MODEL} version 1" in stdout
    client, run = only_run(outputs)
    (version,) = client.search_model_versions(f"name = '{MODEL}'")
    assert version.run_id == run.info.run_id
    mlflow.set_tracking_uri(f"sqlite:///{outputs / 'mlflow.db'}")
    (loaded := outputs / "loaded").mkdir()  # without dst_path MLflow downloads into a /tmp folder it never removes
    try:
        registered = mlflow.pyfunc.load_model(f"models:/{MODEL}/1", dst_path=str(loaded))
        folder = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}/1", dst_path=str(outputs / "registered")))
    finally:
        mlflow.set_tracking_uri(None)
    assert registered.metadata.metadata["class_names"] == PenguinDataModule.class_names
    data = PenguinDataModule()
    data.setup("test")
    inputs, raw = data.splits["test"][0][:13], data.raw["test"][0][:13]  # another batch size than the example's
    network = ClassificationModule.load_from_checkpoint(best, map_location="cpu").network.eval()
    program = torch.export.load(folder / "artifacts" / "model.pt2").module()  # torch.export's: no code of ours needed
    with torch.no_grad():
        logits = network(inputs)
        assert torch.allclose(program(inputs), logits, atol=1e-6)
    rows = pd.DataFrame(raw[:, 1:].numpy(), columns=["CulmenLength", "CulmenDepth", "FlipperLength", "BodyMass"])
    rows.insert(0, "Island", [ISLANDS[int(i)] for i in raw[:, 0]])  # the course's schema, raw measurements
    answers = registered.predict(rows)
    assert list(answers.columns) == [
        "class",
        "probability",
        *(f"probability_{c}" for c in PenguinDataModule.class_names),
    ]
    probabilities = torch.softmax(logits, 1).numpy()
    assert np.allclose(answers.iloc[:, 2:].to_numpy(), probabilities, atol=1e-5)


def test_register_model_without_mlflow_stops_before_training(train_cli):
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.logger", "false", "--register_model", "x")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --register_model needs the MLflow logger and checkpoints; check trainer.logger"
    )


# end extra: serving
def test_a_fit_that_trains_no_step_is_one_line_and_no_run(train_cli, tmp_path):
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.limit_train_batches", "0")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: the fit trained no step")
    assert "test_acc" not in result.stdout  # an untrained network's accuracy is not presented as the model's
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], run_view_type=ViewType.ALL)
    assert runs == []  # it failed before its first step: no run (docs/tracking.md)


# extra: serving
def test_a_registry_refusal_after_the_fit_is_one_line_that_keeps_the_fit_and_says_how_to_register_it(
    train_cli, tmp_path
):
    """A real store whose registry refuses the new version, as a concurrent registration of the same name does
    (RESOURCE_ALREADY_EXISTS): the printed command registers the run's model once the registry takes it."""
    import shlex
    import sqlite3
    import subprocess

    store = tmp_path / "outputs" / "mlflow.db"
    store.parent.mkdir()
    MlflowClient(f"sqlite:///{store}").search_experiments()  # MLflow's own migrations make the store
    with sqlite3.connect(store) as db:
        db.execute("CREATE TRIGGER taken BEFORE INSERT ON model_versions BEGIN SELECT RAISE(ABORT, "
                   "'UNIQUE constraint failed: model_versions.name, model_versions.version'); END")  # fmt: skip
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "1",
                       "--register_model", MODEL)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    client, run = only_run(tmp_path / "outputs")
    best = Path(re.search(r"best checkpoint: (\S+)", result.stdout).group(1))
    assert line.startswith(f"error: --register_model {MODEL}: the MLflow registry refused it (") and best.is_file()
    assert f"the fit, its MLflow run and its checkpoints are kept (best: {best}), the model is logged" in line
    assert run.info.status == "FINISHED" and "test_acc" in run.data.metrics
    with sqlite3.connect(store) as db:
        db.execute("DROP TRIGGER taken")
    later = line.split("register it later with ", 1)[1]
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `python`: this environment's
    done = subprocess.run(later, shell=True, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PATH": path})
    assert done.returncode == 0, done.stderr[-2000:]
    (version,) = client.search_model_versions(f"name = '{MODEL}'")
    assert version.run_id == run.info.run_id and shlex.split(later)[0].startswith("MLFLOW_TRACKING_URI=")


# end extra: serving


def test_an_overlay_that_replaces_the_tasks_callbacks_says_so(train_cli, tmp_path):
    """LightningCLI replaces a list a later --config gives: the task's EarlyStopping goes, now with a note."""
    overlay = tmp_path / "lr_monitor.yaml"
    overlay.write_text("trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.LearningRateMonitor\n")
    result = train_cli("fit", "--config", "configs/penguins.yaml", "--config", str(overlay), "--trainer.max_epochs",
                       "1", "--test_after_fit", "false")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"note: --config {overlay} names trainer.callbacks, which replaces those of configs/penguins.yaml: "
        "EarlyStopping dropped; to add callbacks to a task's, give --trainer.callbacks+ CLASS on the command line "
        "instead"
    ) in result.stderr.splitlines()
