"""The registered model is an MLflow pyfunc that runs without torch: loaded with mlflow.pyfunc.load_model in the
serving environment (.venv-serve: no torch, no Lightning), outside the repository, and served by `mlflow models serve
--env-manager local` on loopback, it answers raw penguin rows, bird photos and digits as `scripts.train predict` does,
and refuses bad input naming the row or image."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from scripts.serve import from_checkpoint
from tests.conftest import MNIST, REPO, free_port, needs_mnist
from tests.serving.test_serve import birds_tiny, digits_tiny, huge_png, penguins_registered, predictions, shared_outputs

SERVE = REPO / ".venv-serve" / "bin"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (SERVE / "python").is_file(), reason="needs .venv-serve: `make serve-env` (.ci/run does)"),
]
PENGUIN_COLUMNS = ["island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
COURSE = dict(zip(PENGUIN_COLUMNS, ["Island", "CulmenLength", "CulmenDepth", "FlipperLength", "BodyMass"]))


def probe(model: Path, cases: list[dict], folder: Path) -> dict:
    """tests/serving/pyfunc_probe.py in .venv-serve, from a folder outside the repository: each case's answers or
    error."""
    (folder / "cases.json").write_text(json.dumps(cases))
    probe_file = REPO / "tests" / "serving" / "pyfunc_probe.py"
    done = subprocess.run([SERVE / "python", probe_file, model, "cases.json", "answers.json"],
                          cwd=folder, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Add type hints" not in done.stderr  # MLflow's advice to the model's author, not to its users
    found = json.loads((folder / "answers.json").read_text())
    assert found["loaded"] == [] and found["installed"] == []  # neither imported nor importable
    return found


def frame_case(frame, images_as_bytes: bool = False) -> dict:
    split = json.loads(frame.to_json(orient="split", index=False, double_precision=15))
    return {"columns": split["columns"], "data": split["data"], "bytes": images_as_bytes}


def image_case(images: list[bytes], images_as_bytes: bool) -> dict:
    return {"columns": ["image"], "data": [[base64.b64encode(data).decode()] for data in images],
            "bytes": images_as_bytes}  # fmt: skip


def largest_difference(result: dict, expected: dict[str, tuple[str, float]]) -> float:
    """Checks the classes and returns the largest |probability - predict's| of one probe result."""
    assert "error" not in result, result
    assert result["columns"][:2] == ["class", "probability"]
    rows = result["data"]
    assert [row[0] for row in rows] == [label for label, _ in expected.values()]
    for row in rows:
        assert row[1] == max(row[2:]) and abs(sum(row[2:]) - 1) < 1e-5
    return max(abs(row[1] - probability) for row, (_, probability) in zip(rows, expected.values()))


def assert_refused(result: dict, message: str) -> None:
    assert result.get("error", [])[:3] == ["InputError", "MlflowException", "ValueError"], result
    assert result["message"].startswith(message) and "\n" not in result["message"], result


class MlflowServer:
    """`mlflow models serve --env-manager local` from .venv-serve on a loopback port, stopped by its process id."""

    def __init__(self, model: Path, folder: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / f"mlflow-serve-{self.port}.log"
        command = [SERVE / "mlflow", "models", "serve", "-m", model, "--env-manager", "local", "--host", "127.0.0.1",
                   "--port", str(self.port), "--workers", "1"]  # fmt: skip
        env = {**os.environ, "PATH": f"{SERVE}{os.pathsep}{os.environ['PATH']}"}  # as activated: it execs uvicorn
        with self.log.open("w") as log:
            self.process = subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/ping", timeout=5) as response:
                if response.status == 200:
                    break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"mlflow models serve did not start: {self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def post(self, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
        request = urllib.request.Request(f"{self.url}/invocations", data=body, method="POST")
        request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)  # its session: the server and its uvicorn worker
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def served_rows(answer: dict) -> list[list]:
    return [[row["class"], row["probability"]] for row in answer["predictions"]]


# Penguins: the registry's model.


@pytest.fixture(scope="module")
def penguins(tmp_path_factory):
    import mlflow
    from palmerpenguins import load_penguins

    folder = tmp_path_factory.mktemp("pyfunc-penguins")
    best = shared_outputs(penguins_registered, folder)
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'outputs' / 'mlflow.db'}")
    try:
        model = Path(mlflow.artifacts.download_artifacts("models:/penguins-classifier/1", dst_path=str(folder / "m")))
    finally:
        mlflow.set_tracking_uri(None)
    rows = load_penguins().drop(columns=["species"]).dropna().iloc[::4]  # palmerpenguins' schema, and sex and year
    rows.to_csv(folder / "new.csv", index=False)
    expected = predictions("--config", "configs/penguins.yaml", "--ckpt_path", str(best),
                           "--data.predict_path", str(folder / "new.csv"))  # fmt: skip
    return folder, model, rows, expected


