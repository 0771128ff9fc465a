"""The scoring script of every task, with Azure ML's contract: `init()` loads the model once, `run(request)` answers
one request. Azure ML's inference server runs it, locally (`make serve`) and in an online endpoint (scripts.deploy).
A thin wrapper over the registered model itself, an MLflow pyfunc (scripts/serving/pyfunc_model.py): the same
preprocessing, network and answers as `mlflow.pyfunc.load_model(...).predict(...)`; this adds the HTTP contract.

    make serve MODEL=models:/penguins-classifier/1     # azmlinfsrv on http://127.0.0.1:5001/score
    curl -s http://127.0.0.1:5001/score -H 'Content-Type: application/json' -d '{"island": "Biscoe",
        "bill_length_mm": 50.4, "bill_depth_mm": 15.3, "flipper_length_mm": 200, "body_mass_g": 5000}'
    curl -s http://127.0.0.1:5001/score -F image=@turkey.jpg -F image=@chicken.png
    python -m scripts.score MODEL_DIR photos/ > predictions.csv    # the same model over a folder or a CSV, in batches

The model is a folder in `AZUREML_MODEL_DIR` (Azure ML mounts the deployment's registered model there; `make serve`
downloads or converts one): the MLflow model `--register_model` writes (scripts/serving/mlflow_model.py). Nothing here
knows a task, and nothing imports torch or Lightning: it runs in the serving environment (.venv-serve).

Requests (POST /score):
- rows (penguins): JSON, one row as an object or several as a list of objects, in the datamodule's column names
  (penguins: either CSV schema's, island, bill_length_mm, ... or Island, CulmenLength, ...); or a CSV body
  (Content-Type: text/csv).
- images (MNIST digits, birds): files in a multipart form (`curl -F image=@a.jpg`), the bytes of one image as the
  body (Content-Type: image/jpeg, image/png, application/octet-stream), or JSON `{"images": [BASE64, ...]}` (or
  `{"image": BASE64}`).
The answer: `{"predictions": [{"input", "class", "probability", "probabilities": {class: p}}, ...]}` in input order.
A request the model cannot answer gets a 4xx and `{"message": "..."}` naming the culprit (400: malformed, 413: too
large, 415: an unsupported content type), as the server's own errors do. GET /score describes the model.
SCORE_THREADS: the threads of one request (default: one per core). The network runs with ONNX Runtime only: the
serving environment has no torch (SCORE_BACKEND=torch is refused; the pt2 program is in the model for torch users).
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import logging
import os
import sys
from pathlib import Path

# The server loads this file by its path, from an app root that may be another folder (Azure ML's /var/azureml-app).
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

try:  # the inference server's own request and response types: present where it runs (.venv-serve, Azure ML)
    from azureml_inference_server_http.api.aml_request import rawhttp
    from azureml_inference_server_http.api.aml_response import AMLResponse
except ImportError:  # used as a library: batch scoring, tests
    AMLResponse = None

    def rawhttp(function):
        return function


BACKEND = "onnxruntime"  # the only one: the registered model's network is ONNX, the serving environment has no torch
MAX_ROWS = int(os.environ.get("SCORE_MAX_ROWS", "1000"))  # table rows in one request
MAX_IMAGES = int(os.environ.get("SCORE_MAX_IMAGES", "32"))  # images in one request
MAX_IMAGE_BYTES = int(os.environ.get("SCORE_MAX_IMAGE_BYTES", str(10 * 2**20)))  # one encoded image (the model's too)
MAX_BODY_BYTES = MAX_IMAGES * MAX_IMAGE_BYTES * 4 // 3 + 2**20  # the largest request that could be valid (base64)
IMAGE_TYPES = ("image/", "application/octet-stream")
FORM = "application/x-www-form-urlencoded"  # what `curl -d` and `--data-binary` send unless told: taken as the body

logger = logging.getLogger("azmlinfsrv.score")  # the server's logger: its lines land in the endpoint's logs
model: Model | None = None


class RequestError(Exception):
    """A request the model cannot answer; `status` is its HTTP status (4xx), the message names the culprit."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ModelError(Exception):
    """A model folder the scoring script cannot serve; the message names it and what to give."""


