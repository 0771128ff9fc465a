"""scripts/score.py as a library, in this process (no server): the model folder it serves and what it refuses."""

from __future__ import annotations

import pytest
import torch

from scripts.score import Model, ModelError, load_model
from scripts.serving.mlflow_model import save_model

INPUTS = {"kind": "images", "datamodule": "datamodules.mnist.MNISTDataModule", "state": {}}


def network() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))


def test_a_network_onnx_cannot_express_is_saved_without_it_and_serves_with_torch(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise RuntimeError("an operator ONNX has not")

    monkeypatch.setattr("scripts.serving.mlflow_model.write_onnx", refuse)
    save_model(network(), torch.randn(4, 1, 28, 28), [str(d) for d in range(10)], tmp_path / "1" / "model", INPUTS)
    assert "warning: the model is saved without ONNX (an operator ONNX has not)" in capsys.readouterr().err
    assert not (tmp_path / "1" / "model" / "onnx").exists()
    model = load_model(tmp_path / "1", "torch")  # AZUREML_MODEL_DIR: the model's folder is below it
    assert model.predict(torch.randn(2, 1, 28, 28), ["a", "b"])[1]["input"] == "b"
    with pytest.raises(ModelError, match="no onnx/model.onnx in the model; set SCORE_BACKEND=torch"):
        load_model(tmp_path / "1", "onnxruntime")


def test_both_backends_answer_alike_and_a_model_without_inputs_is_refused(tmp_path):
    save_model(network(), torch.randn(4, 1, 28, 28), [str(d) for d in range(10)], tmp_path / "digits", INPUTS)
    inputs = torch.randn(3, 1, 28, 28)
    torch_answers = load_model(tmp_path / "digits", "torch").predict(inputs, ["a", "b", "c"])
    onnx_answers = load_model(tmp_path / "digits", "onnxruntime").predict(inputs, ["a", "b", "c"])
    for mine, theirs in zip(torch_answers, onnx_answers):
        assert mine["class"] == theirs["class"] and abs(mine["probability"] - theirs["probability"]) < 1e-5
    save_model(network(), torch.randn(4, 1, 28, 28), [str(d) for d in range(10)], tmp_path / "mine")  # no inputs
    with pytest.raises(ModelError, match="no class_names or no inputs of a known kind"):
        Model(tmp_path / "mine", "torch")
    with pytest.raises(ModelError, match="SCORE_BACKEND 'tensorrt': give one of onnxruntime, torch"):
        Model(tmp_path / "digits", "tensorrt")
    with pytest.raises(ModelError, match="no MLflow model"):
        load_model(tmp_path / "nothing-here", "torch")
