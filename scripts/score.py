"""The scoring script of every task, with Azure ML's contract: `init()` loads the model once, `run(request)` answers
one request; Azure ML's inference server runs it, locally (`make serve`) and in an online endpoint (scripts.deploy).
A thin wrapper over the registered pyfunc model (scripts/serving/pyfunc_model.py) that adds the HTTP contract: the
requests it takes, its answers, its 4xx and its SCORE_* limits are in docs/serving.md. It imports neither torch nor
Lightning: it runs in the serving environment (.venv-serve).

    make serve MODEL=models:/penguins-classifier/1     # azmlinfsrv on http://127.0.0.1:5001/score
    curl -s http://127.0.0.1:5001/score -F image=@turkey.jpg -F image=@chicken.png
    python -m scripts.score MODEL_DIR photos/ > predictions.csv    # the same model over a folder or a CSV, in batches
"""

from __future__ import annotations

import importlib.util
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
    if __name__ == "__main__":  # batch scoring: no server, and no Flask import to wait for
        raise ImportError
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
# The largest rows request read: MAX_ROWS rows of generous width (a penguin row is ~100 bytes of JSON), so that a body
# of hundreds of MB gets the row limit's 413 without being read whole.
MAX_ROW_BYTES = int(os.environ.get("SCORE_MAX_ROW_BYTES", "2048"))
MAX_ROWS_BODY_BYTES = MAX_ROWS * MAX_ROW_BYTES + 2**16
IMAGE_TYPES = ("image/", "application/octet-stream")
FORM = "application/x-www-form-urlencoded"  # what `curl -d` and `--data-binary` send unless told: taken as the body

logger = logging.getLogger("azmlinfsrv.score")  # the server's logger: its lines land in the endpoint's logs
model: Model | None = None


def request_bodies():
    """scripts/serving/request_bodies.py, loaded by its path once, under the name its `repo_module` gives it (the
    server puts the model's own copy of `scripts` first on sys.path: see there)."""
    name = "_score_scripts_serving_request_bodies"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "serving" / "request_bodies.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


bodies = request_bodies()
RequestError, repo_module = bodies.RequestError, bodies.repo_module


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
        # The columns the model reads (others it ignores): its signature's, or for a model that checks its columns
        # itself (a table's, saved without an input schema) its metadata's.
        schema = self.pyfunc.metadata.get_input_schema()
        self.columns = set(schema.input_names()) if schema is not None and schema.has_input_names() else None
        if self.columns is None and isinstance((self.pyfunc.metadata.metadata or {}).get("columns"), dict):
            self.columns = set(self.pyfunc.metadata.metadata["columns"])
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
    mimetype = (request.mimetype or "").lower()
    if model.kind == "rows":
        limit = MAX_ROWS_BODY_BYTES
        too_large = (
            f"send at most {MAX_ROWS} rows (SCORE_MAX_ROWS) of at most {MAX_ROW_BYTES} bytes each (SCORE_MAX_ROW_BYTES)"
        )
    else:
        limit = MAX_BODY_BYTES
        too_large = f"send at most {MAX_IMAGES} images (SCORE_MAX_IMAGES) of at most {MAX_IMAGE_BYTES} bytes each"
        too_large += " (SCORE_MAX_IMAGE_BYTES)"
    length = request.content_length
    if length is not None and length > limit:
        raise RequestError(f"request body of {length} bytes is too large; {too_large}", 413)
    if model.kind == "rows":
        if mimetype in ("text/csv", "application/csv"):
            rows = bodies.csv_rows(bodies.body_of(request, limit, too_large), "request body", MAX_ROWS)
            if rows.empty:  # as JSON's [] is refused: an answer of no predictions would look like one
                raise RequestError("request body has a CSV header and no rows; send one row a line below it")
            return row_inputs(model, rows, lambda i: f"line {i + 2}")
        if mimetype not in ("application/json", "", FORM):
            raise RequestError(f"Content-Type {mimetype}: send rows as application/json (or text/csv)", 415)
        rows = bodies.json_rows(bodies.body_of(request, limit, too_large), model.columns, MAX_ROWS)
        return row_inputs(model, rows, lambda i: f"row {i + 1}")
    if mimetype == "multipart/form-data":
        files = bodies.form_files(request, limit, too_large)
        if not files:
            raise RequestError("multipart request without files: send each image as a file (curl -F image=@a.jpg)")
    elif mimetype == "application/json":
        files = bodies.json_images(bodies.body_of(request, limit, too_large))
    elif mimetype.startswith(IMAGE_TYPES) or mimetype in ("", FORM):
        files = [("image 1", bodies.body_of(request, limit, too_large))]
    else:
        raise RequestError(f"Content-Type {mimetype}: send images as multipart files, image/* or JSON base64", 415)
    return image_inputs(model, files)


