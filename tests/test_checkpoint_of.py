"""`make predict / evaluate / export / serve` take the newest checkpoint trained on the data the config and ARGS name
(scripts/checkpoint_of.py), or list the runs to choose from.

    .venv/bin/python -m pytest -q tests/test_checkpoint_of.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, bird_folders, run_module, write_images


def fake_run(outputs: Path, run: str, data: dict) -> Path:
    """A run folder as scripts.train leaves it: config.yaml (its data: part) and checkpoints/best.ckpt."""
    folder = outputs / "1" / run
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"trainer": {}, "data": data}))
    best = folder / "checkpoints" / "best.ckpt"
    best.write_bytes(b"")
    return best


def test_a_run_split_with_another_seed_is_never_chosen_to_evaluate(tmp_path):
    # The wine case: the newest run on this CSV was split with seed 0; `make evaluate` with the config's seed 42 took
    # it, and scored it on rows it had trained on.
    outputs, table = tmp_path / "outputs", tmp_path / "wine.csv"
    table.write_text("alcohol,quality\n9.1,5\n")
    data = {
        "class_path": "datamodules.table.TableDataModule",
        "init_args": {"csv_path": str(table), "label": "quality"},
    }
    seed_42 = fake_run(outputs, "a", {**data, "init_args": {**data["init_args"], "seed": 42, "val_fraction": 0.15}})
    time.sleep(0.01)
    fake_run(outputs, "b", {**data, "init_args": {**data["init_args"], "seed": 0, "val_fraction": 0.15}})
    args = ["--config", "configs/table.yaml", "--data.init_args.csv_path", table, "--data.init_args.label", "quality",
            "--trainer.default_root_dir", outputs]  # fmt: skip
    found = run_module("scripts.checkpoint_of", *args)
    assert found.returncode == 0 and found.stdout.strip() == str(seed_42), found.stderr
    refused = run_module("scripts.checkpoint_of", *args, "--data.init_args.seed", "7")
    assert refused.returncode == 1
    seed_0 = outputs / "1" / "b" / "checkpoints" / "best.ckpt"
    assert f"{seed_0} (TableDataModule on csv_path={table}, label=quality, seed=0)" in refused.stderr


def test_an_mnist_run_validated_on_another_share_is_never_chosen_to_evaluate(tmp_path):
    """MNIST's validation images are about val_size of its training file's: a run with another is split otherwise."""
    outputs = tmp_path / "outputs"
    data = {"class_path": "datamodules.mnist.MNISTDataModule", "init_args": {"data_dir": "data/mnist", "seed": 42}}
    default = fake_run(outputs, "a", {**data, "init_args": {**data["init_args"], "val_size": 5000}})
    time.sleep(0.01)
    fake_run(outputs, "b", {**data, "init_args": {**data["init_args"], "val_size": 1000}})
    found = run_module("scripts.checkpoint_of", "--config", "configs/mnist.yaml", "--trainer.default_root_dir", outputs)
    assert found.returncode == 0 and found.stdout.strip() == str(default), found.stderr


def folder_data(path: Path | str) -> dict:
    return {"class_path": "datamodules.image_folder.ImageFolderDataModule",
            "init_args": {"data_dir": str(path), "archive": None, "predict_path": None, "batch_size": 16}}  # fmt: skip


def checkpoint_of(*args) -> subprocess.CompletedProcess:
    return run_module("scripts.checkpoint_of", "--config", "configs/birds.yaml", *args)


def test_the_newest_run_on_the_same_folder_is_chosen_whatever_its_path_is_spelt(tmp_path):
    outputs = tmp_path / "outputs"
    older = fake_run(outputs, "a", folder_data(tmp_path / "ducks"))
    time.sleep(0.01)
    newer = fake_run(outputs, "b", folder_data(f"{tmp_path}/./ducks/"))
    time.sleep(0.01)
    fake_run(outputs, "c", folder_data(tmp_path / "geese"))  # the newest of all, on other data
    os.utime(older, (1, 1))
    found = checkpoint_of("--data.init_args.data_dir", tmp_path / "ducks", "--trainer.default_root_dir", outputs)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(newer)


def test_options_that_are_not_the_datas_do_not_count(tmp_path):
    outputs = tmp_path / "outputs"
    best = fake_run(outputs, "a", folder_data(tmp_path / "ducks"))
    found = checkpoint_of(f"--data.init_args.data_dir={tmp_path / 'ducks'}", "--data.init_args.batch_size", "4",
                          "--port", "5002", "--trainer.default_root_dir", outputs)  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(best)


def test_a_folder_trained_on_by_no_run_lists_the_runs_in_one_line(tmp_path):
    outputs = tmp_path / "outputs"
    ducks = fake_run(outputs, "a", folder_data(tmp_path / "ducks"))
    penguins = fake_run(outputs, "b", {"class_path": "datamodules.penguins.PenguinsDataModule",
                                       "init_args": {"csv_path": None}})  # fmt: skip
    found = checkpoint_of("--data.init_args.data_dir", tmp_path / "swans", "--trainer.default_root_dir", outputs)
    assert found.returncode == 1 and found.stdout == ""
    (line,) = found.stderr.strip().splitlines()
    assert line.startswith(f"error: no run under {outputs}/ trained ImageFolderDataModule on data_dir={tmp_path}/swans")
    assert f"{ducks} (ImageFolderDataModule on data_dir={tmp_path}/ducks)" in line and str(penguins) in line
    assert "CKPT=" in line


def test_a_table_run_is_found_by_its_file_and_its_label_column(tmp_path):
    # The table task's data is two options: one CSV trained for two labels is two data, and a config's relative path
    # names the file a run recorded by its absolute path.
    outputs, table = tmp_path / "outputs", tmp_path / "visits.csv"
    table.write_text("age,outcome,ward\n1,a,x\n")

    def table_data(label: str) -> dict:
        return {"class_path": "datamodules.table.TableDataModule",
                "init_args": {"csv_path": str(table), "label": label, "batch_size": 16}}  # fmt: skip

    outcome = fake_run(outputs, "a", table_data("outcome"))
    time.sleep(0.01)
    ward = fake_run(outputs, "b", table_data("ward"))  # the newest, on another label
    for label, expected in (("outcome", outcome), ("ward", ward)):
        found = run_module("scripts.checkpoint_of", "--config", "configs/table.yaml", "--data.init_args.csv_path",
                           os.path.relpath(table, REPO), "--data.init_args.label", label,
                           "--trainer.default_root_dir", outputs)  # fmt: skip
        assert found.returncode == 0, found.stderr
        assert found.stdout.strip() == str(expected)
    other = run_module("scripts.checkpoint_of", "--config", "configs/table.yaml", "--data.init_args.csv_path",
                       table, "--data.init_args.label", "age", "--trainer.default_root_dir", outputs)  # fmt: skip
    assert other.returncode == 1 and "label=age" in other.stderr and str(outcome) in other.stderr
    bare = run_module("scripts.checkpoint_of", "--config", "configs/table.yaml", "--trainer.default_root_dir", outputs)
    (line,) = bare.stderr.strip().splitlines()  # the config names no table: the line says which options to give
    assert bare.returncode == 1 and "give the fit's --data.init_args.csv_path, --data.init_args.label in ARGS" in line


def test_no_run_at_all_says_train_first(tmp_path):
    found = checkpoint_of("--trainer.default_root_dir", tmp_path / "outputs")
    assert found.returncode == 1
    assert found.stderr.strip() == (
        f"error: no checkpoint under {tmp_path / 'outputs'}/; train on this data first (make train TASK=... "
        "ARGS=...), or give CKPT=path/to/best.ckpt"
    )


# ---- make, on two real fits of two folders -------------------------------------------------------------------------


def make(target: str, *variables: str) -> subprocess.CompletedProcess:
    venv = Path(sys.executable).parent.parent
    command = ["make", "--no-print-directory", f"--old-file={venv}/installed", target, f"VENV={venv}", *variables]
    environment = {key: value for key, value in os.environ.items() if key not in ("ARGS", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, env=environment)


def tiny(root: Path, outputs: Path) -> str:
    return (f"--data.init_args.data_dir {root} --data.init_args.archive null --data.init_args.image_size 32 "
            f"--data.init_args.num_workers 0 --trainer.default_root_dir {outputs}")  # fmt: skip


@pytest.fixture(scope="module")
def two_folders(tmp_path_factory) -> dict:
    """Birds fitted on folder `a` (chickens, turkeys), then on folder `b` (ducks, geese): b's run is the newer."""
    root = tmp_path_factory.mktemp("two")
    a = bird_folders(root / "a", count=2)
    b = root / "b"
    for split in ("train", "val"):
        for channel, name in enumerate(("ducks", "geese")):
            write_images(b / split / name, 2, channel)
    outputs = root / "outputs"
    for folder in (a, b):  # `make train TASK=birds ARGS=...` runs this fit; the make targets under test come after
        fit = run_module("scripts.train", "fit", "--config", "configs/birds.yaml", *tiny(folder, outputs).split(),
                         "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
                         "--test_after_fit", "false")  # fmt: skip
        assert fit.returncode == 0, fit.stderr[-3000:]
    write_images(root / "photos", 2, 0)
    return {"a": a, "b": b, "outputs": outputs, "photos": root / "photos", "root": root}


