"""scripts/score.py and the registered pyfunc as libraries, in this process (no server): a small network saved as
`--register_model` saves it, what each answers, and what they refuse."""

from __future__ import annotations

import base64
import io
import json
import os
import struct

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from datamodules.mnist import MNISTDataModule
from datamodules.preprocessing.csv_files import SAVE_AS
from scripts.score import Model, ModelError, load_model
from scripts.serving.mlflow_model import ExportError, save_model, serving_inputs
from scripts.serving.pyfunc_model import InputError


def network() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))


def png(size: tuple[int, int], value: int = 200) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", size, value).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits") / "1" / "model"  # AZUREML_MODEL_DIR/<the model's folder>
    torch.manual_seed(0)
    save_model(network(), torch.randn(4, 1, 28, 28), [str(d) for d in range(10)], folder,
               serving_inputs(MNISTDataModule()))  # fmt: skip
    return folder


def test_the_scoring_script_answers_as_the_pyfunc_and_names_each_input(digits):
    import mlflow

    model = load_model(digits.parent)
    images = [png((28, 28), 30), png((40, 56), 220)]
    answers = model.predict(images, ["a.png", "b.png"])
    expected = mlflow.pyfunc.load_model(str(digits)).predict(pd.DataFrame({"image": images}))
    assert [a["input"] for a in answers] == ["a.png", "b.png"]
    assert [a["class"] for a in answers] == expected["class"].tolist()
    assert [a["probability"] for a in answers] == expected["probability"].tolist()
    assert list(expected.columns) == ["class", "probability", *(f"probability_{d}" for d in range(10))]
    assert np.allclose(expected.iloc[:, 2:].sum(axis=1), 1, atol=1e-6)


def test_the_pyfunc_refuses_bad_images_naming_them(digits):
    import mlflow
    from mlflow.exceptions import MlflowException

    model = mlflow.pyfunc.load_model(str(digits))
    cases = [
        (pd.DataFrame({"image": [png((28, 28)), b"not an image"]}), "image 2: not a readable image (not a JPEG, PNG"),
        (pd.DataFrame({"picture": [png((28, 28))]}), "Model is missing inputs ['image']"),  # MLflow's schema check
        (pd.DataFrame({"image": [png((10000, 6000))]}), "image 1: 10000x6000 pixels; send images of at most 40"),
        (pd.DataFrame({"image": ["not base64!"]}), "image 1: not base64 text; encode each image's bytes as base64"),
        # mlflow models serve's {"dataframe_split": {"columns": ["image"], "data": []}}: answered 200, no predictions
        (pd.DataFrame({"image": pd.Series([], dtype=object)}), "request: no images in it; send at least one image"),
    ]
    for frame, message in cases:
        with pytest.raises(MlflowException) as error:
            model.predict(frame)
        assert message in str(error.value), str(error.value)
        if isinstance(error.value, InputError):  # ours: one line; MLflow's own schema message quotes the frame
            assert str(error.value).startswith(message) and "\n" not in str(error.value)
    with pytest.raises(InputError, match="image 1: 10000x6000 pixels") as error:
        model.unwrap_python_model().answer([png((10000, 6000))])
    assert error.value.oversize and isinstance(error.value, ValueError)


def test_a_torch_backend_a_foreign_folder_and_no_folder_are_refused(digits, tmp_path, monkeypatch):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "MLmodel").write_text("flavors: {}\n")
    with pytest.raises(ModelError, match="not a pyfunc model of this template"):
        Model(tmp_path / "foreign")
    with pytest.raises(ModelError, match="no MLflow model"):
        load_model(tmp_path / "nothing-here")
    monkeypatch.setenv("SCORE_BACKEND", "torch")
    with pytest.raises(ModelError, match="SCORE_BACKEND 'torch': the model's network runs with ONNX Runtime only"):
        load_model(digits.parent)


