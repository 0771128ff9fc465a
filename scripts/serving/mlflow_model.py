"""The registered model: a network saved as an MLflow model (torch.export's program, the same network as ONNX checked
against PyTorch, the class names and the datamodule's serving preprocessing in its metadata), and its registration.
scripts.train registers the best checkpoint with it, scripts.export and scripts.serve write the same files.

    python -m scripts.train fit --config configs/penguins.yaml --register_model penguins-classifier
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

from datamodules.base import ClassificationDataModule
from datamodules.errors import DataError

TOLERANCE = 1e-4  # float32 kernels of ONNX Runtime and PyTorch differ around 1e-6 on these nets


class ExportError(Exception):
    """A bad checkpoint, output path or export; the message names the file and what to do."""


def test_inputs(datamodule: ClassificationDataModule, batches: int) -> list[torch.Tensor]:
    """The network's inputs of the first `batches` test batches, after the hooks a Trainer would run."""
    datamodule.prepare_data()
    datamodule.setup("test")
    inputs = []
    for batch in itertools.islice(datamodule.test_dataloader(), batches):
        batch = datamodule.on_after_batch_transfer(datamodule.on_before_batch_transfer(batch, 0), 0)
        inputs.append(batch[0])
    if not inputs:
        raise DataError(f"{type(datamodule).__name__}: the test split is empty; nothing to check the export on")
    return inputs


def write_onnx(network: torch.nn.Module, inputs: list[torch.Tensor], target: Path, opset: int = 18) -> float:
    """Writes `network` (in eval mode) as ONNX at `target` and returns the largest |onnx - torch| over `inputs` and a
    batch of another size; raises ExportError above TOLERANCE, leaving an earlier file at `target` in place. Used by
    `export` and by scripts.training.tracking.save_model (the ONNX file of a registered model)."""
    import onnxruntime

    example = inputs[0]
    if len(example) < 2:
        example = torch.cat([example, example])  # torch.export takes a size-1 dimension for a constant
    # Another batch size than the exported one: ONNX Runtime rejects it unless the batch axis is dynamic.
    inputs = [*inputs, example[: len(example) // 2]]
    # The dynamo exporter (torch.export + onnxscript, the default since torch 2.9) handles every network here
    # with onnxscript 0.7.2; the TorchScript one (dynamo=False) works too but is deprecated. Weights stay
    # inside the one file (external_data=False: the nets are far below ONNX's 2 GB limit). Written beside the
    # target first, so a failed export or check leaves an earlier good file in place.
    part = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.onnx.export(
            network,
            (example,),
            part,
            input_names=["input"],
            output_names=["logits"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            opset_version=opset,
            external_data=False,
            dynamo=True,
            verbose=False,
        )
        session = onnxruntime.InferenceSession(part, providers=["CPUExecutionProvider"])
        differences = []
        with torch.no_grad():
            for batch in inputs:
                (logits,) = session.run(["logits"], {"input": batch.numpy()})
                differences.append((torch.from_numpy(logits) - network(batch)).abs().max())
        difference = torch.stack(differences).max().item()  # torch's max keeps a NaN, Python's may drop it
        sizes = ", ".join(str(len(batch)) for batch in inputs)
        if not difference <= TOLERANCE:  # `not <=` so that NaN fails too
            raise ExportError(
                f"{target}: ONNX Runtime's logits differ from PyTorch's by {difference:.1e} > {TOLERANCE:.0e} "
                f"(batch sizes {sizes}); nothing written. Try another --opset"
            )
        part.replace(target)
    finally:
        part.unlink(missing_ok=True)
    return difference


def serving_inputs(datamodule: ClassificationDataModule) -> dict | None:
    """The `inputs` of a saved model's metadata: how the scoring script reads a request (`kind`), the datamodule
    whose `serving_batch` preprocesses it and the values it needs (`state`); None for a datamodule without a
    serving_kind (the model is saved all the same, and cannot be served)."""
    kind = type(datamodule).serving_kind
    if kind is None:
        return None
    datamodule_class = type(datamodule)
    path = f"{datamodule_class.__module__}.{datamodule_class.__qualname__}"
    # A datamodule built from a checkpoint has the state its network was trained with, and perhaps no data.
    state = getattr(datamodule, "checkpoint_serving_state", None)
    return {"kind": kind, "datamodule": path, "state": state if state is not None else datamodule.serving_state()}


def save_model(
    network: torch.nn.Module,
    example: torch.Tensor,
    class_names: list[str],
    folder: str | Path,
    inputs: dict | None = None,
) -> None:
    """Saves `network` as an MLflow model in `folder`: torch.export's program (MLflow's pt2 format), which loads with
    torch alone, without this repository's code, and takes any batch size; the same network as ONNX in
    `onnx/model.onnx` (checked against PyTorch on `example`, as scripts.export does; a network the ONNX exporter cannot
    express is saved without it, with a warning, and serves with the torch backend); in its metadata the class names
    (index i for logit i) and `inputs` (`serving_inputs`), what the scoring script needs to preprocess
    a request as the datamodule does (penguin scaling statistics and training ranges, the image size)."""
    import mlflow
    from mlflow.models import infer_signature

    network, example = network.eval().cpu(), example[:8].cpu()
    with torch.no_grad():
        logits = network(example)
    metadata = {"class_names": list(class_names)}
    if inputs is not None:
        metadata["inputs"] = inputs
    mlflow.pytorch.save_model(
        network,
        str(folder),
        signature=infer_signature(example.numpy(), logits.numpy()),
        input_example=example.numpy(),
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],  # what loading a pt2 program needs
        metadata=metadata,
    )
    try:
        write_onnx(network, [example], Path(folder) / "onnx" / "model.onnx")
    except Exception as error:  # the exporter's many types: a network ONNX cannot express still registers, as pt2
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"warning: the model is saved without ONNX ({reason}); serve it with --backend torch", file=sys.stderr)


def register_model(
    tracking_uri: str,
    run_id: str,
    network: torch.nn.Module,
    example: torch.Tensor,
    class_names: list[str],
    name: str,
    inputs: dict | None = None,
) -> str:
    """Saves `network` as an MLflow model (`save_model`) in the run's artifacts (`model/`) and registers it as a new
    version of `name`; returns the version.

    It is saved locally and uploaded as plain artifacts, not with `log_model`: MLflow 3's `log_model` creates a
    "logged model" through REST routes that Azure ML's tracking does not serve (404). Inside Azure ML the registry is
    the workspace's, and `python -m scripts.deploy` serves a version of it from an online endpoint.

        python -m scripts.train fit --config configs/penguins.yaml --register_model penguins-classifier
    """
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        save_model(network, example, class_names, f"{folder}/model", inputs)
        return register_folder(tracking_uri, run_id, f"{folder}/model", name)


def register_folder(tracking_uri: str, run_id: str, folder: str | Path, name: str) -> str:
    """Logs a saved model folder as the run's `model/` artifacts and registers it as a new version of `name`; returns
    the version. register_model, and an Azure ML pipeline's register step (a train step's model output), use it."""
    import mlflow
    from mlflow import MlflowClient

    MlflowClient(tracking_uri).log_artifacts(run_id, str(folder), "model")
    mlflow.set_tracking_uri(tracking_uri)  # register_model's client, and the registry's, follow it
    try:
        version = mlflow.register_model(f"runs:/{run_id}/model", name)
    finally:
        mlflow.set_tracking_uri(None)
    return str(version.version)
