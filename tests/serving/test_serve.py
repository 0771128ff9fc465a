"""Serving: Azure ML's real inference server (azmlinfsrv, from .venv-serve) runs scripts/score.py on loopback, one
server per model; real HTTP requests for each task must get what `scripts.train predict` answers for the same inputs,
and every bad request a 4xx with one message while the server goes on serving."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torchvision.io import write_jpeg, write_png

from scripts.serve import main as serve_main
from scripts.train import cli_main
from tests.conftest import MNIST, REPO, bird_folders, free_port, needs_mnist, once_per_run, run_module

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SERVE_PYTHON.is_file(), reason="needs .venv-serve: `make serve-env` (.ci/run builds it)"),
]
PENGUIN = {"island": "Biscoe", "bill_length_mm": 50.4, "bill_depth_mm": 15.3, "flipper_length_mm": 200}
PENGUIN["body_mass_g"] = 5000
FORM = "application/x-www-form-urlencoded"  # the course's example penguin: a Gentoo
TINY = (
    "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
    "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
)  # fmt: skip


class Server:
    """`python -m scripts.serve MODEL` on a free loopback port, as `make serve` runs it; stopped with SIGTERM."""

    def __init__(self, model: str | Path, folder: Path, *args: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / f"server-{self.port}.log"
        command = [sys.executable, "-m", "scripts.serve", str(model), "--port", str(self.port)]
        command += ["--serving_dir", str(folder / "serving"), *args]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 240
        while True:
            with contextlib.suppress(OSError):
                status, self.card = self.get("/score")
                if status == 200:
                    break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the inference server did not start: {self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def get(self, path: str) -> tuple[int, dict]:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return response.status, json.loads(response.read())

    def post(self, body: bytes, content_type: str | None) -> tuple[int, dict]:
        request = urllib.request.Request(f"{self.url}/score", data=body, method="POST")
        if content_type:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def post_json(self, value) -> tuple[int, dict]:
        return self.post(json.dumps(value).encode(), "application/json")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)  # Ctrl-C: gunicorn's quick shutdown (SIGTERM waits 30 s for workers)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def multipart(files: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body with each file under the field `image`, as `curl -F image=@a.jpg` sends it."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, data in files:
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
        parts.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def predictions(*args: str) -> dict[str, tuple[str, float]]:
    """`scripts.train predict` in this process: input name -> (class, probability) at full precision."""
    with warnings.catch_warnings():  # LightningCLI warns that pytest's own arguments are in sys.argv
        warnings.simplefilter("ignore")
        cli = cli_main(["predict", *args])
    rows = [row for batch in cli.trainer.predict_loop.predictions for row in batch]
    return dict(zip(map(str, cli.datamodule.predict_names), rows))


def fit(outputs: Path, *args: str) -> tuple[Path, str]:
    result = run_module("scripts.train", "fit", *args, "--trainer.default_root_dir", outputs)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(re.search(r"best checkpoint: (\S+)", result.stdout).group(1)), result.stdout


# The fits test_serve and test_pyfunc both serve, each made once in the test run into the run's shared folder
# (tests/conftest.py once_per_run): a module links `outputs` of its own folder to one, and only reads it.


def penguins_registered(folder: Path) -> None:
    _, stdout = fit(folder / "outputs", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "8",
                    "--register_model", "penguins-classifier")  # fmt: skip
    assert "registered model: penguins-classifier version 1" in stdout


def birds_tiny(folder: Path) -> None:
    data = bird_folders(folder / "birds")
    fit(folder / "outputs", "--config", "configs/birds.yaml", "--data.init_args.data_dir", str(data),
        "--data.init_args.archive", "null", "--data.init_args.image_size", "64", "--data.init_args.batch_size", "4",
        "--data.init_args.num_workers", "0", *TINY)  # fmt: skip


def digits_tiny(folder: Path) -> None:
    fit(folder / "outputs", "--config", "configs/mnist.yaml", "--data.init_args.data_dir", str(MNIST), *TINY)


def shared_outputs(make: Callable[[Path], None], folder: Path) -> Path:
    """`folder`/outputs, a link to the outputs of `make`'s fit; returns its best checkpoint."""
    (folder / "outputs").symlink_to(once_per_run(make.__name__, make) / "outputs", target_is_directory=True)
    (best,) = (folder / "outputs").glob("*/*/checkpoints/best.ckpt")
    return best