def test_a_network_onnx_cannot_express_is_refused_in_one_line_leaving_nothing(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("an operator ONNX has not\nand more lines")

    monkeypatch.setattr("scripts.serving.mlflow_model.write_onnx", refuse)
    with pytest.raises(ExportError) as error:
        save_model(network(), torch.randn(4, 1, 28, 28), [str(d) for d in range(10)], tmp_path / "model",
                   serving_inputs(MNISTDataModule()))  # fmt: skip
    assert str(error.value) == (
        "the network cannot be written as ONNX (an operator ONNX has not); the registered model runs it with ONNX "
        "Runtime"
    )
    assert not (tmp_path / "model").exists()


@pytest.fixture(scope="module")
def penguins(tmp_path_factory):
    from datamodules.penguins import PenguinDataModule

    folder = tmp_path_factory.mktemp("penguins") / "model"
    data = PenguinDataModule()
    data.prepare_data()
    data.setup("fit")
    torch.manual_seed(0)
    save_model(torch.nn.Linear(5, 3), torch.randn(4, 5), PenguinDataModule.class_names, folder, serving_inputs(data))
    return folder


def post(folder, body, content_type: str, monkeypatch, stream=None, length: int | None = None):
    """What scripts/score.py's run() answers one POST, as the inference server calls it; `stream` (with a stated
    `length`, or none: chunked) replaces the body."""
    import json

    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request

    import scripts.score as score

    monkeypatch.setattr(score, "model", load_model(folder))
    environ = EnvironBuilder(method="POST", data=body, content_type=content_type).get_environ()
    if stream is not None:
        environ["wsgi.input"] = stream
        environ.pop("CONTENT_LENGTH", None)
        if length is None:
            environ["wsgi.input_terminated"] = True
        else:
            environ["CONTENT_LENGTH"] = str(length)
    response = score.run(Request(environ))
    return response.status_code, json.loads(response.get_data())


PENGUIN = {"island": "Biscoe", "bill_length_mm": 50.4, "bill_depth_mm": 15.3, "flipper_length_mm": 200,
           "body_mass_g": 5000}  # fmt: skip
HEADER = ",".join(PENGUIN) + "\n"
NO_MASS = {key: value for key, value in PENGUIN.items() if key != "body_mass_g"}
HUGE_SPLIT = {"input_data": {"columns": list(PENGUIN), "data": [["Biscoe", 50.4, 15.3, 200, -(10**400)]]}}
TWICE_SPLIT = {"input_data": {"columns": ["island", *PENGUIN], "data": [["Dream", *PENGUIN.values()]]}}
BOOL_SPLIT = {"input_data": {"columns": list(PENGUIN), "data": [["Biscoe", 50.4, 15.3, True, 5000]]}}
LIST_SPLIT = {"input_data": {"columns": [["island"], *list(PENGUIN)[1:]], "data": [list(PENGUIN.values())]}}
ROW = "Biscoe,50.4,15.3,200,5000\n"
SEMICOLONS = HEADER.replace(",", ";") + "Biscoe;50,4;15,3;200;5000\n"  # a spreadsheet in German or French
UTF_16 = (HEADER + ROW).encode("utf-16")  # a spreadsheet's "Unicode Text": a byte order mark first
WORKBOOK = b"PK\x03\x04\x14\x00\x06\x00\x08\x00" + bytes(range(256))  # an .xlsx: a zip
MASS_TWICE = HEADER.replace("\n", ",body_mass_g\n") + ROW.replace("\n", ",5100\n")
BAD_ROWS = [  # (body, content type, status, the message's start)
    ("[" * 100_000 + "]" * 100_000, "application/json", 400, "request body is JSON nested deeper than 32 levels"),
    ('{"island": ' + "[" * 40 + "]" * 40 + "}", "application/json", 400, "request body is JSON nested deeper"),
    ({**PENGUIN, "island": ["Biscoe"]}, "application/json", 400, "row 1, field 'island': a list ([\"Biscoe\"]); send"),
    ([PENGUIN, {**PENGUIN, "body_mass_g": [5000]}], "application/json", 400, "row 2, field 'body_mass_g': a list"),
    ({**PENGUIN, "bill_depth_mm": {"mm": 15}}, "application/json", 400, "row 1, field 'bill_depth_mm': an object"),
    ({**PENGUIN, "body_mass_g": True}, "application/json", 400, "row 1, field 'body_mass_g': true/false"),
    (b'{"island": ', "application/json", 400, "request body is not valid JSON"),
    (NO_MASS, "application/json", 400, "request: missing columns; each row (a JSON object's fields, or a CSV's"),
    (HEADER + "Biscoe,50.4,15.3,200,5000,7\n", "text/csv", 400, "request body: line 2 has 6 values, the header"),
    (HEADER + "Dream,40,18,190,3800\nBiscoe,50.4,15.3,200,5000,x,y\n", "text/csv", 400, "request body: line 3 has 7"),
    ("\n\n", "text/csv", 400, "request body is empty: send a CSV whose first line names the columns"),
    (HEADER + "\n,,,,\n", "text/csv", 400, "request body has a CSV header and no rows; send one row a line below"),
    (b"\xff\xfe\x00garbage", "text/csv", 400, "request body is not a readable CSV (not UTF-8 text)"),
    (HEADER + "Biscoe,50.4,15.3,200,5000\n" * 1001, "text/csv", 413, "1001 rows in one request; send at most 1000 ("),
    ([PENGUIN] * 1001, "application/json", 413, "1001 rows in one request; send at most 1000 (SCORE_MAX_ROWS)"),
    # An integer past float's range (JSON has no limit): pandas cannot hold it, so it is refused as 1e400 is.
    ({**PENGUIN, "body_mass_g": 10**400}, "application/json", 400, "request: row 1, column body_mass_g: 'inf' is not"),
    (HUGE_SPLIT, "application/json", 400, "request: row 1, column body_mass_g: '-inf' is not a finite number"),
    (TWICE_SPLIT, "application/json", 400, "input_data: column 'island' named twice in \"columns\"; name each once"),
    (LIST_SPLIT, "application/json", 400, "input_data: send a DataFrame in pandas' split orientation"),
    # true in a split's measurement (read as 1): named as a bool, not as a measurement far outside the training data's
    (BOOL_SPLIT, "application/json", 400, "request: row 1, column flipper_length_mm: a bool (True); give one string"),
    # What predict's reader refuses (datamodules/preprocessing/csv_files.py), refused alike: not as 'missing columns',
    # a parser's reason or the wrong line.
    (SEMICOLONS, "text/csv", 400, f"request body: its columns are separated by ';', not commas; {SAVE_AS}"),
    (UTF_16, "text/csv", 400, "request body is not a readable CSV (not UTF-8 text): UTF-16 text, not UTF-8; save"),
    (WORKBOOK, "text/csv", 400, "request body is not a readable CSV (not UTF-8 text): a zip archive (an Excel"),
    (MASS_TWICE, "text/csv", 400, "request body: column body_mass_g is named 2 times (columns 5 and 6); keep one, or"),
    (HEADER + "\n" + ROW + "\n" + ROW[:-1] + ",7\n", "text/csv", 400, "request body: line 5 has 6 values, the header"),
]


@pytest.mark.parametrize("body, content_type, status, message", BAD_ROWS)
def test_a_bad_rows_request_is_a_4xx_naming_the_field_row_or_limit(penguins, monkeypatch, body, content_type,
                                                                    status, message):  # fmt: skip
    import json

    data = body if isinstance(body, str | bytes) else json.dumps(body)
    answered_status, answer = post(penguins, data, content_type, monkeypatch)
    assert answered_status == status and answer["message"].startswith(message), answer
    assert "\n" not in answer["message"]
    if "missing columns" in message:
        assert answer["message"].endswith("(no body_mass_g)")


def test_requests_written_for_mlflow_models_serve_get_the_answers_of_the_same_inputs(penguins, photos, monkeypatch):
    """A client of `mlflow models serve` (dataframe_split, dataframe_records, instances, inputs) pointed at the
    endpoint: the answers of the same rows or images sent the script's own way, not a 400 for a field named
    dataframe_split, or, for instances and inputs, 'missing columns' (rows) or 'send images as JSON'."""
    rows = [PENGUIN, {**PENGUIN, "island": "Dream", "body_mass_g": 3800}]
    plain = post(penguins, json.dumps(rows), "application/json", monkeypatch)
    assert plain[0] == 200 and len(plain[1]["predictions"]) == 2
    split = {"columns": list(PENGUIN), "data": [list(row.values()) for row in rows]}
    columns = {name: [row[name] for row in rows] for name in PENGUIN}
    for body in ({"dataframe_split": split}, {"dataframe_records": rows}, {"instances": rows}, {"inputs": rows},
                 {"inputs": columns}):  # fmt: skip
        assert post(penguins, json.dumps(body), "application/json", monkeypatch) == plain, body
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buffer, format="PNG")
    text = base64.b64encode(buffer.getvalue()).decode()
    plain = post(photos, json.dumps({"images": [text, text]}), "application/json", monkeypatch)
    assert plain[0] == 200 and len(plain[1]["predictions"]) == 2
    for body in ({"dataframe_split": {"columns": ["image"], "data": [[text], [text]]}},
                 {"dataframe_records": [{"image": text}, {"image": text}]}, {"instances": [{"image": text}] * 2},
                 {"inputs": {"image": [text, text]}}):  # fmt: skip
        assert post(photos, json.dumps(body), "application/json", monkeypatch) == plain, body
    status, answer = post(photos, json.dumps({"dataframe_records": [{"picture": text}]}), "application/json",
                          monkeypatch)  # fmt: skip
    assert (status, answer["message"]) == (400, 'dataframe_records: send a list of objects {"image": base64}, one per '
                                                "image")  # fmt: skip


