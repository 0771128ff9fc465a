"""The scoring script of every task, with Azure ML's contract: `init()` loads the model once, `run(request)` answers
one request. Azure ML's inference server runs it, locally (`make serve`) and in an online endpoint (scripts.deploy).

    make serve MODEL=models:/penguins-classifier/1     # azmlinfsrv on http://127.0.0.1:5001/score
    curl -s http://127.0.0.1:5001/score -H 'Content-Type: application/json' -d '{"island": "Biscoe",
        "bill_length_mm": 50.4, "bill_depth_mm": 15.3, "flipper_length_mm": 200, "body_mass_g": 5000}'
    curl -s http://127.0.0.1:5001/score -F image=@turkey.jpg -F image=@chicken.png
    python -m scripts.score MODEL_DIR photos/ > predictions.csv    # the same code over a folder or a CSV, in batches

The model is a folder in `AZUREML_MODEL_DIR` (Azure ML mounts the deployment's registered model there; `make serve`
downloads or converts one): the MLflow model `--register_model` writes (scripts/serving/mlflow_model.py): the network
as torch.export's program (`data/model.pt2`), the same network as ONNX (`onnx/model.onnx`), and in its metadata the
class names and `inputs`: how a request is read (`kind`: rows or images), the datamodule class whose
`serving_batch` preprocesses it and the values that needs (penguin scaling and training ranges, the image size).
Nothing here knows a task: any ClassificationDataModule with a serving_kind serves (datamodules/base.py), and an
answer is what `python -m scripts.train predict` prints for the same input (tested).

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
SCORE_BACKEND picks the runtime: `onnxruntime` (the default: faster on CPUs, see the README) or `torch`; SCORE_THREADS
the threads of one request (default: one per core).
"""

from __future__ import annotations

import base64
import binascii
import csv
import importlib
import io
import json
import logging
import os
import sys
from pathlib import Path

import torch

# The server loads this file by its path, from an app root that may be another folder (Azure ML's /var/azureml-app):
# the datamodules it shares the preprocessing with are found from the repository's root.
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from datamodules.base import ClassificationDataModule  # noqa: E402
from datamodules.errors import DataError  # noqa: E402

try:  # the inference server's own request and response types: present where it runs (.venv-serve, Azure ML)
    from azureml_inference_server_http.api.aml_request import rawhttp
    from azureml_inference_server_http.api.aml_response import AMLResponse
except ImportError:  # used as a library: batch scoring, tests
    AMLResponse = None

    def rawhttp(function):
        return function


BACKENDS = ("onnxruntime", "torch")
DEFAULT_BACKEND = "onnxruntime"  # its networks ran 3-10x faster on CPUs (README, Measured; scripts/bench/serve.py)
MAX_ROWS = int(os.environ.get("SCORE_MAX_ROWS", "1000"))  # table rows in one request
MAX_IMAGES = int(os.environ.get("SCORE_MAX_IMAGES", "32"))  # images in one request
MAX_IMAGE_BYTES = int(os.environ.get("SCORE_MAX_IMAGE_BYTES", str(10 * 2**20)))  # one encoded image
MAX_IMAGE_PIXELS = int(os.environ.get("SCORE_MAX_IMAGE_PIXELS", str(40_000_000)))  # one decoded image (40 MP)
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