def assert_same_answers(answers: list[dict], expected: dict[str, tuple[str, float]], tolerance: float, key=None):
    assert [key(a["input"]) if key else a["input"] for a in answers] == list(expected)
    for answer, (label, probability) in zip(answers, expected.values()):
        assert answer["class"] == label
        assert abs(answer["probability"] - probability) <= tolerance, (answer, probability)
        assert answer["probabilities"][label] == answer["probability"]
        assert abs(sum(answer["probabilities"].values()) - 1) < 1e-5


# Penguins: a registered model, served from the registry.


@pytest.fixture(scope="module")
def penguins(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-penguins")
    best = shared_outputs(penguins_registered, folder)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'outputs' / 'mlflow.db'}"}
    server = Server("models:/penguins-classifier/1", folder, env=env)
    yield folder, best, server
    server.stop()


@pytest.fixture(scope="module")
def penguin_csv(penguins) -> Path:
    """Every 8th complete palmerpenguins row, in palmerpenguins' schema (and its extra columns, sex and year)."""
    from palmerpenguins import load_penguins

    folder, _, _ = penguins
    path = folder / "new.csv"
    load_penguins().drop(columns=["species"]).dropna().iloc[::8].to_csv(path, index=False)
    return path


def test_the_server_listens_on_loopback_only_and_describes_its_model(penguins):
    _, _, server = penguins
    assert f"Listening at: http://127.0.0.1:{server.port}" in server.log.read_text()  # not 0.0.0.0, azmlinfsrv's
    assert (server.card["classes"], server.card["inputs"]) == (["Adelie", "Gentoo", "Chinstrap"], "rows")
    assert server.card["backend"] == "onnxruntime"
    assert urllib.request.urlopen(server.url + "/", timeout=10).status == 200  # Azure ML's liveness probe


def test_penguin_answers_are_predicts_for_a_csv_json_rows_and_azure_mls_no_code_request(penguins, penguin_csv):
    _, best, server = penguins
    expected = predictions("--config", "configs/penguins.yaml", "--ckpt_path", str(best),
                           "--data.predict_path", str(penguin_csv))  # fmt: skip
    tolerance = 1e-5  # ONNX Runtime's kernels and PyTorch's differ in the 7th digit
    status, answer = server.post(penguin_csv.read_bytes(), "text/csv")
    assert status == 200
    assert_same_answers(answer["predictions"], expected, tolerance)  # named by their line, as predict names them

    import pandas as pd

    rows = pd.read_csv(penguin_csv)
    status, answer = server.post_json(json.loads(rows.to_json(orient="records")))
    assert status == 200 and len(answer["predictions"]) == len(rows) == len(expected)
    assert_same_answers(answer["predictions"], dict(zip([f"row {i + 1}" for i in range(len(rows))], expected.values())),
                        tolerance)  # fmt: skip
    course = {"Island": "Biscoe", "CulmenLength": 50.4, "CulmenDepth": 15.3, "FlipperLength": 200, "BodyMass": 5000}
    assert server.post_json(course)[1] == server.post_json(PENGUIN)[1]  # either schema, one row as an object
    # What Azure ML's no-code MLflow deployments take: {"input_data": a DataFrame in pandas' split orientation}.
    status, answer = server.post_json({"input_data": json.loads(rows.to_json(orient="split"))})
    assert status == 200
    assert_same_answers(answer["predictions"], dict(zip([f"row {i + 1}" for i in range(len(rows))], expected.values())),
                        tolerance)  # fmt: skip
    # Careless but valid: the columns in another order, numbers as text; and `mlflow models serve`'s request.
    careless = rows[rows.columns[::-1]].astype(str)
    for body in (json.loads(careless.to_json(orient="records")),
                 {"dataframe_split": json.loads(careless.to_json(orient="split"))}):  # fmt: skip
        status, answer = server.post_json(body)
        assert status == 200
        assert_same_answers(answer["predictions"], dict(zip([f"row {i + 1}" for i in range(len(rows))],
                                                            expected.values())), tolerance)  # fmt: skip


