"""The registered model of a table fit (tests/test_table.py makes the tables and fits them): the MLflow model answers
the user's raw rows, in their own column names, as `scripts.train predict` does, in-process, where there is no torch,
through the scoring script, `mlflow models serve`, batch scoring and Spark's spark_udf.

    .venv/bin/python -m pytest -q tests/serving/test_table_serving.py
"""

from __future__ import annotations

import json
import os
import shutil  # extra: spark
import subprocess

import numpy as np
import pandas as pd
import pytest

from scripts import score  # before a model's own code (its copy of scripts/) is loaded into this process
from tests.conftest import (
    REPO,
    own_tmpdir,  # extra: spark
    run_module,
)
from tests.test_table import COLOUR, LENGTH, NEW_ROWS, WEIGHT, fit_table, make_table


@pytest.fixture(scope="module")
def three_classes(tmp_path_factory) -> dict:
    """A table fit with its model saved as the pipeline's train step saves it (--model_dir)."""
    folder = tmp_path_factory.mktemp("three")
    make_table(300, seed=1).to_csv(folder / "birds and more.csv", index=False)
    return fit_table(folder, folder / "birds and more.csv", "--model_dir", folder / "model")


def model_classes(run: dict, rows: pd.DataFrame) -> list[str]:
    import mlflow

    return mlflow.pyfunc.load_model(str(run["folder"] / "model")).predict(rows)["class"].tolist()


def check_answers(frame: pd.DataFrame, answers: list[list[str]]) -> None:
    assert frame["class"].tolist() == [answer[1] for answer in answers]
    assert frame["probability"].tolist() == pytest.approx([float(answer[2]) for answer in answers], abs=1e-4)


@pytest.mark.slow
def test_the_saved_model_answers_raw_rows_in_the_users_column_names_as_predict(three_classes):
    import mlflow

    model = mlflow.pyfunc.load_model(str(three_classes["folder"] / "model"))
    check_answers(model.predict(pd.read_csv(three_classes["rows"])), three_classes["answers"])
    records = json.loads(NEW_ROWS.to_json(orient="records"))  # JSON's null for a missing cell, as a client sends
    check_answers(model.predict(pd.DataFrame(records)), three_classes["answers"])
    assert list(model.metadata.metadata["columns"]) == [LENGTH, COLOUR, WEIGHT]  # the model's own schema


# What a client sends that MLflow's schema enforcement could refuse where the model's own preprocessing reads it:
@pytest.mark.slow
def test_the_saved_model_names_the_data_its_checkpoint_saw(three_classes):
    import mlflow
    import torch

    data = mlflow.pyfunc.load_model(str(three_classes["folder"] / "model")).metadata.metadata["data"]
    saved = torch.load(three_classes["checkpoint"], map_location="cpu", weights_only=False)
    (identity,) = [value["identity"] for value in saved.values() if isinstance(value, dict) and "identity" in value]
    assert data["digest"] == identity["digest"] and data["splits"] == identity["splits"]
    assert data["split"] == {**identity["split"], "seed": 42} and data["source"].endswith("birds and more.csv")
    assert data["schema"][COLOUR] == "categorical" and data["schema"]["species"] == "label"


# whole numbers (int64) in a numeric column, numbers as text, numbers (int64) in a categorical column, all missing.
def odd_rows() -> tuple[pd.DataFrame, pd.DataFrame]:
    """NEW_ROWS with those cells, and the same rows as NEW_ROWS spells them (whose answers predict's are)."""
    odd = NEW_ROWS.assign(**{WEIGHT: [48, 51, 60, 45], LENGTH: ["0.2", None, "-2.5", "2"], COLOUR: [7, 7, 7, 7]})
    return odd, NEW_ROWS.assign(**{COLOUR: [None, None, None, None]})  # 7: no training colour, as a missing cell