@pytest.mark.slow
def test_make_predict_takes_the_checkpoint_of_the_folder_it_is_given(two_folders):
    args = tiny(two_folders["a"], two_folders["outputs"])
    predict = make("predict", "TASK=birds", f"INPUT={two_folders['photos']}", f"ARGS={args}")
    assert predict.returncode == 0, predict.stderr[-3000:]
    (run_a,) = [path for path in two_folders["outputs"].glob("*/*/config.yaml") if str(two_folders["a"]) in
                path.read_text()]  # fmt: skip
    assert f"checkpoint: {run_a.parent / 'checkpoints' / 'best.ckpt'}" in predict.stderr
    rows = predict.stdout[predict.stdout.index("input,class,probability") :].splitlines()[1:]
    assert len(rows) == 2 and all(row.split(",")[1] in ("chickens", "turkeys") for row in rows)


@pytest.mark.slow
def test_make_predict_on_a_folder_no_run_trained_on_refuses_listing_the_runs(two_folders):
    other = bird_folders(two_folders["root"] / "c", count=2)
    predict = make("predict", "TASK=birds", f"INPUT={two_folders['photos']}",
                   f"ARGS={tiny(other, two_folders['outputs'])}")  # fmt: skip
    assert predict.returncode != 0
    (line,) = [line for line in predict.stderr.splitlines() if not line.startswith("make")]
    assert line.startswith("error: no run under") and f"data_dir={other}" in line
    assert f"data_dir={two_folders['a']})" in line and f"data_dir={two_folders['b']})" in line


