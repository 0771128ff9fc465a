"""scripts/score.py and the registered pyfunc as libraries, in this process (no server): a small network saved as
`--register_model` saves it, what each answers, and what they refuse."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from datamodules.mnist import MNISTDataModule
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