BAD_PENGUIN_REQUESTS = [
    (b'{"island": "Biscoe", ', "application/json", 400, "request body is not valid JSON"),
    (b"", "application/json", 400, "empty request body: send the input"),
    (b"[]", "application/json", 400, "send one row as a JSON object, or several as a non-empty list of objects"),
    (b'"Biscoe"', "application/json", 400, "send one row as a JSON object"),
    ({k: v for k, v in PENGUIN.items() if k != "body_mass_g"}, None, 400, "request: missing columns; each row (a JSON"),
    ({**PENGUIN, "island": "Atlantis"}, None, 400, "request: unknown island 'Atlantis' in column island on row 1; the"),
    ({"input_data": {"columns": ["island"], "data": [["Biscoe"]]}}, None, 400, "request: missing columns; each row"),
    ({"input_data": {"columns": ["island"], "data": "x"}}, None, 400, "input_data: send a DataFrame in pandas' split"),
    ([PENGUIN, {**PENGUIN, "bill_depth_mm": "deep"}], None, 400, "request: column bill_depth_mm has a non-numeric"),
    ([PENGUIN, {**PENGUIN, "body_mass_g": None}], None, 400, "request: row 2 has no value for body_mass_g"),
    ({**PENGUIN, "flipper_length_mm": 20}, None, 400, "request: row 1: flipper_length_mm 20 is far outside"),
    ([PENGUIN] * 1001, None, 413, "1001 rows in one request; send at most 1000"),
    (b"island=Biscoe", "application/x-www-form-urlencoded", 400, "request body is not valid JSON"),  # curl -d
    (b"\x89PNG", "image/png", 415, "Content-Type image/png: send rows as application/json (or text/csv)"),
    (b"a,b\n1,2\n", "text/csv", 400, "request: missing columns"),
    # as predict refuses it (its columns were named as missing): the shared check, in the server's own environment
    (b"island;bill_length_mm\nBiscoe;50,4\n", "text/csv", 400, "request body: its columns are separated by ';'"),
]


@pytest.mark.parametrize(("body", "content_type", "status", "message"), BAD_PENGUIN_REQUESTS)
def test_a_bad_penguin_request_is_a_4xx_with_one_message_and_the_next_request_is_served(
    penguins, body, content_type, status, message
):
    _, _, server = penguins
    got = server.post(body, content_type) if isinstance(body, bytes) else server.post_json(body)
    assert got[0] == status and list(got[1]) == ["message"], got
    assert got[1]["message"].startswith(message) and "\n" not in got[1]["message"], got
    assert server.post_json(PENGUIN)[0] == 200


def test_a_model_registered_before_the_shared_csv_checks_answers_csv_requests(penguins, tmp_path):
    """The server puts the model's code first on sys.path (code/datamodules, code/scripts), and a model registered
    before the CSV checks were shared ships a datamodules/preprocessing/penguins.py without them: the scoring script
    must still find its own. Only a server shows it: in the test process the repository's datamodules is imported
    already, and a checks module the server would look for in the model's copy of the package is found there."""
    folder, _, _ = penguins
    (served,) = {path.parent for path in (folder / "serving").rglob("MLmodel")}
    older = tmp_path / "older"
    shutil.copytree(served, older)
    # What such a model shipped: these files (a module added to the packages since is not among them, but this model's
    # own preprocessing function's, new_penguins), and its penguins.py without the checks.
    packages = {"datamodules": "__init__ errors",
                "datamodules/preprocessing": "__init__ birds digits images penguins new_penguins",
                "scripts": "__init__", "scripts/serving": "__init__ pyfunc_model"}  # fmt: skip
    shipped = {f"{package}/{name}.py" for package, names in packages.items() for name in names.split()}
    for path in (older / "code").rglob("*.py"):
        if path.relative_to(older / "code").as_posix() not in shipped:
            path.unlink()
    module = older / "code" / "datamodules" / "preprocessing" / "penguins.py"
    module.write_text(module.read_text() + "\ndel SCHEMA_COLUMNS\n")  # the checks are in csv_files.py, not shipped
    server = Server(older, tmp_path)
    try:
        header = ",".join(PENGUIN).encode()
        status, answer = server.post(header + b"\n\n" + b"Biscoe,50.4,15.3,200,5000\n", "text/csv")
        assert status == 200 and [a["input"] for a in answer["predictions"]] == ["line 3"], answer
        status, answer = server.post(header + b",body_mass_g\nBiscoe,50.4,15.3,200,5000,5100\n", "text/csv")
        assert status == 400 and answer["message"].startswith("request body: column body_mass_g is named 2 times")
    finally:
        server.stop()