def row_inputs(model: Model, rows, row_name, max_rows: int = MAX_ROWS) -> tuple[object, list[str]]:
    """Rows (JSON objects or a CSV's DataFrame) as a DataFrame, at most `max_rows`; `row_name(i)` names the row of
    index i in messages and answers."""
    import pandas as pd

    # pd.DataFrame, not from_records: that makes no row of an object with no fields ({} answered with no prediction)
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    if len(frame) > max_rows:
        raise RequestError(f"{len(frame)} rows in one request; send at most {max_rows}", 413)
    return frame, [row_name(index) for index in frame.index]


def image_inputs(
    model: Model, files: list[tuple[str, bytes]], max_images: int = MAX_IMAGES
) -> tuple[list[bytes], list[str]]:
    """Encoded images and their names, at most `max_images` (the model checks each one's size before decoding it)."""
    if len(files) > max_images:
        raise RequestError(f"{len(files)} images in one request; send at most {max_images}", 413)
    return [data for _, data in files], [name for name, _ in files]


def image_files(source: Path) -> list[Path]:
    """The files of a folder at any depth, sorted, as predict reads a folder (datamodules/image_folder.py): the files
    it leaves out left out (.DS_Store, ._x, __MACOSX, Thumbs.db, desktop.ini: `ignored` of
    datamodules/preprocessing/images.py), linked folders followed."""
    if source.is_file():
        return [source]
    ignored = repo_module("datamodules/preprocessing/images.py").ignored
    found = []
    for top, folders, names in os.walk(source, followlinks=True):
        folders[:] = sorted(name for name in folders if not ignored(name))
        found += [Path(top) / name for name in names if not ignored(name) and (Path(top) / name).is_file()]
    return sorted(found)


def score_files(model: Model, source: Path, chunk: int, skipped: list[str] | None = None) -> list[dict]:
    """Batch scoring of a CSV of rows or a folder (or file) of images, `chunk` inputs at a time. An image the model
    refuses is left out, its line added to `skipped`, and the rest scored."""
    if model.kind == "rows":
        if not source.is_file():
            raise RequestError(f"{source}: a folder; this model scores rows: give a CSV file of them")
        frame = bodies.csv_rows(source.read_bytes(), str(source), max_rows=None)
        if frame.empty:  # as a request's CSV and predict's: no predictions and exit 0 would look like a scored file
            raise RequestError(f"{source}: a CSV header and no rows; put one row a line below it")
        frame = complete_rows(model, frame, source, skipped)
        answers = []
        for start in range(0, len(frame), chunk):
            part = frame.iloc[start : start + chunk]
            inputs, names = row_inputs(model, part, lambda i: f"line {i + 2}", chunk)
            answers += model.predict(inputs, names)
        return answers
    files = image_files(source)
    if not files:
        raise RequestError(f"{source}: no files in it; give a folder of images")
    answers = []
    for start in range(0, len(files), chunk):
        part = [(str(path), path.read_bytes()) for path in files[start : start + chunk]]
        while part:
            try:
                answers += model.predict(*image_inputs(model, part, chunk))
                break
            except RequestError as error:  # names its image first: leave that one out, score the others
                bad = next((i for i, (name, _) in enumerate(part) if str(error).startswith(f"{name}:")), None)
                if bad is None or skipped is None:
                    raise
                skipped.append(f"skipped {error}")
                del part[bad]
    if not answers:
        raise RequestError(f"{source}: no image could be scored ({skipped[-1][len('skipped ') :]})")
    return answers