@pytest.mark.parametrize("task", ["penguins", "photos"])
def test_the_models_own_serving_input_example_is_answered_as_mlflow_wrote_it(task, request, monkeypatch):
    """serving_input_example.json, the request MLflow writes beside the model (its base64 in MIME's lines of 76
    characters), sent as it is and as Azure ML's no-code request."""
    folder = request.getfixturevalue(task)
    example = json.loads((folder / "serving_input_example.json").read_text())
    answers = [post(folder, json.dumps(body), "application/json", monkeypatch)
               for body in (example, {"input_data": example["dataframe_split"]})]  # fmt: skip
    assert answers[0][0] == 200 and answers[1] == answers[0], answers


def test_a_field_the_model_does_not_read_is_ignored_whatever_its_type(penguins, monkeypatch):
    """As `mlflow models serve`, the pyfunc and Azure ML's no-code request ignore a column the model does not read, a
    JSON row's field of true/false, a list or an object is ignored there, not a 400."""
    plain = post(penguins, json.dumps(PENGUIN), "application/json", monkeypatch)
    extra = {**PENGUIN, "verified": True, "tags": ["dawn"], "seen": {"by": "me"}}
    assert post(penguins, json.dumps(extra), "application/json", monkeypatch) == plain and plain[0] == 200


