"""The registered model's own code: an MLflow pyfunc (python_function flavour) that turns raw inputs into a class and
every class's probability with ONNX Runtime, numpy, pandas and Pillow; it imports neither torch nor Lightning.
scripts/serving/mlflow_model.py saves it with this file and the datamodule's torch-free preprocessing inside (MLflow's
code_paths), so the model runs wherever its requirements are installed (.venv-serve, `make serve-env`).

    python -c "import mlflow, pandas as pd; print(mlflow.pyfunc.load_model('models:/penguins-classifier/1').predict(
        pd.DataFrame({'island': ['Biscoe'], 'bill_length_mm': [50.4], 'bill_depth_mm': [15.3],
                      'flipper_length_mm': [200], 'body_mass_g': [5000]})))"

Input: rows tasks: a DataFrame in the datamodule's column names (penguins: either CSV schema's); image tasks: a
DataFrame with one column `image` holding each image's bytes or base64 text. Output: a DataFrame, one row per input in
order: `class`, `probability` (the class's), then `probability_<class>` for every class. A bad input raises InputError
(an MlflowException and a ValueError) whose one-line message names the row or image and what to send; so does a batch
of none (`mlflow models serve` answered `{"dataframe_split": {..., "data": []}}` 200 with no predictions, where the
scoring script, predict and batch scoring refuse an empty request or file).
"""

from __future__ import annotations

import base64
import binascii
import importlib
import os
import re

import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import BAD_REQUEST
from mlflow.pyfunc import PythonModel

IMAGE_COLUMN = "image"
KINDS = ("rows", "images")
# Images decoded, cropped and run through the network this many at a time: its input and activations grow with the
# batch (docs/measured.md, Serving), and a caller may hand over thousands at once (a request to `mlflow models serve`,
# which limits neither body nor batch; a spark_udf Arrow batch of up to 10,000 rows; an Azure ML batch mini-batch).
# 32: the scoring script's largest request, one run.
IMAGES_PER_RUN = 32


class InputError(MlflowException, ValueError):
    """An input the model cannot answer; the message names it and what to send. `oversize`: an image too large (the
    scoring script answers 413 rather than 400)."""

    def __init__(self, message: str, oversize: bool = False) -> None:
        super().__init__(message, error_code=BAD_REQUEST)
        self.oversize = oversize


def preprocess_function(path: str):
    """The function `module:name` (a datamodule's serving_preprocess) imported from the model's code."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


class ClassifierModel(PythonModel):
    """The pyfunc: its model_config (written by mlflow_model.save_model) holds the class names, the input kind, the
    preprocessing function and its state; its artifact `onnx` is the network."""

    def load_context(self, context) -> None:
        config = context.model_config
        self.class_names = list(config["class_names"])
        self.kind, self.state = config["kind"], config.get("state") or {}
        self.preprocess = preprocess_function(config["preprocess"])
        import onnxruntime

        options = onnxruntime.SessionOptions()
        # Threads of one batch (0: one per core). Several server workers on few cores want fewer.
        options.intra_op_num_threads = int(os.environ.get("SCORE_THREADS", "0"))
        self.session = onnxruntime.InferenceSession(
            context.artifacts["onnx"], options, providers=["CPUExecutionProvider"]
        )

    # model_input's hint, pd.DataFrame, is one MLflow infers no schema from (the signature is the datamodule's) and
    # validates nothing by; without one MLflow warned, at every load of the model, to add one (past any filter).
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        return self.answer(model_input)

    def answer(self, inputs, names: list[str] | None = None) -> pd.DataFrame:
        """The output DataFrame for `inputs` (a DataFrame, or for images a list of encoded images); `names` names each
        input in messages (default: row i / image i, counted from 1)."""
        if self.kind == "images" and not isinstance(inputs, list):
            inputs = image_bytes(as_frame(inputs, "images"))
        elif self.kind == "rows":
            inputs = as_frame(inputs, "rows").reset_index(drop=True)
        noun = "row" if self.kind == "rows" else "image"
        names = names or [f"{noun} {i + 1}" for i in range(len(inputs))]
        if self.kind == "rows" and len(inputs.columns) == 0:
            # MLflow's check of the signature keeps only the columns it names: rows of none of them (a list of lists,
            # every name misspelt, {}) come as a frame of no columns and no rows, which is no empty batch.
            self.probabilities(inputs, names)  # the preprocessing's own message, naming the columns it needs
            raise InputError("no column the model reads; send rows in the data's column names")
        if len(inputs) == 0:  # a client's empty list, refused as every runtime refuses it: no answer passes for one
            raise InputError(f"request: no {noun}s in it; send at least one {noun}")
        if self.kind == "images":
            from datamodules.errors import DataError
            from datamodules.preprocessing.images import OversizeImage, check_size

            for name, data in zip(names, inputs):
                try:
                    check_size(name, data)
                except DataError as error:
                    raise InputError(str(error), isinstance(error, OversizeImage)) from None
        probabilities = self.probabilities(inputs, names)
        best = probabilities.argmax(axis=1)
        frame = pd.DataFrame(
            {
                "class": [self.class_names[i] for i in best],
                "probability": probabilities[np.arange(len(best)), best].astype(np.float64),
            }
        )
        for i, name in enumerate(self.class_names):
            frame[f"probability_{name}"] = probabilities[:, i].astype(np.float64)
        return frame

    def probabilities(self, inputs, names: list[str]) -> np.ndarray:
        if self.kind != "images" or len(inputs) <= IMAGES_PER_RUN:
            return self.run(inputs, names)
        chunks = range(0, len(inputs), IMAGES_PER_RUN)
        return np.concatenate([self.run(inputs[i : i + IMAGES_PER_RUN], names[i : i + IMAGES_PER_RUN]) for i in chunks])

    def run(self, inputs, names: list[str]) -> np.ndarray:
        """Each input's class probabilities, preprocessed and run as one batch."""
        from datamodules.errors import DataError

        try:
            batch = self.preprocess(self.state, inputs, names)
        except DataError as error:
            raise InputError(str(error)) from None
        (logits,) = self.session.run(["logits"], {"input": np.ascontiguousarray(batch, dtype=np.float32)})
        return softmax(logits.astype(np.float32))


