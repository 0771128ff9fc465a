"""The scoring script of a batch deployment of images (scripts/serving/batch_score.py), run as Azure ML's batch driver
runs it: init() with AZUREML_MODEL_DIR, then run(mini_batch) with a list of file paths; over a folder of photos and a
CSV of penguin rows it answers as `scripts.train predict` does, and a file the model refuses is logged and left out
while the rest of its mini-batch is scored."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO
from tests.serving.scored_models import scored_models

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return scored_models(tmp_path_factory)


@pytest.fixture
def batch_score(monkeypatch, tmp_path):
    """The script as Azure ML loads it: by path, not as part of this package, the model under AZUREML_MODEL_DIR."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("batch_driver", REPO / "scripts/serving/batch_score.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def init(model):
        mounted = tmp_path / "azureml-models" / "a-classifier" / "2"
        shutil.copytree(model, mounted / "model")  # Azure ML mounts a registered MLflow model under its artifact path
        monkeypatch.setenv("AZUREML_MODEL_DIR", str(mounted))
        module.init()
        return module

    return init


def assert_answers(frame: pd.DataFrame, expected: dict[str, tuple[str, float]]) -> None:
    assert list(frame["class"]) == [label for label, _ in expected.values()]
    difference = max(abs(a - p) for a, (_, p) in zip(frame["probability"], expected.values()))
    assert difference <= 1e-5, difference
    probabilities = frame[[c for c in frame.columns if c.startswith("probability_")]]
    assert (probabilities.max(axis=1) == frame["probability"]).all()


def test_run_over_a_folder_of_photos_answers_as_predict_and_logs_a_file_it_cannot_read(
    models,
    batch_score,
    tmp_path,
    caplog,
):
    birds = models["birds"]
    script = batch_score(birds.model)
    files = [str(path) for path in birds.expected]
    answers = script.run(files)
    assert list(answers["file"]) == [path.rsplit("/", 1)[1] for path in files]
    assert list(answers.columns) == ["file", "class", "probability", "probability_chickens", "probability_turkeys"]
    assert_answers(answers, birds.expected)
    # A mini-batch with a file that is not an image: the others scored, that one logged by name and left out.
    (tmp_path / "notes.jpg").write_text("not a photo")
    with caplog.at_level(logging.ERROR):
        answers = script.run([files[0], str(tmp_path / "notes.jpg"), files[1]])
    assert list(answers["file"]) == [files[0].rsplit("/", 1)[1], files[1].rsplit("/", 1)[1]]
    assert_answers(answers, {name: birds.expected[name] for name in files[:2]})
    (line,) = [record.getMessage() for record in caplog.records]
    assert line.startswith(f"{tmp_path / 'notes.jpg'}: image 1: not a readable image")


def test_run_over_csv_files_answers_each_complete_row_as_predict_and_logs_a_file_with_an_unknown_island(
    models,
    batch_score,
    tmp_path,
    caplog,
):
    penguins = models["penguins"]
    script = batch_score(penguins.model)
    rows = pd.read_csv(penguins.inputs)
    gap = rows.iloc[:30].copy()
    gap.iloc[5, gap.columns.get_loc("flipper_length_mm")] = None  # skipped, as predict skips it; the others answered
    gap.to_csv(tmp_path / "a.csv", index=False)
    rows.iloc[30:].rename(columns={"island": "Island", "bill_length_mm": "CulmenLength", "bill_depth_mm": "CulmenDepth",
                                   "flipper_length_mm": "FlipperLength", "body_mass_g": "BodyMass"}).to_csv(
        tmp_path / "b.csv", index=False)  # fmt: skip
    bad = rows.iloc[:3].copy()
    bad.iloc[1, bad.columns.get_loc("island")] = "Atlantis"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with caplog.at_level(logging.WARNING):
        answers = script.run([str(tmp_path / "a.csv"), str(tmp_path / "bad.csv"), str(tmp_path / "b.csv")])
    assert list(answers["file"]) == ["a.csv"] * 29 + ["b.csv"] * (len(rows) - 30)
    assert list(answers["row"]) == [row for row in range(30) if row != 5] + list(range(len(rows) - 30))
    assert_answers(answers, {name: answer for i, (name, answer) in enumerate(penguins.expected.items()) if i != 5})
    skipped, refused = [record.getMessage() for record in caplog.records if record.name == "batch_score"]
    gap_line = "row 5 (from 0, as the output's) has no flipper_length_mm: skipped, no answer for it"
    assert skipped == f"{tmp_path / 'a.csv'}: {gap_line}"
    assert refused.startswith(f"{tmp_path / 'bad.csv'}: ") and "Atlantis" in refused


