"""Birds: image-folder layouts and their errors, archives, transforms, pretrained backbones, freezing, the CLI.

.venv/bin/python -m pytest -q tests/test_birds.py
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tarfile
import zipfile
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import BackboneFinetuning

from datamodules.birds import BirdsDataModule
from datamodules.errors import DataError
from lightning_modules.classifier import ClassificationModule
from lightning_modules.transfer_net import (
    BackboneFinetuningFrozenBN,
    TransferNet,
    WeightsError,
    efficientnet_lite0_file,
)
from tests.conftest import CLASSES, bird_folders, run_module, write_images


def datamodule(data_dir: Path, **kwargs) -> BirdsDataModule:
    return BirdsDataModule(str(data_dir), **{"image_size": 32, "num_workers": 0, "batch_size": 4, **kwargs})


# ---- layouts ---------------------------------------------------------------------------------------------------


def test_train_val_folders_give_sorted_classes_and_labels(tmp_path):
    root = bird_folders(tmp_path / "birds")
    dm = datamodule(root)
    assert dm.class_names == list(CLASSES)  # known right after __init__: the CLI links it into the model
    dm.setup("fit")
    files, labels = dm.splits["train"]
    assert len(files) == 12 and all(f.parent.parent == root / "train" for f in files)
    assert all(CLASSES[label] == f.parent.name for f, label in zip(files, labels))
    assert {f.parent.parent for f in dm.splits["val"][0]} == {root / "val"}
    dm.setup("test")
    assert dm.splits["test"] == dm.splits["val"]  # no test/: the validation images


def test_test_folder_is_used_when_present(tmp_path):
    root = bird_folders(tmp_path / "birds", splits=("train", "val", "test"), count=2)
    dm = datamodule(root)
    dm.setup("test")
    assert {f.parent.parent for f in dm.splits["test"][0]} == {root / "test"}


def test_one_folder_is_split_by_a_seeded_fraction_of_each_class(tmp_path):
    root = tmp_path / "birds"
    for channel, name in enumerate(CLASSES):
        write_images(root / name, 10, channel)

    def split(seed: int) -> tuple[set[Path], set[Path]]:
        dm = datamodule(root, val_fraction=0.3, seed=seed)
        dm.setup("fit")
        return set(dm.splits["train"][0]), set(dm.splits["val"][0])

    train, val = split(seed=1)
    assert not train & val and len(train | val) == 20
    assert sorted(sum(f.parent.name == name for f in val) for name in CLASSES) == [3, 3]
    assert split(seed=1) == (train, val)
    assert split(seed=2)[1] != val


# ---- errors: each names the path ----------------------------------------------------------------------------------


def test_images_outside_class_folders_are_not_labelled(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    write_images(root / "train", 1, 0, start=0)  # train/0.png next to the class folders
    with pytest.raises(DataError, match="not labelled") as error:
        datamodule(root).setup("fit")
    assert str(root / "train") in str(error.value) and "0.png" in str(error.value)


def test_train_and_val_with_different_classes(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    write_images(root / "val" / "ducks", 2, 2)
    with pytest.raises(DataError, match="different classes") as error:
        datamodule(root).setup("fit")
    message = str(error.value)
    assert "ducks" in message and str(root / "val") in message and str(root / "train") in message


def test_a_class_without_images(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    for path in (root / "val" / "turkeys").iterdir():
        path.unlink()
    with pytest.raises(DataError, match="no images") as error:
        datamodule(root).setup("fit")
    assert str(root / "val" / "turkeys") in str(error.value)


def test_a_split_without_class_folders(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    shutil.rmtree(root / "val")
    (root / "val").mkdir()
    with pytest.raises(DataError, match="no class subfolders") as error:
        datamodule(root).setup("fit")
    assert str(root / "val") in str(error.value)


def test_missing_data_dir(tmp_path):
    with pytest.raises(DataError, match="no such folder") as error:
        _ = datamodule(tmp_path / "nowhere").class_names
    assert str(tmp_path / "nowhere") in str(error.value)


def test_every_unreadable_file_is_reported_at_setup_in_one_error(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    good = (root / "train" / "chickens" / "1.jpg").read_bytes()
    bad = {
        root / "train" / "chickens" / "truncated.jpg": good[: len(good) // 2],
        root / "train" / "turkeys" / "text.jpg": b"not an image at all",
        root / "val" / "chickens" / "empty.png": b"",
        root / "val" / "turkeys" / "notes.txt": b"a stray file",
    }
    for path, data in bad.items():
        path.write_bytes(data)
    dm = datamodule(root)
    with pytest.raises(DataError, match="4 file") as error:
        dm.setup("fit")
    assert all(str(path) in str(error.value) for path in bad)
    assert "truncated" in str(error.value)  # torchvision's reason comes along


def test_without_verify_images_a_bad_file_fails_when_its_batch_is_loaded(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    broken = root / "train" / "chickens" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really")
    dm = datamodule(root, verify_images=False, batch_size=8)
    dm.setup("fit")  # no decode pass
    with pytest.raises(DataError, match=f"{re.escape(str(broken))}: not a readable image"):
        list(dm.train_dataloader())


# ---- archives -----------------------------------------------------------------------------------------------------


def test_archive_is_extracted_once_when_class_names_are_asked(tmp_path, monkeypatch):
    source = bird_folders(tmp_path / "fowl_data", count=2)
    archive = tmp_path / "fowl_data.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(source.rglob("*")):
            zf.write(path, path.relative_to(tmp_path))  # one top folder, fowl_data/, as the tutorial's zip
    target = tmp_path / "data" / "birds"
    dm = datamodule(target, archive=str(archive))
    assert dm.class_names == list(CLASSES)
    assert (target / "train" / "chickens" / "0.png").is_file()
    assert [p.name for p in target.parent.iterdir()] == ["birds"]  # no temporary folder left behind

    def extract(*args, **kwargs):
        raise AssertionError("extracted a second time")

    monkeypatch.setattr(zipfile.ZipFile, "extractall", extract)
    dm.prepare_data()
    datamodule(target, archive=str(archive)).setup("fit")


def test_archive_url_is_downloaded_and_extracted(tmp_path, serve):
    source = bird_folders(tmp_path / "served" / "images", count=2)
    with tarfile.open(tmp_path / "served" / "birds.tar.gz", "w:gz") as tar:
        for name in ("train", "val"):  # no top folder this time
            tar.add(source / name, arcname=name)
    url = f"{serve(tmp_path / 'served')}/birds.tar.gz"
    dm = datamodule(tmp_path / "birds", archive=url)
    dm.prepare_data()
    assert dm.class_names == list(CLASSES)
    assert len(list((tmp_path / "birds" / "val").rglob("*.png"))) == 2


def test_archive_that_does_not_exist(tmp_path):
    with pytest.raises(DataError, match="no such archive") as error:
        _ = datamodule(tmp_path / "birds", archive=str(tmp_path / "missing.zip")).class_names
    assert str(tmp_path / "missing.zip") in str(error.value)
    assert not (tmp_path / "birds").exists()


# ---- transforms and batches ---------------------------------------------------------------------------------------


def test_batches_are_cropped_uint8_then_normalised_on_the_device(tmp_path):
    root = tmp_path / "birds"
    for split in ("train", "val"):
        for channel, name in enumerate(CLASSES):
            write_images(root / split / name, 3, channel, size=(48, 80))  # not square, not 32
    write_images(tmp_path / "photos", 3, 0, size=(100, 60))
    dm = datamodule(root, predict_path=str(tmp_path / "photos"))
    dm.setup("fit")
    dm.setup("predict")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8 and labels.dtype == torch.long
    images, labels = dm.on_after_batch_transfer((images, labels), 0)
    assert images.dtype == torch.float32 and images.min() < 0 < images.max()
    (val_images, _) = next(iter(dm.val_dataloader()))
    assert val_images.shape == (4, 3, 32, 32)
    (batch,) = [b for b in dm.predict_dataloader()][:1]
    assert len(batch) == 1 and batch[0].shape == (3, 3, 32, 32)
    assert dm.predict_names == [str(tmp_path / "photos" / f"{i}.{'jpg' if i % 2 else 'png'}") for i in range(3)]


def test_evaluation_crop_is_the_centre(tmp_path):
    # Resize(256/224 * size) then CenterCrop(size): a centred square survives, its border does not.
    image = torch.zeros(3, 64, 64, dtype=torch.uint8)
    image[:, 16:48, 16:48] = 255
    out = BirdsDataModule(image_size=28).transform(train=False)(image)
    assert out.shape == (3, 28, 28)
    assert out[:, 14, 14].min() == 255 and out[:, 0, 0].max() == 0


def test_predict_needs_no_training_data_when_classes_are_given(tmp_path):
    write_images(tmp_path / "photos", 2, 0)
    (tmp_path / "photos" / ".DS_Store").write_bytes(b"junk")  # hidden files are skipped
    dm = datamodule(tmp_path / "nowhere", classes=["turkeys", "chickens"], predict_path=str(tmp_path / "photos"))
    assert dm.class_names == ["turkeys", "chickens"]
    dm.setup("predict")
    assert [Path(name).name for name in dm.predict_names] == ["0.png", "1.jpg"]
    with pytest.raises(DataError, match="no such folder"):
        dm.setup("fit")


# ---- networks -----------------------------------------------------------------------------------------------------


def test_efficientnet_lite0_is_the_packaged_imagenet_model_with_a_new_head():
    net = TransferNet(2)
    packaged = torch.load(efficientnet_lite0_file(), map_location="cpu", weights_only=True)
    backbone = net.backbone.state_dict()
    assert all(torch.equal(backbone[key], value) for key, value in packaged.items() if not key.startswith("_fc."))
    assert isinstance(net.backbone._fc, torch.nn.Identity) and net.head.out_features == 2
    random = TransferNet(2, weights="none").backbone.state_dict()
    assert not torch.equal(random["_conv_stem.weight"], backbone["_conv_stem.weight"])
    assert net.eval()(torch.rand(2, 3, 32, 32)).shape == (2, 2)


@pytest.mark.slow
def test_torchvision_weights_download_once_with_hash_check(tmp_path, monkeypatch, serve):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    served = tmp_path / "served"
    served.mkdir()
    from torchvision.models import resnet18

    state = resnet18().state_dict()
    torch.save(state, served / "weights.pth")
    digest = hashlib.sha256((served / "weights.pth").read_bytes()).hexdigest()
    (served / "weights.pth").rename(served / f"resnet18-{digest[:8]}.pth")
    url = f"{serve(served)}/resnet18-{digest[:8]}.pth"

    net = TransferNet(3, backbone="resnet18", weights_url=url)
    assert torch.equal(net.backbone.conv1.weight, state["conv1.weight"])
    assert isinstance(net.backbone.fc, torch.nn.Identity) and net.head.in_features == 512
    cached = tmp_path / "torch" / "hub" / "checkpoints" / f"resnet18-{digest[:8]}.pth"
    assert cached.is_file()
    (served / cached.name).unlink()  # a second build must not download
    assert torch.equal(
        TransferNet(3, backbone="resnet18", weights_url=url).backbone.conv1.weight, state["conv1.weight"]
    )

    # A file whose content does not match the hash in its name is refused and not cached.
    (served / "resnet18-00000000.pth").write_bytes(cached.read_bytes())
    with pytest.raises(WeightsError, match="invalid hash"):
        TransferNet(3, backbone="resnet18", weights_url=f"{serve(served)}/resnet18-00000000.pth")
    assert not (cached.parent / "resnet18-00000000.pth").exists()

    # Nothing listening: the error says where to put the file instead.
    with pytest.raises(WeightsError, match="weights_path"):
        TransferNet(3, backbone="resnet50", weights_url="http://127.0.0.1:9/resnet50-11ad3fa6.pth")


@pytest.mark.slow
def test_local_densenet_weights_in_torchvision_old_key_names(tmp_path):
    from torchvision.models import densenet121

    state = densenet121().state_dict()
    # As torchvision's file: "norm.1"-style names and no num_batches_tracked (older than that buffer).
    old = {
        key.replace("norm1", "norm.1").replace("conv2", "conv.2"): value
        for key, value in state.items()
        if "num_batches_tracked" not in key
    }
    assert old.keys() != state.keys()
    torch.save(old, tmp_path / "densenet121.pth")
    net = TransferNet(2, backbone="densenet121", weights_path=str(tmp_path / "densenet121.pth"))
    key = "features.denseblock1.denselayer1.norm1.running_var"
    assert torch.equal(net.backbone.state_dict()[key], state[key])
    assert net.head.in_features == 1024
    with pytest.raises(WeightsError, match="nothing.pth: no such weights file"):
        TransferNet(2, backbone="densenet121", weights_path=str(tmp_path / "nothing.pth"))
    torch.save({"fc.weight": torch.zeros(1000, 512)}, tmp_path / "resnet18.pth")
    with pytest.raises(WeightsError, match="resnet18.pth: not densenet121's ImageNet weights"):
        TransferNet(2, backbone="densenet121", weights_path=str(tmp_path / "resnet18.pth"))


# ---- freezing and unfreezing ----------------------------------------------------------------------------------------


def fit(tmp_path: Path, max_epochs: int, callbacks: list) -> tuple[ClassificationModule, dict, dict]:
    """A few SGD steps of the frozen efficientnet-lite0 on tiny birds; returns the module and states before/after."""
    dm = datamodule(bird_folders(tmp_path / "birds", count=4))
    model = ClassificationModule(
        partial(TransferNet, freeze_backbone=True),
        dm.class_names,
        optimizer=partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    )
    before = {k: v.clone() for k, v in model.network.state_dict().items()}
    trainer = L.Trainer(
        max_epochs=max_epochs,
        limit_train_batches=2,
        limit_val_batches=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    return model, before, model.network.state_dict()


def changed(before: dict, after: dict, prefix: str, kind: str = "") -> list[str]:
    return [k for k in before if k.startswith(prefix) and kind in k and not torch.equal(before[k], after[k])]


@pytest.mark.slow
def test_frozen_backbone_keeps_weights_and_batchnorm_statistics(tmp_path):
    model, before, after = fit(tmp_path, max_epochs=1, callbacks=[])
    assert changed(before, after, "head.") == ["head.weight", "head.bias"]
    assert changed(before, after, "backbone.") == []  # weights, running means/vars, batch counts
    assert any("running_mean" in k for k in before)
    assert not any(p.requires_grad for p in model.network.backbone.parameters())


class Record(L.Callback):
    """What the optimizer and the backbone look like during each training epoch."""

    def __init__(self) -> None:
        self.epochs: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx == 0:
            backbone = pl_module.network.backbone
            self.epochs.append(
                {
                    "lrs": [group["lr"] for group in trainer.optimizers[0].param_groups],
                    "conv_trainable": backbone._conv_stem.weight.requires_grad,
                    "bn_training": backbone._bn0.training,
                }
            )


@pytest.mark.slow
def test_backbone_finetuning_unfreezes_the_backbone_after_n_epochs(tmp_path):
    record = Record()
    finetuning = BackboneFinetuningFrozenBN(unfreeze_backbone_at_epoch=1, backbone_initial_ratio_lr=0.1, train_bn=False)
    model, before, after = fit(tmp_path, max_epochs=2, callbacks=[finetuning, record])
    first, second = record.epochs
    assert first == {"lrs": [0.1], "conv_trainable": False, "bn_training": False}
    assert second["conv_trainable"] and second["lrs"] == pytest.approx([0.1, 0.01])
    assert not second["bn_training"]  # BatchNorm stays in inference mode after unfreezing too
    assert "backbone._conv_stem.weight" in changed(before, after, "backbone.")
    assert changed(before, after, "backbone.", "running_") == []
    assert changed(before, after, "backbone.", "_bn") == []  # train_bn=False: BatchNorm's affine stays as well


def test_lightning_backbone_finetuning_still_leaves_batchnorm_trainable_when_told_not_to():
    # Why BackboneFinetuningFrozenBN exists; when this fails, Lightning fixed #21531 and the subclass can go.
    model = ClassificationModule(partial(TransferNet, weights="none", freeze_backbone=True), list(CLASSES))
    BackboneFinetuning(train_bn=False).freeze_before_training(model)
    assert model.network.backbone._bn0.weight.requires_grad
    model = ClassificationModule(partial(TransferNet, weights="none", freeze_backbone=True), list(CLASSES))
    BackboneFinetuningFrozenBN(train_bn=False).freeze_before_training(model)
    assert not any(p.requires_grad for p in model.network.backbone.parameters())


# ---- the CLI ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_fit_then_predict_a_folder(tmp_path, train_cli):
    root = bird_folders(tmp_path / "birds", count=4)
    write_images(tmp_path / "photos", 3, 1, size=(50, 70))
    data = [
        "--config", "configs/birds.yaml",
        "--data.init_args.data_dir", str(root),
        "--data.init_args.archive", "null",
        "--data.init_args.image_size", "32",
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    fit = train_cli("fit", *data, "--trainer.max_epochs", "2", "--trainer.callbacks.unfreeze_backbone_at_epoch", "1")
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "test_acc: " in fit.stdout
    checkpoint = next(line.split(": ", 1)[1] for line in fit.stdout.splitlines() if line.startswith("best checkpoint"))

    predict = train_cli(
        "predict", *data, "--ckpt_path", checkpoint, "--data.init_args.predict_path", tmp_path / "photos"
    )
    assert predict.returncode == 0, predict.stderr[-3000:]
    rows = predict.stdout[predict.stdout.index("input,class,probability") :].splitlines()[1:]
    assert len(rows) == 3
    for row, i in zip(rows, range(3)):
        name, label, probability = row.split(",")
        assert Path(name).name == f"{i}.{'jpg' if i % 2 else 'png'}" and label in CLASSES
        assert 0.5 <= float(probability) <= 1


@pytest.mark.slow
def test_cli_reports_an_unreadable_image_in_one_line(tmp_path, train_cli):
    root = bird_folders(tmp_path / "birds", count=2)
    (root / "val" / "turkeys" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    result = train_cli(
        "fit", "--config", "configs/birds.yaml", "--data.init_args.data_dir", str(root),
        "--data.init_args.archive", "null", "--data.init_args.image_size", "32",
    )  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("error: 1 file(s) are not readable images")
    assert str(root / "val" / "turkeys" / "broken.jpg") in result.stderr


@pytest.mark.slow
def test_cli_reports_a_bad_image_met_in_a_dataloader_worker_in_one_line(tmp_path, train_cli):
    """verify_images false: the error comes from a worker process, re-raised with its traceback by PyTorch."""
    root = bird_folders(tmp_path / "birds", count=2)
    broken = root / "train" / "turkeys" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really")
    result = train_cli(
        "fit", "--config", "configs/birds.yaml", "--data.init_args.data_dir", str(root),
        "--data.init_args.archive", "null", "--data.init_args.image_size", "32",
        "--data.init_args.verify_images", "false", "--data.init_args.num_workers", "1",
    )  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {broken}: not a readable image (")


def test_cli_reports_a_missing_weights_file_in_one_line(tmp_path, train_cli):
    root = bird_folders(tmp_path / "birds", count=2)
    result = train_cli(
        "fit", "--config", "configs/birds.yaml", "--data.init_args.data_dir", str(root),
        "--model.network.init_args.weights_path", str(tmp_path / "missing.pth"),
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'missing.pth'}: no such weights file; give weights_path a state dict (.pth)"
    )
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_predict_and_export_need_no_imagenet_weights_once_trained(tmp_path, train_cli):
    weights = tmp_path / "resnet18.pth"
    from torchvision.models import resnet18

    torch.save(resnet18().state_dict(), weights)
    root = bird_folders(tmp_path / "birds", count=2)
    data = [
        "--config", "configs/birds.yaml",
        "--data.init_args.data_dir", str(root),
        "--data.init_args.image_size", "32",
        "--model.network.init_args.backbone", "resnet18",
        "--model.network.init_args.weights_path", str(weights),
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    fit = train_cli("fit", *data, "--trainer.max_epochs", "1")
    assert fit.returncode == 0, fit.stderr[-3000:]
    checkpoint = next(line.split(": ", 1)[1] for line in fit.stdout.splitlines() if line.startswith("best checkpoint"))
    weights.unlink()  # another machine, offline: the checkpoint alone must do
    write_images(tmp_path / "photos", 2, 0)
    predict = train_cli(
        "predict", *data, "--ckpt_path", checkpoint, "--data.init_args.predict_path", tmp_path / "photos"
    )
    assert predict.returncode == 0, predict.stderr[-3000:]
    assert len(predict.stdout[predict.stdout.index("input,class,probability") :].splitlines()) == 3
    export = run_module("scripts.export", checkpoint, "--output", tmp_path / "birds.onnx")
    assert export.returncode == 0, export.stderr[-3000:]
    assert (tmp_path / "birds.onnx").is_file()