@pytest.mark.slow
def test_the_saved_model_takes_integers_numbers_as_text_and_numeric_categories_as_predict_reads_them(three_classes):
    import mlflow

    model = mlflow.pyfunc.load_model(str(three_classes["folder"] / "model"))
    odd, same = odd_rows()
    assert odd[WEIGHT].dtype == np.int64 and odd[COLOUR].dtype == np.int64
    expected = model.predict(same)
    answer = model.predict(odd)
    assert answer["class"].tolist() == expected["class"].tolist()
    assert answer["probability"].tolist() == pytest.approx(expected["probability"].tolist(), abs=1e-6)
    columns = model.metadata.metadata["columns"]  # the training split's choice, in the MLmodel file
    assert columns == {LENGTH: "numeric", COLOUR: "categorical", WEIGHT: "numeric"}


@pytest.mark.slow
def test_the_scoring_script_answers_the_no_code_request_shape_as_predict(three_classes):
    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request

    os.environ["AZUREML_MODEL_DIR"] = str(three_classes["folder"] / "model")
    try:
        score.init()
    finally:
        del os.environ["AZUREML_MODEL_DIR"]
    split = json.loads(NEW_ROWS.to_json(orient="split", index=False))
    body = json.dumps({"input_data": split}).encode()
    request = Request(EnvironBuilder(method="POST", data=body, content_type="application/json").get_environ())
    response = score.run(request)
    assert response.status_code == 200, response.get_data()
    predictions = pd.DataFrame(json.loads(response.get_data())["predictions"])
    check_answers(predictions, three_classes["answers"])


@pytest.mark.slow
def test_the_scoring_script_refuses_a_tables_rows_in_words_of_rows_and_columns_and_plain_values(
    three_classes, tmp_path
):
    """A table model's refusals spoke of penguins ('one penguin a line', 'island: a name, the measurements:
    numbers') and printed numpy's reprs (`np.float64(inf)`, `np.True_`)."""
    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request

    os.environ["AZUREML_MODEL_DIR"] = str(three_classes["folder"] / "model")
    try:
        score.init()
    finally:
        del os.environ["AZUREML_MODEL_DIR"]
    header = f"{LENGTH},{COLOUR},{WEIGHT}\n".encode()
    cases = [
        ({LENGTH: [1], COLOUR: "red", WEIGHT: 3}, "application/json",
         f"row 1, field '{LENGTH}': a list ([1]); send each field as one JSON string or number"),
        (f'{{"{LENGTH}": 1e400, "{COLOUR}": "red", "{WEIGHT}": 3}}'.encode(), "application/json",
         f"request: row 1, column '{LENGTH}': inf is not a number; give a number, or leave the cell empty"),
        ({"input_data": {"columns": [LENGTH, COLOUR, WEIGHT], "data": [[True, "red", 1]]}}, "application/json",
         f"request: row 1, column '{LENGTH}': True is not a number; give a number, or leave the cell empty"),
        (header, "text/csv", "request body has a CSV header and no rows; send one row a line below it"),
        (b"\x00\x01\x02\xff" * 8, "text/csv",
         "request body is not a readable CSV (not UTF-8 text); send a CSV of rows in the data's column names"),
    ]  # fmt: skip
    for body, content_type, message in cases:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = Request(EnvironBuilder(method="POST", data=data, content_type=content_type).get_environ())
        response = score.run(request)
        assert (response.status_code, json.loads(response.get_data())) == (400, {"message": message})
    (tmp_path / "header.csv").write_bytes(header)
    scored = run_module("scripts.score", three_classes["folder"] / "model", tmp_path / "header.csv")
    assert scored.returncode == 1 and scored.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'header.csv'}: a CSV header and no rows; put one row a line below it"
    ]