def complete_rows(model: Model, frame, source: Path, skipped: list[str] | None):
    """The CSV's rows with a value in every column the model reads; each other row named in `skipped` by its line,
    in predict's words (a batch answers the rest, as predict does; a request's incomplete row is refused instead)."""
    read = [column for column in frame.columns if model.columns is None or column in model.columns]
    gaps = frame[read].isna()
    lacking = gaps.any(axis=1)
    # A model whose preprocessing fills empty cells by a policy (the table task's) answers incomplete rows too.
    if skipped is None or not read or not lacking.any() or model.python_model.state.get("fills_missing_cells"):
        return frame
    for index in frame.index[lacking]:
        missing = ", ".join(column for column in read if gaps.loc[index, column])
        skipped.append(f"{source}: line {index + 2} has no {missing}: skipped, no answer for it")
    if lacking.all():
        raise RequestError(f"{source}: no row has all of {', '.join(read)}; fill in the empty cells")
    return frame[~lacking]


def writable(target: Path) -> Path:
    """The CSV file `--output` names (a folder: predictions.csv in it), checked before scoring starts."""
    if target.is_dir() or not target.suffix:
        target = target / "predictions.csv"
    folder = next((p for p in [target.parent, *target.parent.parents] if p.exists()), Path("."))
    if target.is_dir() or not folder.is_dir() or not os.access(folder if not target.exists() else target, os.W_OK):
        raise ModelError(f"--output {target}: cannot be written here; give a path in a folder you can write to")
    return target


CHUNKS = {"rows": 100_000, "images": 256}  # the most inputs of one batch: 256 images of 10 MB fit a laptop's memory


def main(args: list[str] | None = None) -> None:
    """python -m scripts.score MODEL_DIR INPUT [--output predictions.csv]: batch scoring with the online endpoint's
    model; prints `input,class,probability` as predict does."""
    import argparse

    from datamodules.printable import printable_name  # before the model's code_paths (its own datamodules) come first
    from scripts.serving.csv_output import csv_text, write_whole

    parser = argparse.ArgumentParser(prog="python -m scripts.score", description=main.__doc__)
    parser.add_argument("model_dir", help="an MLflow model folder (AZUREML_MODEL_DIR), e.g. outputs/serving/<name>")
    parser.add_argument("input", help="a CSV of rows, or a folder (or file) of images")
    parser.add_argument("--output", help="write the CSV here (a folder: predictions.csv in it) instead of stdout")
    parser.add_argument("--chunk", type=int, default=None, help="inputs per batch (default: the request limits)")
    options = parser.parse_args(args)
    source = Path(options.input)
    skipped: list[str] = []
    try:
        if not source.exists():
            raise ModelError(f"{source}: no such file or folder; give a CSV of rows or a folder of images")
        target = writable(Path(options.output)) if options.output else None
        loaded = load_model(options.model_dir)
        most = CHUNKS[loaded.kind]
        if options.chunk is not None and not 1 <= options.chunk <= most:
            raise ModelError(f"--chunk {options.chunk}: give 1 to {most} {loaded.kind} per batch")
        chunk = options.chunk or (MAX_ROWS if loaded.kind == "rows" else MAX_IMAGES)
        answers = score_files(loaded, source, chunk, skipped)
    except (ModelError, RequestError) as error:
        sys.exit(f"error: {printable_name(str(error))}")
    except OSError as error:
        sys.exit(f"error: {printable_name(str(error.filename or source))}: {error.strerror or error}")
    for line in skipped:
        print(printable_name(line), file=sys.stderr)
    rows = [[a["input"], a["class"], f"{a['probability']:.4f}"] for a in answers]
    text = csv_text([["input", "class", "probability"], *rows])  # quoted as predict quotes: csv_output
    if target is not None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_whole(target, text)
        except OSError as error:
            where = printable_name(str(target))
            sys.exit(f"error: --output {where}: cannot be written ({error.strerror or error}); give another path")
        print(f"wrote {len(answers)} predictions to {printable_name(str(target))}")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
