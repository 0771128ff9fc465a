"""A datamodule of the user's own, written as the README's "Add your own dataset" says and defined only here (with its
network, and its torch-free serving preprocessing in tests/serving/fruit_preprocessing.py), trains, registers and serves
with nothing in scripts/ edited: the registry's model and a checkpoint both answer requests, batch scoring and
mlflow.pyfunc in the serving environment (no torch) as `scripts.train predict` answers the same rows."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from datamodules.base import InMemoryDataModule
from scripts.serving.mlflow_model import ExportError, save_model, serving_inputs
from tests.conftest import REPO, run_module
from tests.serving import fruit_preprocessing

pytestmark = pytest.mark.slow


def fruit_table(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Apples (label 0) are lighter and wider than pears (label 1)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(count) % 2
    centre = torch.tensor([[150.0, 75.0], [190.0, 60.0]])[labels]
    return centre + torch.randn(count, 2, generator=generator) * torch.tensor([12.0, 4.0]), labels


class FruitDataModule(InMemoryDataModule):
    """Two measurements -> apple or pear; standardised with the training split's statistics."""

    class_names = ["apple", "pear"]
    serving_kind = "rows"

    def __init__(self, predict_path: str | None = None, batch_size: int = 16, seed: int = 0) -> None:
        super().__init__(batch_size, seed)
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        raw, labels = fruit_table(240, self.seed)
        self.mean, self.std = raw[:160].mean(0), raw[:160].std(0)
        scaled = (raw - self.mean) / self.std
        self.splits = {"train": (scaled[:160], labels[:160]), "val": (scaled[160:200], labels[160:200])}
        self.splits["test"] = (scaled[200:], labels[200:])
        if stage == "predict":
            import pandas as pd

            frame = pd.read_csv(self.hparams.predict_path)
            self.predict_names = [f"line {i + 2}" for i in frame.index]
            self.splits["predict"] = (self.serving_batch(self.serving_state(), frame, self.predict_names),)

    def serving_state(self) -> dict:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    serving_preprocess = staticmethod(fruit_preprocessing.serving_batch)

    @classmethod
    def serving_example(cls):
        import pandas as pd

        return pd.DataFrame({"weight_g": [150.0], "width_mm": [75.0]})


class FruitNet(nn.Sequential):
    def __init__(self, num_classes: int) -> None:
        super().__init__(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, num_classes))


CONFIG = """
seed_everything: 0
trainer:
  max_epochs: 4
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {outputs}
  logger:
    class_path: scripts.training.tracking.BufferedMLFlowLogger
    init_args:
      experiment_name: fruit
model:
  network:
    class_path: tests.serving.test_own_datamodule.FruitNet
  optimizer:
    class_path: torch.optim.Adam
    init_args:
      lr: 0.05
data:
  class_path: tests.serving.test_own_datamodule.FruitDataModule
"""
ROWS = [
    {"weight_g": 140.0, "width_mm": 78.0},
    {"weight_g": 200.0, "width_mm": 58.0},
    {"weight_g": 170.0, "width_mm": 68},
]


def score(model_dir: Path, body: bytes, content_type: str):
    """A request through scripts/score.py's init() and run(), as Azure ML's inference server calls them."""
    from scripts import score

    os.environ["AZUREML_MODEL_DIR"] = str(model_dir)
    try:
        score.init()
    finally:
        del os.environ["AZUREML_MODEL_DIR"]
    request = Request(EnvironBuilder(method="POST", data=body, content_type=content_type).get_environ())
    response = score.run(request)
    return response.status_code, json.loads(response.get_data())


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    return fit_fruit(tmp_path_factory.mktemp("fruit"))


