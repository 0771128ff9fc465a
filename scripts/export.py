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
from pathlib import Path

import lightning as L
import torch

from datamodules.base import ClassificationDataModule
from datamodules.errors import DataError
from lightning_modules.checkpoint_fit import NetworkMismatchError
from lightning_modules.classifier import ClassificationModule
from lightning_modules.transfer_net import skip_pretrained_weights
from scripts.serving.mlflow_model import ExportError, test_inputs, write_onnx

MIN_OPSET = 18  # torch.onnx's exporter (dynamo) writes no older opset


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
    try:
        model = ClassificationModule.load_from_checkpoint(checkpoint, map_location="cpu", **overrides)
    except NetworkMismatchError as error:  # its line names the network; this names the file
        raise ExportError(f"{checkpoint}: {error}") from None
    # LightningDataModule's own classmethod builds the class the checkpoint names (a subclass's would build itself).
    datamodule = L.LightningDataModule.load_from_checkpoint(checkpoint)
    return model, datamodule


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
    from onnx.defs import onnx_opset_version

    # torch's exporter writes opset 18 for any other it cannot write, without a word: 5 and 1000 gave files of 18.
    if not MIN_OPSET <= opset <= onnx_opset_version():
        raise ExportError(f"--opset {opset}: give {MIN_OPSET} to {onnx_opset_version()} (what torch and onnx write)")

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
    """A bad option, checkpoint, path or data ends in one line on stderr and exit status 1."""
    from scripts.training.cli_errors import run_cli

    run_cli(export, "scripts.export", (ExportError, DataError), args)


if __name__ == "__main__":
    main()
