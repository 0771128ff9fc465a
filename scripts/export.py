"""Write a checkpoint's network as ONNX, then check that ONNX Runtime gives PyTorch's logits on real test inputs.

    python -m scripts.export outputs/<exp>/<run>/checkpoints/best.ckpt
    python -m scripts.export CKPT --output model.onnx --batches 3 --opset 18

Works for any checkpoint of `python -m scripts.train fit`: the module and the datamodule are both rebuilt from
it, and the inputs are what the network sees in testing, the first test batches after the datamodule's
batch hooks (so normalisation is part of the inputs, not of the ONNX graph). The graph holds `model.network` in
eval mode, input "input", output "logits", a dynamic batch axis. The check runs the first `--batches` test
batches and a batch of another size (proof of the dynamic axis) and fails above 1e-4 absolute difference.
The file lands next to the checkpoint (`best.ckpt` -> `best.onnx`) unless `--output` names another `.onnx`.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path

import lightning as L
import torch

from datamodules.base import ClassificationDataModule
from datamodules.errors import DataError
from lightning_modules.classifier import ClassificationModule
from lightning_modules.transfer_net import skip_pretrained_weights

TOLERANCE = 1e-4  # float32 kernels of ONNX Runtime and PyTorch differ around 1e-6 on these nets


class ExportError(Exception):
    """A bad checkpoint, output path or export; the message names the file and what to do."""


def load(checkpoint: Path) -> tuple[ClassificationModule, ClassificationDataModule]:
    """The trained module and its datamodule, both rebuilt from the hyperparameters the checkpoint holds."""
    try:
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for files that are not checkpoints
        raise ExportError(
            f"{checkpoint}: not a checkpoint this can read ({type(error).__name__}); give a .ckpt written by "
            "scripts.train fit"
        ) from None
    class_path = saved.get("datamodule_hyper_parameters", {}).get("_class_path") if isinstance(saved, dict) else None
    if class_path is None or "hyper_parameters" not in saved:
        raise ExportError(
            f"{checkpoint}: no module and datamodule hyperparameters in it; "
            "export a checkpoint written by `python -m scripts.train fit`"
        )
    # Lightning only instantiates a datamodule class whose module is already imported.
    importlib.import_module(class_path.rsplit(".", 1)[0])
    network = saved["hyper_parameters"].get("network")
    overrides = {}
    if isinstance(network, dict) and network.get("init_args"):
        init_args = dict(network["init_args"])
        skip_pretrained_weights(init_args)
        overrides["network"] = {**network, "init_args": init_args}
    model = ClassificationModule.load_from_checkpoint(checkpoint, map_location="cpu", **overrides)
    # LightningDataModule's own classmethod builds the class the checkpoint names (a subclass's would build itself).
    datamodule = L.LightningDataModule.load_from_checkpoint(checkpoint)
    return model, datamodule


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
    `export` and by scripts.tracking.save_model (the ONNX file of a registered model)."""
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


def export(checkpoint: str, output: str | None = None, batches: int = 1, opset: int = 18) -> float:
    """Writes the ONNX file and returns the largest |onnx - torch| seen; raises ExportError above TOLERANCE.

    Args:
        checkpoint: a .ckpt written by `python -m scripts.train fit` (outputs/<exp>/<run>/checkpoints/best.ckpt).
        output: where the .onnx goes; default: beside the checkpoint, same name, suffix .onnx.
        batches: test batches to compare ONNX Runtime and PyTorch on (plus one batch of another size).
        opset: ONNX opset of the graph (18: the exporter's own).
    """
    source = Path(checkpoint)
    if not source.is_file():
        raise ExportError(f"{checkpoint}: no such checkpoint file; give the path of a .ckpt (outputs/.../best.ckpt)")
    target = Path(output) if output is not None else source.with_suffix(".onnx")
    if target.suffix != ".onnx" or target.resolve() == source.resolve():
        raise ExportError(f"{target}: the output must be a path ending in .onnx (this one would overwrite a file)")
    if batches < 1:
        raise ExportError("--batches must be 1 or more")

    model, datamodule = load(source)
    network = model.network.eval()
    inputs = test_inputs(datamodule, batches)
    difference = write_onnx(network, inputs, target, opset)
    sizes = [len(batch) for batch in inputs] + [max(len(inputs[0]), 2) // 2]  # write_onnx adds a batch of another size
    print(
        f"onnx: {target}  max |onnx - torch| = {difference:.1e} on {len(sizes)} batches "
        f"(sizes {', '.join(map(str, sizes))})"
    )
    return difference


def main(args: list[str] | None = None) -> None:
    """A bad checkpoint, path or data ends in one line on stderr and exit status 1."""
    from jsonargparse import auto_cli

    try:
        auto_cli(export, args=args, as_positional=True)
    except (ExportError, DataError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