class Model:
    """The network of an MLflow model folder (pt2 program or ONNX), its class names and its preprocessing."""

    def __init__(self, folder: Path, backend: str = DEFAULT_BACKEND) -> None:
        import yaml

        if backend not in BACKENDS:
            raise ModelError(f"SCORE_BACKEND {backend!r}: give one of {', '.join(BACKENDS)}")
        metadata = (yaml.safe_load((folder / "MLmodel").read_text()) or {}).get("metadata") or {}
        self.folder, self.backend = folder, backend
        self.class_names = list(metadata.get("class_names") or [])
        self.inputs = metadata.get("inputs")
        if not self.class_names or not isinstance(self.inputs, dict) or self.inputs.get("kind") not in KINDS:
            raise ModelError(
                f"{folder}: its MLmodel metadata has no class_names or no inputs of a known kind ({', '.join(KINDS)}); "
                "serve a model that `fit --register_model` (or scripts.serve from a checkpoint) saved"
            )
        self.kind, self.state = self.inputs["kind"], self.inputs.get("state") or {}
        self.datamodule = datamodule_class(folder, self.inputs.get("datamodule"))
        # Threads of one request's computation (0: the library's default, one per core). Several server workers on
        # few cores want fewer: torch's OpenMP threads slow down sharply when the cores are busy (README, Measured).
        threads = int(os.environ.get("SCORE_THREADS", "0"))
        if backend == "onnxruntime":
            import onnxruntime

            path = folder / "onnx" / "model.onnx"
            if not path.is_file():
                raise ModelError(f"{folder}: no onnx/model.onnx in the model; set SCORE_BACKEND=torch")
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads
            self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        else:
            if threads:
                torch.set_num_threads(threads)
            self.program = torch.export.load(folder / "data" / "model.pt2").module()

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.backend == "onnxruntime":
            (logits,) = self.session.run(["logits"], {"input": inputs.numpy()})
            return torch.from_numpy(logits)
        with torch.inference_mode():
            return self.program(inputs)

    def preprocess(self, inputs, names: list[str]) -> torch.Tensor:
        """The datamodule's own preprocessing of raw inputs (a DataFrame of rows, or encoded images)."""
        try:
            return self.datamodule.serving_batch(self.state, inputs, names)
        except DataError as error:
            raise RequestError(str(error)) from None

    def predict(self, inputs: torch.Tensor, names: list[str]) -> list[dict]:
        probabilities = torch.softmax(self.logits(inputs).float(), dim=1)
        answers = []
        for name, row in zip(names, probabilities.tolist()):
            best = max(range(len(row)), key=row.__getitem__)
            answers.append(
                {
                    "input": name,
                    "class": self.class_names[best],
                    "probability": row[best],
                    "probabilities": dict(zip(self.class_names, row)),
                }
            )
        return answers

    def describe(self) -> dict:
        return {
            "classes": self.class_names,
            "inputs": self.kind,
            "datamodule": self.inputs["datamodule"],
            "backend": self.backend,
            "accepts": KINDS[self.kind],
        }


KINDS = {
    "rows": "JSON rows (an object or a list of objects) in the data's column names, or a text/csv body",
    "images": "images: multipart files, one image as the body, or JSON {'images': [base64, ...]}",
}


def datamodule_class(folder: Path, path: str | None) -> type[ClassificationDataModule]:
    """The datamodule class the model's metadata names, whose `serving_batch` preprocesses requests."""
    module, _, name = (path or "").rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name, None) if module else None
    except ImportError as error:
        raise ModelError(
            f"{folder}: its datamodule {path} cannot be imported ({error}); serve it with its code"
        ) from None
    if not (isinstance(found, type) and issubclass(found, ClassificationDataModule)):
        raise ModelError(
            f"{folder}: its metadata names no ClassificationDataModule ({path!r}); save the model again with "
            "`fit --register_model` or scripts.serve from a checkpoint"
        )
    return found


def model_folder(root: Path) -> Path:
    """The MLflow model in `root`: root itself or the one folder below it holding an MLmodel (Azure ML mounts a
    registered model at AZUREML_MODEL_DIR/<its folder name>)."""
    if (root / "MLmodel").is_file():
        return root
    found = sorted(path.parent for path in root.glob("*/MLmodel")) or sorted(root.rglob("MLmodel"))
    if not found:
        raise ModelError(f"{root}: no MLflow model (MLmodel file) in it; give the folder of a registered model")
    return found[0].parent if found[0].name == "MLmodel" else found[0]


def load_model(root: str | Path, backend: str | None = None) -> Model:
    return Model(model_folder(Path(root)), backend or os.environ.get("SCORE_BACKEND", DEFAULT_BACKEND))


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
    except RequestError as error:
        logger.info("refused: %s %s", error.status, error)
        return respond({"message": str(error)}, error.status)
    return respond({"predictions": model.predict(inputs, names)}, 200)