def test_rows_with_no_fields_are_refused_not_answered_with_no_predictions(penguins, monkeypatch):
    """An empty object is a row: one answer per row, or a 400 naming what it lacks (never 200 with fewer answers)."""
    for body in ("{}", "[{}, {}]"):
        status, answer = post(penguins, body, "application/json", monkeypatch)
        assert status == 400 and answer["message"].startswith("request: missing columns; each row"), answer
        assert answer["message"].endswith("(no island, bill_length_mm, bill_depth_mm, flipper_length_mm, body_mass_g)")


def test_a_spreadsheets_csv_is_answered_as_its_rows(penguins, monkeypatch):
    """A trailing comma on each row (and on the header) is no extra column, and shifts nothing."""
    plain = post(penguins, HEADER + "Biscoe,50.4,15.3,200,5000\nDream,40,18,190,3800\n", "text/csv", monkeypatch)
    for body in (HEADER + "Biscoe,50.4,15.3,200,5000,\nDream,40,18,190,3800,\n",
                 HEADER.replace("\n", ",\n") + "Biscoe,50.4,15.3,200,5000,\r\nDream,40,18,190,3800,\r\n"):  # fmt: skip
        assert post(penguins, body, "text/csv", monkeypatch) == plain
    assert plain[0] == 200 and [a["input"] for a in plain[1]["predictions"]] == ["line 2", "line 3"]


def test_csv_rows_are_named_by_their_line_in_the_body_blank_lines_counted(penguins, monkeypatch, tmp_path, capsys):
    """As predict names them: pandas skipped blank lines and the row after one was answered as the line above it."""
    from scripts.score import main

    body = "\n" + HEADER + ROW + "\n \n,,,,\n" + ROW.replace("Biscoe", "Dream")
    status, answer = post(penguins, body, "text/csv", monkeypatch)
    assert status == 200 and [a["input"] for a in answer["predictions"]] == ["line 3", "line 7"], answer
    (tmp_path / "blank.csv").write_text(body)
    main([str(penguins), str(tmp_path / "blank.csv")])
    assert [line.split(",")[0] for line in capsys.readouterr().out.splitlines()] == ["input", "line 3", "line 7"]


def test_batch_scoring_answers_the_complete_rows_and_names_the_incomplete_ones_as_predict(penguins, tmp_path, capsys):
    """A row with an empty cell is skipped with predict's line, not the whole file refused; a request refuses it."""
    from scripts.score import main

    body = HEADER + ROW + "Dream,40,18,,3800,\n" + ROW.replace("Biscoe", "Torgersen") + ",,,,\n"
    (tmp_path / "gaps.csv").write_text(body.replace(HEADER, HEADER.replace("\n", ",sex\n")))  # sex: not read
    main([str(penguins), str(tmp_path / "gaps.csv")])
    out, err = capsys.readouterr()
    assert [line.split(",")[0] for line in out.splitlines()] == ["input", "line 2", "line 4"]
    assert err == f"{tmp_path / 'gaps.csv'}: line 3 has no flipper_length_mm: skipped, no answer for it\n"
    (tmp_path / "none.csv").write_text(HEADER + "Dream,40,18,,3800\n")
    with pytest.raises(SystemExit) as exit:
        main([str(penguins), str(tmp_path / "none.csv")])
    assert exit.value.code == (
        f"error: {tmp_path / 'none.csv'}: no row has all of island, bill_length_mm, bill_depth_mm, flipper_length_mm, "
        "body_mass_g; fill in the empty cells"
    )  # predict's words
    (tmp_path / "header.csv").write_text(HEADER + "\n")  # a header and a blank line: exit 0, no predictions
    with pytest.raises(SystemExit) as exit:
        main([str(penguins), str(tmp_path / "header.csv")])
    assert exit.value.code == f"error: {tmp_path / 'header.csv'}: a CSV header and no rows; put one row a line below it"