# Birds: a checkpoint, served as the registered model would be (pt2, ONNX, preprocessing in the metadata).


@pytest.fixture(scope="module")
def birds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-birds")
    best = shared_outputs(birds_tiny, folder)
    photos = folder / "photos"
    photos.mkdir()
    generator = torch.Generator().manual_seed(7)
    for i, (height, width) in enumerate([(120, 90), (64, 64), (300, 200), (50, 81)]):
        image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)
        image[i % 2] = 255  # something of each class's colour
        (write_jpeg if i % 2 else write_png)(image, str(photos / f"photo{i}.{'jpg' if i % 2 else 'png'}"))
    server = Server(best, folder)
    yield folder, best, photos, server
    server.stop()


def test_bird_answers_are_predicts_for_files_base64_and_raw_bytes(birds):
    _, best, photos, server = birds
    assert server.card["inputs"] == "images" and server.card["backend"] == "onnxruntime"
    # The fit's image size: predict's datamodule takes it from the config, the served model from the checkpoint.
    expected = predictions("--config", "configs/birds.yaml", "--ckpt_path", str(best), "--data.predict_path",
                           str(photos), "--data.init_args.num_workers", "0",
                           "--data.init_args.image_size", "64")  # fmt: skip
    files = [(Path(name).name, Path(name).read_bytes()) for name in expected]
    status, answer = server.post(*multipart(files))
    assert status == 200
    assert_same_answers(answer["predictions"], expected, 1e-5, key=lambda name: str(photos / name))
    status, answer = server.post_json({"images": [base64.b64encode(data).decode() for _, data in files]})
    assert status == 200 and [a["input"] for a in answer["predictions"]] == [f"image {i + 1}" for i in range(4)]
    assert_same_answers(answer["predictions"], dict(zip([f"image {i + 1}" for i in range(4)], expected.values())), 1e-5)
    no_code = {"input_data": {"columns": ["image"], "data": [[base64.b64encode(data).decode()] for _, data in files]}}
    status, answer = server.post_json(no_code)  # Azure ML's no-code request: a split DataFrame of base64 text
    assert status == 200
    assert_same_answers(answer["predictions"], dict(zip([f"image {i + 1}" for i in range(4)], expected.values())), 1e-5)
    for (name, data), (label, probability) in zip(files, expected.values()):
        # curl --data-binary @photo.jpg sends application/x-www-form-urlencoded unless told: the body is the image
        status, answer = server.post(data, "image/jpeg" if name.endswith("jpg") else FORM)
        assert status == 200 and answer["predictions"][0]["class"] == label
        assert abs(answer["predictions"][0]["probability"] - probability) <= 1e-5