# A misspelt key in one of several JSON rows (pandas makes it an empty cell of the right column beside a column of the
# wrong name: answered as if the cell were empty), a column named twice (a CSV's second `colour` read as `colour.1`:
# answered from the first), and the same in one row.
MISSPELT = [{LENGTH: 0.2, COLOUR: "green", WEIGHT: 48.0}, {LENGTH: 0.4, "Colour": "red", WEIGHT: 51.0}]
MISSPELT_LINE = f"row 2: no value for column '{COLOUR}' but one for 'Colour', which the model does not read"
TWICE_CSV = f"{LENGTH},{COLOUR},{WEIGHT},{COLOUR}\n0.2,green,48,red\n".encode()
TWICE_LINE = f"column '{COLOUR}' is named 2 times (the second read as '{COLOUR}.1')"


@pytest.mark.slow
def test_the_saved_model_refuses_misspelt_and_doubled_columns_and_counts_unseen_categories(three_classes, caplog):
    import io

    import mlflow

    from scripts.serving.pyfunc_model import InputError

    model = mlflow.pyfunc.load_model(str(three_classes["folder"] / "model"))
    assert model.metadata.get_input_schema() is None  # MLflow's would drop the columns it does not name
    for rows, line in ((pd.DataFrame(MISSPELT), MISSPELT_LINE), (pd.DataFrame(MISSPELT[1:]), "no column 'colour'"),
                       (pd.read_csv(io.BytesIO(TWICE_CSV)), TWICE_LINE)):  # fmt: skip
        with pytest.raises(InputError) as error:
            model.predict(rows)
        assert line in str(error.value) and "\n" not in str(error.value)
    # A column the model does not know, given in every row, is ignored (docs/serving.md), as the label's is.
    answered = model.predict(NEW_ROWS.assign(notes="x"))
    assert answered["class"].tolist() == [answer[1] for answer in three_classes["answers"]]
    assert "1 cell(s) of column 'colour' hold a category the training split did not have (row 4: 'purple')" in (
        caplog.text
    )


@pytest.mark.slow
def test_the_scoring_script_and_batch_scoring_refuse_misspelt_and_doubled_columns(three_classes, tmp_path, caplog):
    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request

    from scripts.serving import batch_score

    os.environ["AZUREML_MODEL_DIR"] = str(three_classes["folder"] / "model")
    try:
        score.init()
    finally:
        del os.environ["AZUREML_MODEL_DIR"]
    for body, content_type, line in ((json.dumps(MISSPELT).encode(), "application/json", MISSPELT_LINE),
                                     (TWICE_CSV, "text/csv", TWICE_LINE)):  # fmt: skip
        request = Request(EnvironBuilder(method="POST", data=body, content_type=content_type).get_environ())
        response = score.run(request)
        assert response.status_code == 400 and line in json.loads(response.get_data())["message"]
    (tmp_path / "twice.csv").write_bytes(TWICE_CSV)
    batch_score.init(str(three_classes["folder"] / "model"))
    assert batch_score.run([str(tmp_path / "twice.csv")]).empty
    assert TWICE_LINE in caplog.text