def test_the_csv_checks_are_the_scripts_own_not_an_older_models(penguins, monkeypatch):
    """The server puts the model's code first on sys.path: a model registered before the checks were shared ships a
    datamodules/preprocessing/penguins.py without them, and importing them from there failed every CSV request."""
    import datamodules.preprocessing.csv_files as shipped

    monkeypatch.delattr(shipped, "check_csv_layout")
    status, answer = post(penguins, MASS_TWICE, "text/csv", monkeypatch)
    assert status == 400 and answer["message"].startswith("request body: column body_mass_g is named 2 times"), answer


def test_batch_scoring_refuses_a_csv_predict_refuses_in_one_line(penguins, tmp_path):
    """A semicolon CSV, UTF-16 text, a workbook, a column named twice: one line naming the file and the fix, as
    predict says it (datamodules/preprocessing/csv_files.py), not 'missing columns' or a decoder's reason."""
    from scripts.score import main

    cases = {
        "semicolons.csv": (SEMICOLONS.encode(), f": its columns are separated by ';', not commas; {SAVE_AS}"),
        "unicode.csv": (UTF_16, " is not a readable CSV (not UTF-8 text): UTF-16 text, "),
        "penguins.xlsx": (WORKBOOK, " is not a readable CSV (not UTF-8 text): a zip archive (an Excel workbook?)"),
        "twice.csv": (MASS_TWICE.encode(), ": column body_mass_g is named 2 times (columns 5 and 6); keep one, or "),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(SystemExit) as exit:
            main([str(penguins), str(tmp_path / name)])
        line = str(exit.value.code)
        assert line.startswith(f"error: {tmp_path / name}{message}") and "\n" not in line, line


class Endless(io.RawIOBase):
    """A body of rows that never ends, counting what is read of it."""

    def __init__(self) -> None:
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        row = b"Biscoe,50.4,15.3,200,5000\n"
        data = (row * (len(buffer) // len(row) + 1))[: len(buffer)]
        buffer[: len(data)] = data
        self.read_bytes += len(data)
        return len(data)


def test_a_rows_body_hundreds_of_mb_long_is_refused_unread(penguins, monkeypatch):
    import scripts.score as score

    stated = Endless()
    status, answer = post(penguins, None, "text/csv", monkeypatch, stated, 500 * 2**20)
    assert status == 413 and answer["message"].startswith(f"request body of {500 * 2**20} bytes is too large; send")
    assert "SCORE_MAX_ROWS" in answer["message"] and stated.read_bytes == 0
    chunked = Endless()  # no Content-Length: read up to the limit only
    status, answer = post(penguins, None, "text/csv", monkeypatch, chunked)
    assert status == 413 and answer["message"].startswith(
        f"request body of more than {score.MAX_ROWS_BODY_BYTES} bytes is too large; send at most 1000 rows "
        "(SCORE_MAX_ROWS)"
    )
    assert chunked.read_bytes <= score.MAX_ROWS_BODY_BYTES + 2**20


class EndlessForm(io.RawIOBase):
    """A multipart form whose one file never ends."""

    def __init__(self) -> None:
        self.head, self.read_bytes = b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n', 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = (self.head if self.read_bytes == 0 else b"") + bytes(len(buffer))
        data = data[: len(buffer)]
        buffer[: len(data)] = data
        self.read_bytes += len(data)
        return len(data)


def test_an_endless_multipart_form_is_refused_at_the_limit(digits, monkeypatch):
    import scripts.score as score

    monkeypatch.setattr(score, "MAX_BODY_BYTES", 4 * 2**20)  # not 430 MB of a test's disk: the same code path
    form = EndlessForm()
    status, answer = post(digits, None, "multipart/form-data; boundary=b", monkeypatch, form)
    assert status == 413 and answer["message"].startswith(
        f"request body of more than {score.MAX_BODY_BYTES} bytes is too large; send at most 32 images"
    )
    assert form.read_bytes <= score.MAX_BODY_BYTES + 2**20


def gif(size: tuple[int, int], frames: int) -> bytes:
    pictures = [Image.new("L", size, 5 * i) for i in range(frames)]
    buffer = io.BytesIO()
    pictures[0].save(buffer, format="GIF", save_all=True, append_images=pictures[1:])
    return buffer.getvalue()


def huge_gif(size: tuple[int, int], frames: int) -> bytes:
    """A GIF whose frame headers say `frames` frames of `size` pixels, each frame's pixel data a few bytes: what a
    reader counts without decoding (a decoder would find the frames cut short). Encoding 40 real frames of 4000x4000
    took ~12 s of CPU."""
    width, height = size
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"  # 2 colours
    # An image descriptor, then LZW data of minimum code size 2: clear (4), one pixel (0), end (5), packed in 2 bytes.
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x44\x01\x00"
    return screen + frame * frames + b"\x3b"


def test_a_multi_frame_image_counts_every_frame_before_any_is_decoded(digits, monkeypatch):
    import resource

    import mlflow

    animated = huge_gif((4000, 4000), 40)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    status, answer = post(digits, animated, "image/gif", monkeypatch)
    assert status == 413
    assert answer["message"] == (
        "image 1: 4000x4000 pixels x 40 frames; send images of at most 40 megapixels, all frames together "
        "(SCORE_MAX_IMAGE_PIXELS=40000000 sets the limit)"
    )
    # The decoded frames would be 40 x 16 MB; the check reads headers only.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024
    with pytest.raises(InputError, match="image 1: 4000x4000 pixels x 40 frames"):
        mlflow.pyfunc.load_model(str(digits)).predict(pd.DataFrame({"image": [animated]}))
    assert post(digits, gif((28, 28), 3), "image/gif", monkeypatch)[0] == 200  # a small animation: its first frame


def test_batch_scoring_mistakes_are_one_line_and_hidden_files_are_skipped(digits, penguins, tmp_path, capsys):
    from scripts.score import main

    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "spread.csv").write_text(HEADER + "Biscoe,50.4,15.3,200,5000,7\n")
    (tmp_path / "photo.png").write_bytes(png((28, 28)))
    cases = [
        ([str(penguins), str(tmp_path / "empty.csv")], f"error: {tmp_path / 'empty.csv'} is empty: send a CSV whose"),
        ([str(penguins), str(tmp_path / "spread.csv")], f"error: {tmp_path / 'spread.csv'}: line 2 has 6 values"),
        ([str(penguins), str(tmp_path / "photo.png")], f"error: {tmp_path / 'photo.png'} is not a readable CSV (not"),
        ([str(penguins), str(tmp_path)], f"error: {tmp_path}: a folder; this model scores rows: give a CSV file"),
        (
            [str(penguins), "configs/examples/penguins.csv", "--output", str(tmp_path / "photo.png" / "out.csv")],
            f"error: --output {tmp_path / 'photo.png' / 'out.csv'}: cannot be written here",
        ),  # a file is no folder
    ]
    for args, line in cases:
        with pytest.raises(SystemExit) as exit:
            main(args)
        assert str(exit.value.code).startswith(line) and "\n" not in str(exit.value.code), exit.value.code

    photos = tmp_path / "photos"
    (photos / "inner").mkdir(parents=True)
    (photos / "a.png").write_bytes(png((28, 28), 30))
    (photos / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (photos / "._a.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (photos / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0 a thumbnail cache")  # Windows Explorer's, as training skips
    (photos / "inner" / "desktop.ini").write_text("[.ShellClassInfo]\n")
    (photos / "huge.gif").write_bytes(huge_gif((4000, 4000), 40))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "b.png").write_bytes(png((28, 28), 220))
    (photos / "linked").symlink_to(tmp_path / "elsewhere")
    main([str(digits), str(photos)])
    out, err = capsys.readouterr()
    assert [line.split(",")[0] for line in out.splitlines()] == ["input", str(photos / "a.png"),
                                                                  str(photos / "linked" / "b.png")]  # fmt: skip
    assert (
        err.strip() == f"skipped {photos / 'huge.gif'}: 4000x4000 pixels x 40 frames; send images of at most 40 "
        "megapixels, all frames together (SCORE_MAX_IMAGE_PIXELS=40000000 sets the limit)"
    )


def test_the_pyfunc_used_directly_refuses_a_cell_of_the_wrong_type(penguins):
    """mlflow models serve and spark_udf call the pyfunc without scripts/score.py: its preprocessing holds the line."""
    import mlflow

    model = mlflow.pyfunc.load_model(str(penguins)).unwrap_python_model()
    for column, value, kind in (("island", ["Biscoe"], "list"), ("body_mass_g", {"g": 5000}, "dict")):
        with pytest.raises(InputError) as error:
            model.answer(pd.DataFrame([{**PENGUIN, column: value}]))
        assert str(error.value).startswith(f"request: row 1, column {column}: a {kind} (")
    assert len(model.answer(pd.DataFrame([PENGUIN]))) == 1
    with pytest.raises(InputError, match=r"^request: no rows in it; send at least one row$"):
        mlflow.pyfunc.load_model(str(penguins)).predict(pd.DataFrame(columns=list(PENGUIN), dtype=object))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from datamodules.image_folder import ImageFolderDataModule

    folder = tmp_path_factory.mktemp("photos") / "model"
    network = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 2))
    save_model(network, torch.randn(4, 3, 32, 32), ["chickens", "turkeys"], folder,
               serving_inputs(ImageFolderDataModule(image_size=32)))  # fmt: skip
    return folder