KINDS = {
    "rows": "JSON rows (an object or a list of objects) in the data's column names, or a text/csv body",
    "images": "images: multipart files, one image as the body, or JSON {'images': [base64, ...]}",
}


class Model:
    """The registered pyfunc model of a folder, loaded with MLflow, and what the HTTP contract needs of it."""

    def __init__(self, folder: Path) -> None:
        import mlflow.pyfunc
        import yaml
        from mlflow.exceptions import MlflowException

        backend = os.environ.get("SCORE_BACKEND", BACKEND)
        if backend != BACKEND:
            raise ModelError(
                f"SCORE_BACKEND {backend!r}: the model's network runs with ONNX Runtime only (the serving environment "
                "has no torch); unset SCORE_BACKEND"
            )
        flavors = (yaml.safe_load((folder / "MLmodel").read_text()) or {}).get("flavors") or {}
        config = (flavors.get("python_function") or {}).get("config") or {}
        if config.get("kind") not in KINDS or not config.get("class_names"):
            raise ModelError(
                f"{folder}: not a pyfunc model of this template (its MLmodel has no class_names or input kind); serve "
                "a model that `fit --register_model` (or scripts.serve from a checkpoint) saved"
            )
        try:
            self.pyfunc = mlflow.pyfunc.load_model(str(folder))
        except (MlflowException, ImportError, OSError) as error:
            raise ModelError(f"{folder}: the model does not load ({str(error).splitlines()[0]})") from None
        self.folder = folder
        self.python_model = self.pyfunc.unwrap_python_model()
        self.kind, self.class_names = self.python_model.kind, self.python_model.class_names
        self.backend = BACKEND

    def predict(self, inputs, names: list[str]) -> list[dict]:
        """The answers for `inputs` (a DataFrame of rows, or encoded images), one per input, named by `names`."""
        from scripts.serving.pyfunc_model import InputError

        try:
            frame = self.python_model.answer(inputs, names)
        except InputError as error:
            raise RequestError(str(error), 413 if error.oversize else 400) from None
        columns = [f"probability_{name}" for name in self.class_names]
        return [
            {
                "input": name,
                "class": row["class"],
                "probability": row["probability"],
                "probabilities": {label: row[column] for label, column in zip(self.class_names, columns)},
            }
            for name, row in zip(names, frame.to_dict("records"))
        ]

    def describe(self) -> dict:
        inputs = self.pyfunc.metadata.metadata.get("inputs", {}) if self.pyfunc.metadata.metadata else {}
        return {
            "classes": self.class_names,
            "inputs": self.kind,
            "datamodule": inputs.get("datamodule"),
            "backend": self.backend,
            "accepts": KINDS[self.kind],
        }


def model_folder(root: Path) -> Path:
    """The MLflow model in `root`: root itself or the one folder below it holding an MLmodel (Azure ML mounts a
    registered model at AZUREML_MODEL_DIR/<its folder name>)."""
    if (root / "MLmodel").is_file():
        return root
    found = sorted(path.parent for path in root.glob("*/MLmodel")) or sorted(root.rglob("MLmodel"))
    if not found:
        raise ModelError(f"{root}: no MLflow model (MLmodel file) in it; give the folder of a registered model")
    return found[0].parent if found[0].name == "MLmodel" else found[0]


def load_model(root: str | Path) -> Model:
    return Model(model_folder(Path(root)))


def init() -> None:
    """Loads the model in AZUREML_MODEL_DIR once per server worker."""
    global model
    root = os.environ.get("AZUREML_MODEL_DIR")
    if not root:
        raise ModelError("AZUREML_MODEL_DIR is not set: give the server --model_dir (make serve does)")
    model = load_model(root)
    logger.info("serving %s (%s) with %s", model.folder, model.kind, model.backend)