def test_the_script_runs_from_the_command_line_on_a_folder(models, tmp_path):
    """A folder as a Mac or Windows Explorer leaves it: .DS_Store, Thumbs.db and desktop.ini are no images, and not
    reported as images that failed."""
    birds = models["birds"]
    photos = tmp_path / "turkeys"
    shutil.copytree(birds.inputs / "turkeys", photos)
    (photos / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (photos / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0 a thumbnail cache")
    (photos / "desktop.ini").write_text("[.ShellClassInfo]\n")
    command = [sys.executable, "-m", "scripts.serving.batch_score", str(birds.model), str(photos)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not [name for name in (".DS_Store", "Thumbs.db", "desktop.ini") if name in result.stderr], result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "file,class,probability,probability_chickens,probability_turkeys"
    turkeys = [name for name in birds.expected if "/turkeys/" in name]
    assert [line.split(",")[1] for line in lines[1:]] == [birds.expected[name][0] for name in sorted(turkeys)]


def test_the_command_line_names_a_model_folder_without_a_model_or_inputs_not_there(models, tmp_path):
    penguins = models["penguins"]
    cases = [
        ([str(tmp_path), str(penguins.inputs)], f"error: {tmp_path}: no MLmodel here or one folder below; deploy an "
                                                 "MLflow model"),
        ([str(penguins.model), str(tmp_path / "new.csv")], f"error: {tmp_path / 'new.csv'}: no such file or folder; "
                                                            "give files or folders to score after MODEL_DIR"),
    ]  # fmt: skip
    for args, line in cases:
        command = [sys.executable, "-m", "scripts.serving.batch_score", *args]
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert (result.returncode, result.stderr.strip().splitlines()[-1:], result.stdout) == (1, [line], "")
        assert "Traceback" not in result.stderr


def test_file_names_survive_a_round_trip_through_the_csv_module_under_a_strict_locale(models, tmp_path):
    """A carriage return in a name split its row (pandas' CSV leaves it bare); a name that is not UTF-8 ended the
    command in a UnicodeEncodeError traceback. Written as predict and scripts.score write them."""
    import csv
    import io
    import os

    from tests.conftest import AWKWARD_NAMES, STRICT_UTF8, original_name

    birds = models["birds"]
    image = next((birds.inputs / "turkeys").iterdir())
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in AWKWARD_NAMES:
        shutil.copyfile(image, os.path.join(os.fsencode(photos), name))
    command = [sys.executable, "-m", "scripts.serving.batch_score", str(birds.model), str(photos)]
    result = subprocess.run(command, cwd=REPO, env=STRICT_UTF8, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    rows = list(csv.reader(io.StringIO(result.stdout.decode("utf-8"), newline="")))  # strictly UTF-8
    assert rows[0] == ["file", "class", "probability", "probability_chickens", "probability_turkeys"]
    assert all(len(row) == 5 for row in rows)
    assert sorted(original_name(row[0]) for row in rows[1:]) == sorted(os.fsdecode(name) for name in AWKWARD_NAMES)


NO_PARQUET_ENGINE = "import sys; sys.modules['pyarrow'] = sys.modules['fastparquet'] = None; "  # as .venv-serve is


def test_a_parquet_file_is_scored_as_its_csv_and_without_pyarrow_is_one_line(models, batch_score, tmp_path):
    """The serving environment (.venv-serve) has no pyarrow: a Parquet file was logged with pandas' 'Unable to find
    a usable engine; tried using: pyarrow, fastparquet...' and the command ended 0 with no answer. Where pyarrow is
    (.venv; the batch deployment's environment, which adds it) the file is scored as its CSV; where it is not, the
    command says so in one line, exit 1, and run() logs that line for the file."""
    penguins = models["penguins"]
    pd.read_csv(penguins.inputs).to_parquet(tmp_path / "rows.parquet")
    script = batch_score(penguins.model)
    answers = script.run([str(tmp_path / "rows.parquet")])
    assert list(answers["row"]) == list(range(len(penguins.expected)))
    assert_answers(answers, penguins.expected)
    line = (f"{tmp_path / 'rows.parquet'}: reading a Parquet file needs pyarrow, which this Python environment "
            "lacks; install it (pip install pyarrow==25.0.1) or give the rows as a CSV file")  # fmt: skip
    code = f"{NO_PARQUET_ENGINE}from scripts.serving.batch_score import main; main(sys.argv[1:])"
    for given in (tmp_path / "rows.parquet", tmp_path):  # the file, and the folder holding it
        command = [sys.executable, "-c", code, str(penguins.model), str(given)]
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert (result.returncode, result.stderr.strip().splitlines(), result.stdout) == (1, [f"error: {line}"], "")
    code = (f"{NO_PARQUET_ENGINE}import logging; from scripts.serving import batch_score as script; "
            "script.init(sys.argv[1]); logging.basicConfig(format='%(message)s'); "
            "print(len(script.run(sys.argv[2:])))")  # fmt: skip
    pd.read_csv(penguins.inputs).drop(columns="species").to_csv(tmp_path / "rows.csv", index=False)  # MLflow warns
    files = [str(tmp_path / "rows.parquet"), str(tmp_path / "rows.csv")]
    result = subprocess.run([sys.executable, "-c", code, str(penguins.model), *files], cwd=REPO, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0 and result.stdout == f"{len(penguins.expected)}\n", result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [line]  # the CSV beside it answered