def fit_fruit(folder: Path) -> tuple[Path, Path, Path, list[list[str]]]:
    """The fruit task fitted and registered in `folder`: (folder, best checkpoint, rows CSV, predict's answer lines)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fruit.yaml").write_text(CONFIG.format(outputs=folder / "outputs"))
    rows = folder / "rows.csv"
    rows.write_text("weight_g,width_mm\n" + "".join(f"{row['weight_g']},{row['width_mm']}\n" for row in ROWS))
    fit = run_module("scripts.train", "fit", "--config", folder / "fruit.yaml", "--register_model", "fruit-classifier")
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "registered model: fruit-classifier version 1" in fit.stdout
    assert "Tip:" not in fit.stdout + fit.stderr  # Lightning's advertisements are not the user's to act on
    (checkpoint,) = (folder / "outputs").glob("*/*/checkpoints/best.ckpt")
    predict = run_module("scripts.train", "predict", "--config", folder / "fruit.yaml", "--ckpt_path", checkpoint,
                         "--data.init_args.predict_path", rows)  # fmt: skip
    assert predict.returncode == 0, predict.stderr[-3000:]
    answers = [line.split(",") for line in predict.stdout.splitlines()[-len(ROWS) :]]
    return folder, checkpoint, rows, answers


def check_answers(predictions: list[dict], answers: list[list[str]]) -> None:
    assert [p["class"] for p in predictions] == [answer[1] for answer in answers]
    for prediction, answer in zip(predictions, answers):
        assert prediction["probability"] == pytest.approx(float(answer[2]), abs=1e-4)
    assert {answer[1] for answer in answers} == {"apple", "pear"}  # it learned something


def test_the_registered_model_of_an_own_datamodule_serves_as_predict_answers(fitted, tmp_path, monkeypatch):
    from scripts.serve import model_dir

    folder, _, _, answers = fitted
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'outputs' / 'mlflow.db'}")
    served = model_dir("models:/fruit-classifier/1", tmp_path / "serving")
    status, body = score(served, json.dumps(ROWS).encode(), "application/json")
    assert status == 200, body
    check_answers(body["predictions"], answers)
    assert [p["input"] for p in body["predictions"]] == ["row 1", "row 2", "row 3"]
    status, body = score(served, json.dumps([{"weight_g": 150}]).encode(), "application/json")
    assert (status, body["message"]) == (400, "request: no column width_mm; send weight_g, width_mm")


def test_a_checkpoint_of_an_own_datamodule_serves_and_batch_scores_as_predict_answers(fitted, tmp_path):
    from scripts.serve import from_checkpoint

    _, checkpoint, rows, answers = fitted
    served = from_checkpoint(checkpoint, tmp_path / "model")
    status, body = score(served, rows.read_bytes(), "text/csv")
    assert status == 200, body
    check_answers(body["predictions"], answers)
    scored = run_module("scripts.score", served, rows)
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert [line.split(",")[:2] for line in scored.stdout.splitlines()[1:]] == [a[:2] for a in answers]


def test_a_checkpoint_of_an_own_datamodule_serves_with_mlflow_pyfunc_where_there_is_no_torch(fitted, tmp_path):
    from scripts.serve import from_checkpoint

    serve_python = REPO / ".venv-serve" / "bin" / "python"
    if not serve_python.is_file():
        pytest.skip("needs .venv-serve: `make serve-env` (.ci/run builds it)")
    _, checkpoint, rows, answers = fitted
    served = from_checkpoint(checkpoint, tmp_path / "model")
    script = (
        "import json, sys, mlflow.pyfunc, pandas as pd; "
        "answer = mlflow.pyfunc.load_model(sys.argv[1]).predict(pd.read_csv(sys.argv[2])); "
        "print(json.dumps(['torch' in sys.modules, answer['class'].tolist(), answer['probability'].tolist()]))"
    )
    done = subprocess.run([serve_python, "-c", script, served, rows], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    torch_loaded, classes, probabilities = json.loads(done.stdout.strip().splitlines()[-1])
    assert torch_loaded is False and classes == [answer[1] for answer in answers]
    assert probabilities == pytest.approx([float(answer[2]) for answer in answers], abs=1e-4)


def preprocess_with_torch(state: dict, inputs, names: list[str]):
    return torch.tensor(inputs.to_numpy(dtype="float32")).numpy()


class TorchPreprocessingDataModule(FruitDataModule):
    serving_preprocess = staticmethod(preprocess_with_torch)


def test_serving_preprocessing_that_imports_torch_is_refused_naming_its_module(tmp_path):
    data = TorchPreprocessingDataModule()
    data.setup("fit")
    with pytest.raises(ExportError) as error:
        save_model(FruitNet(2), torch.randn(4, 2), ["apple", "pear"], tmp_path / "model", serving_inputs(data))
    assert str(error.value).startswith(f"{Path(__file__)}: imports torch, which the registered model's environment")
    assert not (tmp_path / "model").exists()


def test_a_batch_deployment_scores_an_own_datamodules_rows_as_predict_answers(fitted, tmp_path):
    """Azure ML's batch driver calls init() then run(mini_batch) of scripts/serving/batch_score.py: the same model."""
    from scripts.serve import from_checkpoint
    from scripts.serving import batch_score

    _, checkpoint, rows, answers = fitted
    batch_score.init(str(from_checkpoint(checkpoint, tmp_path / "model")))
    scored = batch_score.run([str(rows)])
    assert list(scored["file"]) == [rows.name] * len(answers) and list(scored["row"]) == list(range(len(answers)))
    check_answers(scored.to_dict("records"), answers)