@rawhttp
def run(request):
    """One request: its inputs in input order, or a 4xx naming what is wrong with it."""
    if request.method == "GET":
        return respond(model.describe(), 200)
    try:
        inputs, names = read_request(model, request)
        answers = model.predict(inputs, names)
    except RequestError as error:
        logger.info("refused: %s %s", error.status, error)
        return respond({"message": str(error)}, error.status)
    return respond({"predictions": answers}, 200)


def respond(body: dict, status: int):
    if AMLResponse is not None:
        return AMLResponse(body, status, json_str=True)
    from werkzeug.wrappers import Response

    return Response(json.dumps(body), status=status, mimetype="application/json")


def read_request(model: Model, request) -> tuple[object, list[str]]:
    """The model's raw inputs (a DataFrame of rows, or encoded images) and a name for each."""
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        raise RequestError(f"request body of {length} bytes is too large; send at most {MAX_BODY_BYTES}", 413)
    mimetype = (request.mimetype or "").lower()
    if model.kind == "rows":
        if mimetype in ("text/csv", "application/csv"):
            return row_inputs(model, csv_rows(body_of(request)), lambda i: f"line {i + 2}")
        if mimetype not in ("application/json", "", FORM):
            raise RequestError(f"Content-Type {mimetype}: send rows as application/json (or text/csv)", 415)
        return row_inputs(model, json_rows(body_of(request)), lambda i: f"row {i + 1}")
    if mimetype == "multipart/form-data":
        files = [(file.filename or field, file.read()) for field, file in request.files.items(multi=True)]
        if not files:
            raise RequestError("multipart request without files: send each image as a file (curl -F image=@a.jpg)")
    elif mimetype == "application/json":
        files = json_images(body_of(request))
    elif mimetype.startswith(IMAGE_TYPES) or mimetype in ("", FORM):
        files = [("image 1", body_of(request))]
    else:
        raise RequestError(f"Content-Type {mimetype}: send images as multipart files, image/* or JSON base64", 415)
    return image_inputs(model, files)


def body_of(request) -> bytes:
    body = request.get_data(cache=False)
    if not body:
        raise RequestError("empty request body: send the input (rows as JSON or CSV, or images)")
    return body


def json_body(body: bytes):
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:
        raise RequestError(f"request body is not valid JSON ({error})") from None


def input_data(given):
    """Azure ML's no-code MLflow request, {"input_data": {"columns": [...], "index": [...], "data": [[...], ...]}}
    (a DataFrame in pandas' split orientation), as a DataFrame; None for any other JSON."""
    if not (isinstance(given, dict) and "input_data" in given):
        return None
    import pandas as pd

    split = given["input_data"]
    try:
        if not (isinstance(split, dict) and isinstance(split.get("data"), list) and split["data"]):
            raise ValueError("no data")
        frame = pd.DataFrame(split["data"], columns=split.get("columns"), index=split.get("index"))
        return frame.reset_index(drop=True)
    except (ValueError, TypeError, AssertionError):
        raise RequestError(
            'input_data: send a DataFrame in pandas\' split orientation: {"input_data": {"columns": [...], "data": '
            "[[...], ...]}}, one list per row"
        ) from None


def json_rows(body: bytes):
    """JSON rows: an object, a list of objects, or Azure ML's {"input_data": ...}."""
    rows = json_body(body)
    frame = input_data(rows)
    if frame is not None:
        return frame
    rows = [rows] if isinstance(rows, dict) else rows
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
        raise RequestError("send one row as a JSON object, or several as a non-empty list of objects")
    return rows


def csv_rows(body: bytes):
    import pandas as pd

    try:
        return pd.read_csv(io.BytesIO(body))
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as error:
        raise RequestError(f"request body is not a readable CSV ({error})") from None


def row_inputs(model: Model, rows, row_name, max_rows: int = MAX_ROWS) -> tuple[object, list[str]]:
    """Rows (JSON objects or a CSV's DataFrame) as a DataFrame, at most `max_rows`; `row_name(i)` names the row of
    index i in messages and answers."""
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame.from_records(rows)
    if len(frame) > max_rows:
        raise RequestError(f"{len(frame)} rows in one request; send at most {max_rows}", 413)
    return frame, [row_name(index) for index in frame.index]