@pytest.mark.slow
def test_make_export_takes_the_folder_from_fit_args(two_folders, tmp_path):
    export = make("export", "TASK=birds", f"FIT_ARGS={tiny(two_folders['b'], two_folders['outputs'])}",
                  f"ARGS=--output {tmp_path / 'b.onnx'}")  # fmt: skip
    assert export.returncode == 0, export.stderr[-3000:]
    assert (tmp_path / "b.onnx").is_file()


def run_of(two_folders: dict, name: str) -> Path:
    """The best checkpoint of the fit on folder `name` (a test run records a config.yaml too, and no checkpoint)."""
    runs = [path.parent for path in two_folders["outputs"].glob("*/*/config.yaml") if str(two_folders[name]) in
            path.read_text()]  # fmt: skip
    (best,) = [run / "checkpoints" / "best.ckpt" for run in runs if (run / "checkpoints" / "best.ckpt").is_file()]
    return best


@pytest.mark.slow
def test_make_predict_and_evaluate_take_the_other_folders_checkpoint_when_given_it(two_folders):
    args = tiny(two_folders["b"], two_folders["outputs"])
    predict = make("predict", "TASK=birds", f"INPUT={two_folders['photos']}", f"ARGS={args}")
    assert predict.returncode == 0, predict.stderr[-3000:]
    assert f"checkpoint: {run_of(two_folders, 'b')}" in predict.stderr
    rows = predict.stdout[predict.stdout.index("input,class,probability") :].splitlines()[1:]
    assert len(rows) == 2 and all(row.split(",")[1] in ("ducks", "geese") for row in rows)
    evaluate = make("evaluate", "TASK=birds", f"ARGS={tiny(two_folders['a'], two_folders['outputs'])}")
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    assert f"checkpoint: {run_of(two_folders, 'a')}" in evaluate.stderr