def as_frame(inputs, kind: str) -> pd.DataFrame:
    """`inputs` as a DataFrame: one already, or what pandas makes of a dict of columns or a list of rows."""
    if isinstance(inputs, pd.DataFrame):
        return inputs
    try:
        return pd.DataFrame(inputs)
    except (ValueError, TypeError):
        what = "rows in the data's column names" if kind == "rows" else f"one column {IMAGE_COLUMN!r}"
        raise InputError(f"inputs of type {type(inputs).__name__}: send a pandas DataFrame of {what}") from None


# Base64 text, perhaps in lines or URL-safe: no image file is that (each format's header or sizes hold other bytes).
BASE64_TEXT = re.compile(rb"[A-Za-z0-9+/_\-\s]+=?=?\s*")
URL_SAFE = str.maketrans("-_", "+/")  # RFC 4648's URL-safe alphabet (urlsafe_b64encode, base64url)
# What a browser's FileReader.readAsDataURL (and a canvas's toDataURL) puts before an image's base64.
DATA_URL = re.compile(r"\s*data:[\w.+-]+/[\w.+-]+(;[\w.+-]+=[\w.+-]+)*;base64,", re.IGNORECASE)


def base64_image(text: str | bytes) -> bytes:
    """The bytes of an image as base64 text: in one line or in MIME's lines of 76 characters (`base64 photo.jpg`,
    encodebytes), or as a data URL (`data:image/jpeg;base64,...`: a web page's FileReader, which was refused as not
    base64 text), in the URL-safe alphabet too, its padding left out or not (RFC 4648 lets a client drop it).
    binascii.Error (a ValueError) when it is not base64."""
    text = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    if found := DATA_URL.match(text):
        text = text[found.end() :]
    text = "".join(text.split()).translate(URL_SAFE)
    if not text.endswith("="):
        text += "=" * (-len(text) % 4)
    return base64.b64decode(text, validate=True)


def undone_base64(data: bytes) -> bytes:
    """`data`, or what it encodes when it is base64 text: `mlflow models serve` hands on the base64 of an `inputs` or
    `instances` request's binary column as the text's bytes, undecoded (its dataframe_split and dataframe_records are
    decoded), and the image was refused as 'not a readable image'."""
    if BASE64_TEXT.fullmatch(data) or DATA_URL.match(data[:200].decode("ascii", "replace")):
        try:
            return base64_image(data)
        except binascii.Error:
            pass
    return data


def image_bytes(frame: pd.DataFrame) -> list[bytes]:
    """The encoded images of a DataFrame's `image` column: bytes as they are, text as base64."""
    if IMAGE_COLUMN not in frame.columns:
        given = ", ".join(map(str, frame.columns)) or "none"
        raise InputError(
            f"no column {IMAGE_COLUMN!r} (columns: {given}); send one column {IMAGE_COLUMN!r} holding each image's "
            "bytes or base64 text"
        )
    images = []
    for i, value in enumerate(frame[IMAGE_COLUMN].tolist()):
        if isinstance(value, bytes | bytearray | memoryview):
            images.append(undone_base64(bytes(value)))
        elif isinstance(value, str):
            try:
                images.append(base64_image(value))
            except (binascii.Error, ValueError):
                raise InputError(f"image {i + 1}: not base64 text; encode each image's bytes as base64") from None
        else:
            raise InputError(
                f"image {i + 1}: a {type(value).__name__}, not an image; send each image's bytes or base64 text"
            )
    return images