def json_images(body: bytes) -> list[tuple[str, bytes]]:
    given = json_body(body)
    frame = input_data(given)
    if frame is not None:
        if list(frame.columns) != ["image"]:
            raise RequestError('input_data: send one column "image" holding each image as base64 text')
        given = {"images": frame["image"].tolist()}
    if isinstance(given, dict) and isinstance(given.get("image"), str):
        encoded = [given["image"]]
    elif isinstance(given, dict) and isinstance(given.get("images"), list) and given["images"]:
        encoded = given["images"]
    else:
        raise RequestError('send images as JSON {"images": [base64, ...]} or {"image": base64}')
    files = []
    for i, text in enumerate(encoded):
        try:
            files.append((f"image {i + 1}", base64.b64decode(text, validate=True)))
        except (binascii.Error, TypeError, ValueError):
            raise RequestError(f"image {i + 1}: not base64 text; encode each image's bytes as base64") from None
    return files


def image_inputs(
    model: Model, files: list[tuple[str, bytes]], max_images: int = MAX_IMAGES
) -> tuple[list[bytes], list[str]]:
    """Encoded images and their names, at most `max_images` (the model checks each one's size before decoding it)."""
    if len(files) > max_images:
        raise RequestError(f"{len(files)} images in one request; send at most {max_images}", 413)
    return [data for _, data in files], [name for name, _ in files]


def score_files(model: Model, source: Path, chunk: int) -> list[dict]:
    """Batch scoring of a CSV of rows or a folder (or file) of images, `chunk` inputs at a time."""
    if model.kind == "rows":
        import pandas as pd

        frame = pd.read_csv(source)
        answers = []
        for start in range(0, len(frame), chunk):
            part = frame.iloc[start : start + chunk]
            inputs, names = row_inputs(model, part, lambda i: f"line {i + 2}", chunk)
            answers += model.predict(inputs, names)
        return answers
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    answers = []
    for start in range(0, len(files), chunk):
        part = [(str(path), path.read_bytes()) for path in files[start : start + chunk]]
        answers += model.predict(*image_inputs(model, part, chunk))
    return answers


def main(args: list[str] | None = None) -> None:
    """python -m scripts.score MODEL_DIR INPUT [--output predictions.csv]: batch scoring with the online endpoint's
    model; prints `input,class,probability` as predict does."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m scripts.score", description=main.__doc__)
    parser.add_argument("model_dir", help="an MLflow model folder (AZUREML_MODEL_DIR), e.g. outputs/serving/<name>")
    parser.add_argument("input", help="a CSV of penguins, or a folder (or file) of images")
    parser.add_argument("--output", help="write the CSV here (a folder: predictions.csv in it) instead of stdout")
    parser.add_argument("--chunk", type=int, default=None, help="inputs per batch (default: the request limits)")
    options = parser.parse_args(args)
    source = Path(options.input)
    try:
        if not source.exists():
            raise ModelError(f"{source}: no such file or folder; give a CSV of penguins or a folder of images")
        loaded = load_model(options.model_dir)
        chunk = options.chunk or (MAX_ROWS if loaded.kind == "rows" else MAX_IMAGES)
        answers = score_files(loaded, source, max(1, chunk))
    except (ModelError, RequestError, OSError) as error:
        sys.exit(f"error: {error}")
    text = io.StringIO()
    out = csv.writer(text, lineterminator="\n")  # quotes a name holding a comma, as predict does
    out.writerow(["input", "class", "probability"])
    out.writerows([a["input"], a["class"], f"{a['probability']:.4f}"] for a in answers)
    if options.output:
        target = Path(options.output)
        if target.is_dir() or not target.suffix:
            target = target / "predictions.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.getvalue())
        print(f"wrote {len(answers)} predictions to {target}")
    else:
        print(text.getvalue(), end="")


if __name__ == "__main__":
    main()