def respond(body: dict, status: int):
    if AMLResponse is not None:
        return AMLResponse(body, status, json_str=True)
    from werkzeug.wrappers import Response

    return Response(json.dumps(body), status=status, mimetype="application/json")


def read_request(model: Model, request) -> tuple[torch.Tensor, list[str]]:
    """The network's inputs (a batch, preprocessed as the datamodule does) and a name for each."""
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


def json_rows(body: bytes) -> list[dict]:
    try:
        rows = json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:
        raise RequestError(f"request body is not valid JSON ({error})") from None
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


def row_inputs(model: Model, rows, row_name, max_rows: int = MAX_ROWS) -> tuple[torch.Tensor, list[str]]:
    """Rows (JSON objects or a CSV's DataFrame) through the datamodule's own reading, checks and scaling; `row_name(i)`
    names the row of index i in messages and answers."""
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame.from_records(rows)
    if len(frame) > max_rows:
        raise RequestError(f"{len(frame)} rows in one request; send at most {max_rows}", 413)
    names = [row_name(index) for index in frame.index]
    return model.preprocess(frame, names), names


def json_images(body: bytes) -> list[tuple[str, bytes]]:
    try:
        given = json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:
        raise RequestError(f"request body is not valid JSON ({error})") from None
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
) -> tuple[torch.Tensor, list[str]]:
    """Encoded images, each checked for size before it is decoded, through the datamodule's own decoding, resizing and
    normalisation."""
    if len(files) > max_images:
        raise RequestError(f"{len(files)} images in one request; send at most {max_images}", 413)
    for name, data in files:
        check_image_size(name, data)
    names = [name for name, _ in files]
    return model.preprocess([data for _, data in files], names), names


def check_image_size(name: str, data: bytes) -> None:
    """Refuses an image too large to decode safely, from its header (a small file can announce a huge image)."""
    if not data:
        raise RequestError(f"{name}: empty file; send the image's bytes")
    if len(data) > MAX_IMAGE_BYTES:
        raise RequestError(f"{name}: {len(data)} bytes; send images of at most {MAX_IMAGE_BYTES} bytes", 413)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as header:  # reads the header only
            width, height = header.size
    except (UnidentifiedImageError, OSError, ValueError):
        return  # not an image PIL knows: decoding says why
    except Image.DecompressionBombError:
        width, height = MAX_IMAGE_PIXELS, 2
    if width * height > MAX_IMAGE_PIXELS:
        raise RequestError(
            f"{name}: {width}x{height} pixels; send images of at most {MAX_IMAGE_PIXELS // 1_000_000} megapixels", 413
        )


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
    """python -m scripts.score MODEL_DIR INPUT [--backend torch] [--output predictions.csv]: batch scoring with the
    online endpoint's code; prints `input,class,probability` as predict does."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m scripts.score", description=main.__doc__)
    parser.add_argument("model_dir", help="an MLflow model folder (AZUREML_MODEL_DIR), e.g. outputs/serving/<name>")
    parser.add_argument("input", help="a CSV of penguins, or a folder (or file) of images")
    parser.add_argument("--backend", choices=BACKENDS, default=os.environ.get("SCORE_BACKEND", DEFAULT_BACKEND))
    parser.add_argument("--output", help="write the CSV here (a folder: predictions.csv in it) instead of stdout")
    parser.add_argument("--chunk", type=int, default=None, help="inputs per batch (default: the request limits)")
    options = parser.parse_args(args)
    source = Path(options.input)
    try:
        if not source.exists():
            raise ModelError(f"{source}: no such file or folder; give a CSV of penguins or a folder of images")
        loaded = load_model(options.model_dir, options.backend)
        chunk = options.chunk or (MAX_ROWS if loaded.kind == "rows" else MAX_IMAGES)
        answers = score_files(loaded, source, max(1, chunk))
    except (ModelError, RequestError, DataError, OSError) as error:
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