def huge_png() -> bytes:
    """A 60-megapixel PNG of a few kilobytes: its header announces what decoding it would cost."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (10000, 6000)).save(buffer, format="PNG")
    return buffer.getvalue()


def bad_image_requests(photo: bytes):
    return [
        (b"this is not an image", "image/jpeg", 400, "image 1: not a readable image"),
        (photo[: len(photo) // 3], "image/jpeg", 400, "image 1: not a readable image"),
        (b"", "image/png", 400, "empty request body"),
        (*multipart([("note.txt", b"plain text")]), 400, "note.txt: not a readable image"),
        (huge_png(), "image/png", 413, "image 1: 10000x6000 pixels; send images of at most 40 megapixels"),
        (os.urandom(10 * 2**20 + 1), "application/octet-stream", 413, "image 1: 10485761 bytes; send images of at"),
        (*multipart([("a.jpg", photo)] * 33), 413, "33 images in one request; send at most 32"),
        (b'{"images": ["not base64!"]}', "application/json", 400, "image 1: not base64 text"),
        (b'{"pictures": []}', "application/json", 400, 'send images as JSON {"images": [base64, ...]}'),
        (b"{", "application/json", 400, "request body is not valid JSON"),
        (b"<svg/>", "text/html", 415, "Content-Type text/html: send images as multipart files"),
    ]


def test_a_bad_image_request_is_a_4xx_with_one_message_and_the_next_request_is_served(birds):
    _, _, photos, server = birds
    photo = (photos / "photo1.jpg").read_bytes()
    for body, content_type, status, message in bad_image_requests(photo):
        got = server.post(body, content_type)
        assert got[0] == status and list(got[1]) == ["message"], (message, got)
        assert got[1]["message"].startswith(message) and "\n" not in got[1]["message"], got
        assert server.post(photo, "image/jpeg")[0] == 200


# MNIST: a checkpoint; digits of any size, as predict reads them.


@needs_mnist
def test_digit_answers_are_predicts(tmp_path):
    from datamodules.mnist import read_idx

    best = shared_outputs(digits_tiny, tmp_path)
    digits = tmp_path / "digits"
    digits.mkdir()
    images = read_idx(next(MNIST.glob("t10k-images-idx3-ubyte*")), 2051)[:6]
    for i, image in enumerate(images):
        image = torch.nn.functional.interpolate(image[None, None].float(), size=(40 + 4 * i, 40)).round()
        write_png(image[0].to(torch.uint8), str(digits / f"digit{i}.png"))  # another size than 28x28: resized
    expected = predictions("--config", "configs/mnist.yaml", "--ckpt_path", str(best), "--data.predict_path",
                           str(digits))  # fmt: skip
    server = Server(best, tmp_path)
    try:
        assert server.card["inputs"] == "images" and server.card["classes"] == [str(d) for d in range(10)]
        files = [(Path(name).name, Path(name).read_bytes()) for name in expected]
        status, answer = server.post(*multipart(files))
        assert status == 200
        assert_same_answers(answer["predictions"], expected, 1e-5, key=lambda name: str(digits / name))
        got = server.post(b"GIF89a not really", "image/gif")
        assert got[0] == 400 and got[1]["message"].startswith("image 1: not a readable image")
    finally:
        server.stop()


def test_batch_scoring_of_a_folder_answers_as_the_server(birds, tmp_path):
    folder, _, photos, server = birds
    (model_dir,) = {path.parent.parent for path in (folder / "serving").glob("*/*/model/MLmodel")}
    result = run_module("scripts.score", model_dir, photos, "--output", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = (tmp_path / "out" / "predictions.csv").read_text().splitlines()
    assert lines[0] == "input,class,probability" and len(lines) == 5
    files = sorted(photos.iterdir())
    answers = server.post(*multipart([(path.name, path.read_bytes()) for path in files]))[1]["predictions"]
    for line, path, answer in zip(lines[1:], files, answers):
        assert line == f"{path},{answer['class']},{answer['probability']:.4f}"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["nothing.ckpt"], "error: nothing.ckpt: no such model; give models:/NAME/VERSION (fit --register_model NAME)"),
        (["x", "--port", "0"], "error: --port 0: give a port 1-65535"),
        (["x", "--port", "65536"], "error: --port 65536: give a port 1-65535"),
        (["x", "--workers", "0"], "error: --workers 0: give 1 to "),
        (["x", "--threads", "-1"], "error: --threads -1: give 0 (one per core) to "),
        (["x", "--host", "192.0.2.1"], "error: --host 192.0.2.1 --port 5001: cannot listen there (Cannot assign"),
        (["x", "--backend", "torch"], "error: unrecognized arguments: --backend torch"),
        (["x", "--threads", "1000"], "error: --threads 1000: give 0 (one per core) to "),
        (["configs"], "error: configs: no MLmodel in this folder; give a registered model's folder, .ckpt or models:/"),
        (["models:/penguins-classifier/1"], "error: sqlite:///{tmp}/none.db: no such MLflow store; check"),
    ],
)
def test_a_serve_mistake_is_one_line_and_exit_1(args, line, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/none.db")
    with pytest.raises(SystemExit) as exit:
        serve_main([*args, "--serving_dir", str(tmp_path / "serving")])
    message = str(exit.value.code)
    assert message.startswith(line.format(tmp=tmp_path)) and "\n" not in message, message
    assert not (tmp_path / "none.db").exists()  # MLflow would have made an empty store
    assert not (tmp_path / "serving").exists()  # no empty model folder left behind


def test_score_backend_torch_is_one_line_not_a_silent_onnx_runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("SCORE_BACKEND", "torch")
    with pytest.raises(SystemExit) as exit:
        serve_main(["x", "--serving_dir", str(tmp_path / "serving")])
    assert exit.value.code == (
        "error: SCORE_BACKEND 'torch': the model's network runs with ONNX Runtime only (the serving environment has no "
        "torch); unset SCORE_BACKEND"
    )


def test_workers_and_threads_past_this_machine_s_cores_are_one_line(tmp_path):
    """--workers 1000000 forked workers until memory ran out; --threads 1000 on 2 cores made a request 200x slower."""
    cores = len(os.sched_getaffinity(0))
    for args, line in (
        (["--workers", "1000000"], f"error: --workers 1000000: give 1 to {2 * cores + 1} (2 x this machine's {cores} "
                                   "cores + 1)"),
        (["--workers", str(2 * cores + 2)], f"error: --workers {2 * cores + 2}: give 1 to {2 * cores + 1}"),
        (["--threads", "1000"], f"error: --threads 1000: give 0 (one per core) to {cores} (this machine's cores)"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit:
            serve_main(["x", *args, "--serving_dir", str(tmp_path / "serving")])
        assert str(exit.value.code).startswith(line), exit.value.code
    assert not (tmp_path / "serving").exists()


def test_sigterm_ends_the_server_and_every_worker_within_seconds(penguins):
    """SIGTERM while the workers still load the model (gunicorn waited its 30 s graceful timeout for them): the
    server and each worker are gone within seconds. Waited for by polling, with a bound."""
    import psutil

    folder, _, _ = penguins
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'outputs' / 'mlflow.db'}"}
    command = [sys.executable, "-m", "scripts.serve", "models:/penguins-classifier/1", "--port", str(free_port()),
               "--workers", "3", "--serving_dir", str(folder / "sigterm")]  # fmt: skip
    with (folder / "sigterm.log").open("w") as log:
        server = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    workers: list = []
    try:
        deadline = time.monotonic() + 240
        while len(workers) < 3 and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            workers = psutil.Process(server.pid).children(recursive=True)
        assert len(workers) == 3, (folder / "sigterm.log").read_text()[-3000:]
        server.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        alive = workers
        while time.monotonic() < deadline and (server.poll() is None or alive):
            time.sleep(0.1)
            alive = [w for w in alive if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
        assert server.poll() is not None and not alive, f"still running 10 s after SIGTERM: server, {alive}"
    finally:  # a failed check leaves nothing running behind it
        for process in [*workers, psutil.Process(server.pid) if server.poll() is None else None]:
            with contextlib.suppress(psutil.Error, AttributeError):
                process.kill()
        server.wait(timeout=30)


def test_a_version_not_in_the_registry_is_one_line(penguins, tmp_path, monkeypatch):
    folder, _, _ = penguins
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'outputs' / 'mlflow.db'}")
    with pytest.raises(SystemExit) as exit:
        serve_main(["models:/penguins-classifier/3", "--serving_dir", str(tmp_path / "serving")])
    assert str(exit.value.code).startswith("error: models:/penguins-classifier/3: not in the registry at sqlite:///")
    assert "\n" not in str(exit.value.code)
    assert not (tmp_path / "serving").exists()  # no empty outputs/serving/penguins-classifier/3 left behind


def test_a_second_server_on_a_taken_port_fails_before_it_says_serving(penguins):
    """The port of a server already serving: one line before the model is prepared, and no "serving" line."""
    folder, _, server = penguins
    taken = server.port
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'outputs' / 'mlflow.db'}"}
    result = run_module("scripts.serve", "models:/penguins-classifier/1", "--port", str(taken),
                        "--serving_dir", str(folder / "second"), env=env)  # fmt: skip
    assert result.returncode == 1 and "serving" not in result.stdout, result.stdout + result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"error: --port {taken}: 127.0.0.1:{taken} is in use (another server?); give another --port, or stop that one"
    ]
    assert not (folder / "second").exists()
    assert server.get("/score")[0] == 200  # the first one goes on serving