def test_penguin_rows_in_either_schema_answer_as_predict_without_torch(penguins):
    folder, model, rows, expected = penguins
    course = rows[PENGUIN_COLUMNS].rename(columns=COURSE)
    atlantis = rows[PENGUIN_COLUMNS].iloc[:3].copy()
    atlantis.iloc[2, 0] = "Atlantis"
    misspelt = rows[PENGUIN_COLUMNS].iloc[:2].rename(columns=str.upper)  # no column the signature names
    cases = [frame_case(rows), frame_case(course), frame_case(rows[PENGUIN_COLUMNS[:-1]]), frame_case(atlantis),
             frame_case(misspelt)]  # fmt: skip
    results = probe(model, cases, folder)["results"]
    difference = max(largest_difference(results[0], expected), largest_difference(results[1], expected))
    assert difference <= 1e-5, difference
    print(f"penguins: {len(expected)} rows, largest |pyfunc - predict| probability {difference:.1e}")
    assert results[0]["columns"] == ["class", "probability", "probability_Adelie", "probability_Gentoo",
                                     "probability_Chinstrap"]  # fmt: skip
    assert_refused(results[2], "request: missing columns; each row (a JSON object's fields, or a CSV's columns) "
                   "needs island, bill_length_mm")  # fmt: skip
    # Its requirements pin what predict imports (the serving environment's pins but the server), with a signature
    # (either schema's columns) and an input example (the course's penguin).
    from mlflow.models import Model

    from scripts.serving.mlflow_model import serving_requirements

    assert (model / "requirements.txt").read_text().split() == serving_requirements()
    card = Model.load(str(model))
    assert card.flavors["python_function"]["loader_module"] == "mlflow.pyfunc.model"
    assert {"island", "Island", "body_mass_g", "BodyMass"} <= set(card.signature.inputs.input_names())
    assert card.signature.outputs.input_names()[:2] == ["class", "probability"]
    assert json.loads((model / "input_example.json").read_text())["data"] == [["Biscoe", 50.4, 15.3, 200.0, 5000.0]]
    assert_refused(results[3], "request: unknown island 'Atlantis' in column island on row 3; the model knows")
    # MLflow's check of the signature drops every column: no rows left, refused rather than answered with none.
    assert_refused(results[4], "request: missing columns; each row (a JSON object's fields, or a CSV's columns) "
                   "needs island, bill_length_mm")  # fmt: skip


def test_mlflow_models_serve_answers_penguins_as_the_pyfunc_and_refuses_bad_rows_with_400(penguins):
    folder, model, rows, expected = penguins
    server = MlflowServer(model, folder)
    try:
        split = json.loads(rows.to_json(orient="split", index=False, double_precision=15))
        status, answer = server.post(json.dumps({"dataframe_split": split}).encode())
        assert status == 200, answer
        in_process = probe(model, [frame_case(rows)], folder)["results"][0]["data"]
        assert served_rows(answer) == [row[:2] for row in in_process]
        status, answer = server.post(json.dumps({"dataframe_records": rows.to_dict("records")}).encode())
        assert status == 200 and served_rows(answer) == [row[:2] for row in in_process]
        # Careless but valid: the columns in another order, numbers as text, a column the model does not read.
        careless = rows[PENGUIN_COLUMNS[::-1]].astype(str).assign(comment="seen at dawn")
        careless_split = json.loads(careless.to_json(orient="split", index=False))
        status, answer = server.post(json.dumps({"dataframe_split": careless_split}).encode())
        assert status == 200 and served_rows(answer) == [row[:2] for row in in_process]
        bad = [
            ({"dataframe_split": {**split, "data": [[*split["data"][0][:1], "deep", *split["data"][0][2:]]]}},
             "request: column bill_length_mm has a non-numeric value 'deep' on row 1; fix or remove that row"),
            ({"dataframe_records": [{"island": "Atlantis", **dict(zip(PENGUIN_COLUMNS[1:], [50.4, 15.3, 200, 5000]))}]},
             "request: unknown island 'Atlantis' in column island on row 1; the model knows"),
            ({"dataframe_records": [{"island": "Biscoe"}]}, "request: missing columns; each row"),
            # Rows of no column the signature names (a list of lists, misspelt names): MLflow passes on no rows.
            ({"inputs": split["data"][:2]}, "request: missing columns; each row"),
            ({"dataframe_records": [{"Island ": "Biscoe", "bill_length": 50.4}]}, "request: missing columns; each row"),
            ({"dataframe_split": {**split, "data": []}}, "request: no rows in it; send at least one row"),  # was 200 []
            ({"dataframe_split": {**split, "data": [[*split["data"][0][:3], True, *split["data"][0][4:]]]}},
             "request: row 1, column flipper_length_mm: a bool (True); give one string or number per cell"),
        ]  # fmt: skip
        for body, message in bad:
            status, answer = server.post(json.dumps(body).encode())
            # MLflow's server puts "Failed to predict data '<the frame>'. Error: " before the model's message.
            assert status == 400 and answer["error_code"] == "BAD_REQUEST" and message in answer["message"], answer
        assert server.post(json.dumps({"dataframe_split": split}).encode())[0] == 200  # and it serves on
    finally:
        server.stop()