@pytest.mark.slow
def test_make_predict_refuses_grey_digits_for_a_checkpoint_of_colour_photos_in_one_line(two_folders):
    from PIL import Image

    digits = two_folders["root"] / "digits"
    digits.mkdir()
    for i in range(3):
        Image.new("L", (28, 28), 30 * i).save(digits / f"{i}.png")  # small grey pictures: another task's
    args = tiny(two_folders["a"], two_folders["outputs"])
    predict = make("predict", "TASK=birds", f"INPUT={digits}", f"ARGS={args}")
    assert predict.returncode != 0 and "input,class" not in predict.stdout
    (line,) = [line for line in predict.stderr.splitlines() if line.startswith("error:")]
    assert line == (
        f"error: {digits}: grey pictures, but this checkpoint was trained on colour images only (another task's "
        "data?); give it images like its training data, or give --ckpt_path a checkpoint trained on pictures like "
        "these (make predict takes the newest trained on the config's data_dir)"
    )
    # extra: serving
    # The registered model of that checkpoint (scripts.serve's, batch scoring's) refuses them alike (it answered
    # "chickens", HTTP 200).
    import mlflow
    import pandas as pd

    from scripts.serve import from_checkpoint
    from scripts.serving.pyfunc_model import ClassifierModel, InputError

    served = from_checkpoint(run_of(two_folders, "a"), two_folders["root"] / "served")
    model = mlflow.pyfunc.load_model(str(served))
    assert isinstance(model.unwrap_python_model(), ClassifierModel)
    images = pd.DataFrame({"image": [path.read_bytes() for path in sorted(digits.iterdir())]})
    with pytest.raises(InputError, match=r"^image 1: grey pictures, but this model was trained on colour images only"):
        model.predict(images)
    model.predict(pd.DataFrame({"image": [next((two_folders["photos"]).rglob("*.*")).read_bytes()]}))  # colour: fine
    # end extra: serving


@pytest.mark.parametrize(
    "class_path",
    ["datamodules.penguins.PenguinDataModule", "datamodules.mnist.MNISTDataModule",
     "datamodules.image_folder.ImageFolderDataModule", "datamodules.table.TableDataModule"],
)  # fmt: skip
def test_the_defaults_read_from_the_source_are_those_of_the_imported_signature(class_path):
    """Read from the source, without importing the datamodule (torch, Lightning: seconds of every `make predict`)."""
    import importlib
    import inspect

    from scripts.checkpoint_of import is_data_option, literal_defaults

    module, _, name = class_path.rpartition(".")
    signature = inspect.signature(getattr(importlib.import_module(module), name).__init__)
    expected = {key: parameter.default for key, parameter in signature.parameters.items()
                if is_data_option(key) and parameter.default is not inspect.Parameter.empty}  # fmt: skip
    assert literal_defaults(module, name) == expected


def test_a_default_that_is_no_literal_is_read_from_the_imported_class(tmp_path):
    (tmp_path / "own_data.py").write_text(
        "import os\nDATA = os.path.join('data', 'own')\n\n\nclass OwnData:\n"
        "    def __init__(self, data_dir: str = DATA, label: str = 'kind') -> None:\n        pass\n"
    )
    config = tmp_path / "own.yaml"
    config.write_text(yaml.safe_dump({"data": {"class_path": "own_data.OwnData"}}))
    best = fake_run(tmp_path / "outputs", "r1", {"class_path": "own_data.OwnData",
                                                 "init_args": {"data_dir": "data/own", "label": "kind"}})  # fmt: skip
    os.utime(best, (time.time() - 60, time.time() - 60))
    # Newer, of the same label but other data: taken if the default data_dir, which is no literal, were left out.
    fake_run(tmp_path / "outputs", "r2", {"class_path": "own_data.OwnData",
                                          "init_args": {"data_dir": "other", "label": "kind"}})  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "scripts.checkpoint_of", "--config", str(config),
                             "--trainer.default_root_dir", str(tmp_path / "outputs")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(best)