def test_base64_wrapped_in_lines_or_as_a_data_url_is_the_same_image(photos, monkeypatch):
    """`base64 photo.jpg` and Python's encodebytes wrap their text at 76 characters, as MIME does; MLflow's server
    decodes it so (base64.decodebytes), and the scoring script must answer it as it answers the unwrapped text. A web
    page's FileReader.readAsDataURL gives `data:image/png;base64,<the text>`: it was refused as not base64 text, by the
    script and by the model itself (`mlflow models serve`'s inputs and instances hand it on as the text's bytes)."""
    import mlflow

    buffer = io.BytesIO()
    Image.new("RGB", (120, 90), (10, 200, 30)).save(buffer, format="PNG")
    plain = base64.b64encode(buffer.getvalue()).decode()
    wrapped = base64.encodebytes(buffer.getvalue()).decode()
    assert "\n" in wrapped.strip()
    data_url = "data:image/png;base64," + plain
    answers = [
        post(photos, json.dumps({"images": [text]}), "application/json", monkeypatch)
        for text in (plain, wrapped, data_url)
    ]
    assert answers[0][0] == 200 and answers[1] == answers[0] and answers[2] == answers[0], answers
    model = mlflow.pyfunc.load_model(str(photos))
    by_model = [model.predict(pd.DataFrame({"image": [image]})) for image in (plain, data_url, data_url.encode())]
    assert by_model[1].equals(by_model[0]) and by_model[2].equals(by_model[0])