# Birds: a checkpoint saved as the registered model; a folder of real photos in the formats phones and cameras write.


def photo(height: int = 90, width: int = 120, tint: int = 0) -> np.ndarray:
    """A smooth, asymmetric colour picture (JPEG keeps it well; a rotation shows)."""
    y, x = np.mgrid[0:height, 0:width]
    picture = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    picture[..., tint % 3] = 255 - picture[..., tint % 3] // 2
    return picture.astype(np.uint8)


def photo_folder(folder: Path) -> Path:
    """JPEG, PNG, a JPEG stored sideways with its EXIF orientation, RGBA and 16-bit PNGs, a grey JPEG, a WebP."""
    folder.mkdir()
    Image.fromarray(photo()).save(folder / "a-camera.jpg", quality=90)
    Image.fromarray(photo(160, 100, 1)).save(folder / "b-screenshot.png")
    sideways = Image.fromarray(np.rot90(photo(120, 90, 2), k=-1).copy())  # how a phone stores a portrait photo...
    exif = Image.Exif()
    exif[0x0112] = 8  # ...with "rotate 90 degrees counter-clockwise to view"
    sideways.save(folder / "c-phone.jpg", quality=92, exif=exif)
    rgba = np.dstack([photo(80, 80, 1), np.full((80, 80), 200, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(folder / "d-transparent.png")
    Image.fromarray(photo(70, 110)[..., 0].astype(np.uint16) * 257).save(folder / "e-16-bit.png")
    Image.fromarray(photo(100, 100, 2)[..., 1]).save(folder / "f-grey.jpg", quality=85)
    Image.fromarray(photo(64, 96, 1)).save(folder / "g-web.webp", quality=90)
    return folder


@pytest.fixture(scope="module")
def birds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pyfunc-birds")
    best = shared_outputs(birds_tiny, folder)
    model = from_checkpoint(best, folder / "model")
    photos = photo_folder(folder / "photos")
    expected = predictions("--config", "configs/birds.yaml", "--ckpt_path", str(best), "--data.predict_path",
                           str(photos), "--data.init_args.num_workers", "0",
                           "--data.init_args.image_size", "64")  # fmt: skip
    return folder, model, photos, expected


def test_bird_photos_as_bytes_or_base64_answer_as_predict_without_torch(birds):
    folder, model, photos, expected = birds
    images = [Path(name).read_bytes() for name in expected]
    assert [Path(name).parent for name in expected] == [photos] * 7
    oversize = huge_png()
    # base64 as MIME (`base64 photo.jpg`) writes it, in lines of 76 characters: MLflow's server decodes it so
    wrapped = {"columns": ["image"], "data": [[base64.encodebytes(data).decode()] for data in images]}
    cases = [image_case(images, True), image_case(images, False), image_case([images[0], b"not an image"], True),
             image_case([oversize], True), {"columns": ["picture"], "data": [["x"]]}, wrapped]  # fmt: skip
    results = probe(model, cases, folder)["results"]
    difference = max(largest_difference(results[0], expected), largest_difference(results[1], expected))
    assert results[5] == results[1]
    assert difference <= 1e-5, difference
    print(f"birds: {len(expected)} photos, largest |pyfunc - predict| probability {difference:.1e}")
    assert_refused(results[2], "image 2: not a readable image (not a JPEG, PNG, WebP or GIF image); send a JPEG")
    assert_refused(results[3], "image 1: 10000x6000 pixels; send images of at most 40 megapixels")
    assert "Model is missing inputs ['image']" in results[4]["message"]  # MLflow's own check of the signature


def test_mlflow_models_serve_answers_photos_sent_as_base64_and_refuses_bad_ones_with_400(birds):
    folder, model, _, expected = birds
    images = [Path(name).read_bytes() for name in expected]
    server = MlflowServer(model, folder)
    try:
        split = {"columns": ["image"], "data": [[base64.b64encode(data).decode()] for data in images]}
        status, answer = server.post(json.dumps({"dataframe_split": split}).encode())
        assert status == 200, answer
        assert [row[0] for row in served_rows(answer)] == [label for label, _ in expected.values()]
        for (_, probability), (_, served) in zip(expected.values(), served_rows(answer)):
            assert abs(served - probability) <= 1e-5
        # MLflow's other two formats: it hands their base64 on undecoded, as the text's bytes
        texts = [row[0] for row in split["data"]]
        for body in ({"inputs": {"image": texts}}, {"instances": [{"image": text} for text in texts]}):
            assert server.post(json.dumps(body).encode()) == (200, answer), body
        for data, message in [(b"not an image", "image 1: not a readable image"),
                              (huge_png(), "image 1: 10000x6000 pixels; send images of at most")]:  # fmt: skip
            body = {"dataframe_split": {"columns": ["image"], "data": [[base64.b64encode(data).decode()]]}}
            status, answer = server.post(json.dumps(body).encode())
            assert status == 400 and answer["error_code"] == "BAD_REQUEST" and message in answer["message"], answer
        # An empty batch was answered 200 with no predictions, which the scoring script and predict refuse.
        for body in ({"dataframe_split": {"columns": ["image"], "data": []}}, {"inputs": []}, {"instances": []}):
            status, answer = server.post(json.dumps(body).encode())
            assert status == 400 and "request: no images in it; send at least one image" in answer["message"], answer
    finally:
        server.stop()


def test_a_checkpoints_model_is_saved_again_when_the_code_it_ships_is_not_the_repositorys(birds):
    """`make serve CKPT` keeps the model folder it made from a checkpoint while the checkpoint is older; after an
    update of the repository that folder ships the code of before (its pyfunc and preprocessing), and would go on
    answering with it."""
    folder, model, _, _ = birds
    (best,) = (folder / "outputs").glob("*/*/checkpoints/best.ckpt")
    saved = (model / "MLmodel").stat().st_mtime_ns
    assert from_checkpoint(best, model) == model and (model / "MLmodel").stat().st_mtime_ns == saved  # kept
    shipped = model / "code" / "datamodules" / "preprocessing" / "images.py"
    shipped.write_text(shipped.read_text() + "# as an older release wrote it\n")
    assert from_checkpoint(best, model) == model
    assert shipped.read_text() == (REPO / "datamodules" / "preprocessing" / "images.py").read_text()


# MNIST: digits of any size, white on black or ink on paper.


@needs_mnist
def test_digits_answer_as_predict_without_torch(tmp_path):
    from torchvision.io import write_png

    from datamodules.mnist import read_idx

    best = shared_outputs(digits_tiny, tmp_path)
    digits = tmp_path / "digits"
    digits.mkdir()
    images = read_idx(next(MNIST.glob("t10k-images-idx3-ubyte*")), 2051)[:8]
    for i, image in enumerate(images):
        image = torch.nn.functional.interpolate(image[None, None].float(), size=(28 + 6 * i, 28 + 3 * i)).round()
        image = image[0].to(torch.uint8)
        write_png(255 - image if i % 3 == 2 else image, str(digits / f"digit{i}.png"))  # some in ink on paper
    expected = predictions("--config", "configs/mnist.yaml", "--ckpt_path", str(best), "--data.predict_path",
                           str(digits))  # fmt: skip
    model = from_checkpoint(best, tmp_path / "model")
    buffer = io.BytesIO()
    Image.new("L", (9000, 9000)).save(buffer, format="PNG")
    cases = [image_case([Path(name).read_bytes() for name in expected], True), image_case([buffer.getvalue()], True)]
    results = probe(model, cases, tmp_path)["results"]
    difference = largest_difference(results[0], expected)
    assert difference <= 1e-5, difference
    print(f"MNIST: {len(expected)} digits, largest |pyfunc - predict| probability {difference:.1e}")
    assert_refused(results[1], "image 1: 9000x9000 pixels; send images of at most 40 megapixels")