@pytest.mark.slow
def test_the_saved_model_answers_where_there_is_no_torch(three_classes):
    serve_python = REPO / ".venv-serve" / "bin" / "python"
    if not serve_python.is_file():
        pytest.skip("needs .venv-serve: `make serve-env` (.ci/run builds it)")
    script = (
        "import json, sys, mlflow.pyfunc, pandas as pd; "
        "answer = mlflow.pyfunc.load_model(sys.argv[1]).predict(pd.read_csv(sys.argv[2])); "
        "print(json.dumps(['torch' in sys.modules, answer['class'].tolist(), answer['probability'].tolist()]))"
    )
    folder = three_classes["folder"]
    done = subprocess.run([serve_python, "-c", script, folder / "model", three_classes["rows"]], cwd=folder,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    torch_loaded, classes, probabilities = json.loads(done.stdout.strip().splitlines()[-1])
    assert torch_loaded is False
    check_answers(pd.DataFrame({"class": classes, "probability": probabilities}), three_classes["answers"])


@pytest.mark.slow
def test_a_checkpoint_serves_and_batch_scores_every_row_as_predict(three_classes, tmp_path):
    """scripts.serve's model of the checkpoint (its columns from the checkpoint, not the data), Azure ML's batch driver
    (scripts/serving/batch_score.py) and scripts.score answer every row, the ones with empty cells too."""
    from scripts.serve import from_checkpoint
    from scripts.serving import batch_score

    served = from_checkpoint(three_classes["checkpoint"], tmp_path / "model")
    batch_score.init(str(served))
    check_answers(batch_score.run([str(three_classes["rows"])]), three_classes["answers"])
    scored = run_module("scripts.score", served, three_classes["rows"])
    assert scored.returncode == 0, scored.stderr[-2000:]
    lines = [line.split(",") for line in scored.stdout.strip().splitlines()[1:]]
    assert [line[:2] for line in lines] == [answer[:2] for answer in three_classes["answers"]]


@pytest.mark.slow
def test_mlflow_models_serve_answers_the_users_rows_as_predict(three_classes):
    from tests.serving.test_pyfunc import SERVE, MlflowServer

    if not (SERVE / "mlflow").is_file():
        pytest.skip("needs .venv-serve: `make serve-env` (.ci/run builds it)")
    server = MlflowServer(three_classes["folder"] / "model", three_classes["folder"])
    try:
        split = json.loads(NEW_ROWS.to_json(orient="split", index=False))  # null for each empty cell
        status, answer = server.post(json.dumps({"dataframe_split": split}).encode())
        odd, same = odd_rows()
        records = json.loads(odd.to_json(orient="records"))
        odd_status, odd_answer = server.post(json.dumps({"dataframe_records": records}).encode())
        same_answer = model_classes(three_classes, same)
        misspelt_status, misspelt = server.post(json.dumps({"dataframe_records": MISSPELT}).encode())
        twice_status, twice = server.post(TWICE_CSV, "text/csv")
    finally:
        server.stop()
    assert status == 200, answer
    check_answers(pd.DataFrame(answer["predictions"]), three_classes["answers"])
    assert odd_status == 200, odd_answer  # JSON's integers and text where the training split had other types
    assert pd.DataFrame(odd_answer["predictions"])["class"].tolist() == list(same_answer)
    assert misspelt_status == 400 and MISSPELT_LINE in misspelt["message"], misspelt
    assert twice_status == 400 and TWICE_LINE in twice["message"], twice


# extra: spark
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("java") is None, reason="needs Java 17 for Spark (CI has it)")
def test_spark_udf_answers_the_users_rows_as_predict(three_classes, tmp_path):
    rows = tmp_path / "rows.csv"
    NEW_ROWS.to_csv(rows, index=False, na_rep="NA")  # Spark reads NA as null (scripts/spark/score.py)
    done = run_module("scripts.spark", "score", three_classes["folder"] / "model", rows, "--output", tmp_path / "out",
                      "--master", "local[1]", env=own_tmpdir(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answers = pd.concat([pd.read_csv(part) for part in sorted((tmp_path / "out").glob("part-*.csv"))])
    check_answers(answers, three_classes["answers"])
    (tmp_path / "twice.csv").write_bytes(TWICE_CSV)  # Spark renamed the copies (colour1, colour3): "no column"
    no_java = own_tmpdir(tmp_path) | {"JAVA_HOME": "/none"}  # a CSV of this disk is refused before the JVM starts
    twice = run_module("scripts.spark", "score", three_classes["folder"] / "model", tmp_path / "twice.csv", "--output",
                       tmp_path / "out2", "--master", "local[1]", env=no_java)  # fmt: skip
    assert twice.returncode == 1 and twice.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'twice.csv'}: column {COLOUR} is named 2 times in its header; keep one, or rename the "
        "others"
    ), twice.stderr[-2000:]


# end extra: spark