def test_base64_in_the_url_safe_alphabet_or_without_padding_is_the_same_image(photos, monkeypatch):
    """RFC 4648's URL-safe alphabet (- and _ for + and /: Python's urlsafe_b64encode, JavaScript's base64url) and text
    whose = padding a client left out, as the RFC allows: both were refused as not base64 text."""
    import mlflow

    rng = np.random.default_rng(0)
    for width in range(20, 40):  # a noisy PNG whose base64 has + or / and needs padding
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (24, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
        plain = base64.b64encode(buffer.getvalue()).decode()
        if plain.endswith("=") and ("+" in plain or "/" in plain):
            break
    url_safe = base64.urlsafe_b64encode(buffer.getvalue()).decode()
    texts = [plain, url_safe, plain.rstrip("="), url_safe.rstrip("=")]
    assert len(set(texts)) == 4
    answers = [post(photos, json.dumps({"images": [text]}), "application/json", monkeypatch) for text in texts]
    assert answers[0][0] == 200 and all(answer == answers[0] for answer in answers), answers
    model = mlflow.pyfunc.load_model(str(photos))
    by_model = [model.predict(pd.DataFrame({"image": [text]})) for text in texts]
    assert all(answer.equals(by_model[0]) for answer in by_model)
    cut = plain.rstrip("=")[: len(plain.rstrip("=")) // 4 * 4 + 1]  # a length no base64 has, padded or not
    status, answer = post(photos, json.dumps({"images": [cut]}), "application/json", monkeypatch)
    assert status == 400 and "not base64 text" in answer["message"], answer


def test_a_strip_of_a_picture_is_refused_before_the_crop_resizes_it_to_gigabytes(photos, monkeypatch):
    """1 x 150,000 pixels passes the pixel limit, but its shorter side resized to 37 (the crop's 256/224 of 32) would
    make it 37 x 5,550,000: 616 MB decoded (at image_size 224, a 126-byte PNG of 1 x 10,000 costs 2.6 GB)."""
    import resource

    buffer = io.BytesIO()
    Image.new("RGB", (1, 150_000), (10, 200, 30)).save(buffer, format="PNG")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    status, answer = post(photos, buffer.getvalue(), "image/png", monkeypatch)
    assert status == 400 and answer["message"].startswith(
        "image 1: 1x150000 pixels, which the centre crop would resize to 37x5550000; send a picture"
    ), answer
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024
    wide = io.BytesIO()
    Image.new("RGB", (300, 20), (10, 200, 30)).save(wide, format="PNG")  # a panorama is no strip: answered
    assert post(photos, wide.getvalue(), "image/png", monkeypatch)[0] == 200


def test_images_are_run_through_the_network_32_at_a_time_whatever_the_batch_handed_over(photos):
    """mlflow models serve (which limits neither a request's body nor its images), a spark_udf Arrow batch (up to
    10,000 rows) and an Azure ML batch mini-batch ran the network on all their images at once: 512 photos at 64 pixels
    took 378 MB more memory (31 MB now), and a request of a few thousand small photos could have the server killed."""
    import mlflow

    from scripts.serving.pyfunc_model import softmax

    loaded = mlflow.pyfunc.load_model(str(photos))
    model = loaded.unwrap_python_model()
    session, sizes = model.session, []

    class Recording:  # the model's own ONNX Runtime session, each run's batch size written down
        def run(self, outputs, feed):
            sizes.append(len(feed["input"]))
            return session.run(outputs, feed)

    images = [png((40 + i, 30), value=3 * i) for i in range(70)]
    batch = model.preprocess(model.state, images, [f"image {i + 1}" for i in range(len(images))])
    (at_once,) = session.run(["logits"], {"input": batch})  # the network on all of them at once
    model.session = Recording()
    answers = loaded.predict(pd.DataFrame({"image": images}))
    assert sizes == [32, 32, 6]
    assert np.allclose(answers.iloc[:, 2:].to_numpy(), softmax(at_once), atol=1e-6)
    images[40] = b"not an image"  # named by its place in the whole batch, not in its run
    with pytest.raises(InputError, match="^image 41: not a readable image"):
        loaded.predict(pd.DataFrame({"image": images}))


@pytest.mark.slow
def test_file_names_survive_a_round_trip_through_the_csv_module_on_stdout_and_in_a_file(digits, tmp_path, capsys):
    """A carriage return in a name split its row (the csv module quotes it only where lines end in it); a name that
    is not UTF-8 crashed the output, leaving `--output` empty whatever it held, and stdout under a strict locale.
    Such bytes are written as \\xNN, as `ls -b` shows them, and a name's own `\\xNN` text comes back as itself."""
    import csv
    import subprocess
    import sys

    from scripts.score import main
    from tests.conftest import AWKWARD_NAMES, REPO, STRICT_UTF8, original_name

    photos = tmp_path / "photos"
    photos.mkdir()
    for index, name in enumerate(AWKWARD_NAMES):
        with open(os.path.join(os.fsencode(photos), name), "wb") as file:
            file.write(png((28, 28), 30 + 40 * index))
    expected = sorted(os.fsdecode(os.path.join(os.fsencode(photos), name)) for name in AWKWARD_NAMES)

    out = tmp_path / "out.csv"
    out.write_text("what the file held before\n")
    main([str(digits), str(photos), "--output", str(out)])
    with out.open(newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    assert rows[0][0] == "input" and sorted(original_name(row[0]) for row in rows[1:]) == expected
    assert all(len(row) == 3 for row in rows)
    assert not list(tmp_path.glob(".out.csv.*"))  # the temporary file renamed over it, none left

    capsys.readouterr()
    main([str(digits), str(photos)])
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out, newline="")))
    assert sorted(original_name(row[0]) for row in rows[1:]) == expected
    result = subprocess.run([sys.executable, "-m", "scripts.score", str(digits), str(photos)], cwd=REPO,
                            env=STRICT_UTF8, capture_output=True)  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    text = result.stdout.decode("utf-8")  # strictly UTF-8
    assert sorted(original_name(row[0]) for row in list(csv.reader(io.StringIO(text, newline="")))[1:]) == expected


def test_a_chunk_past_what_memory_holds_or_below_one_is_one_line(digits, tmp_path):
    from scripts.score import main

    (tmp_path / "a.png").write_bytes(png((28, 28), 30))
    for chunk in ("0", "-3", "100000"):
        with pytest.raises(SystemExit) as exit:
            main([str(digits), str(tmp_path), "--chunk", chunk])
        assert exit.value.code == f"error: --chunk {chunk}: give 1 to 256 images per batch"


def test_malformed_json_to_a_model_of_images_says_what_is_wrong_and_how_to_send_images(digits, monkeypatch):
    status, answer = post(digits, b'{"images": [', "application/json", monkeypatch)
    assert status == 400
    assert answer["message"] == (
        "request body is not valid JSON (Expecting value: line 1 column 13 (char 12)); send images as JSON "
        '{"images": [base64, ...]} (or multipart files)'
    )
