"""Photos as the birds network sees them in evaluation, predict and serving: upright, shorter side resized to
256/224 of the crop, the centre crop, ImageNet-normalised. numpy and Pillow only (the registered model ships it).

    python -m scripts.train predict --config configs/birds.yaml --ckpt_path CKPT --data.predict_path photos/
"""

from __future__ import annotations

import numpy as np

from datamodules.errors import ImageError
from datamodules.preprocessing.images import MAX_IMAGE_PIXELS, pixels, read

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # what every ImageNet-pretrained backbone expects
IMAGENET_STD = (0.229, 0.224, 0.225)


def centre_crop(image, image_size: int, name: str = "an image") -> np.ndarray:
    """ImageNet's evaluation recipe on a Pillow RGB image: shorter side to round(image_size * 256 / 224) (bilinear,
    antialiased), the centre image_size x image_size; uint8 (H, W, 3). A strip of a picture (1 x 10,000 pixels: 126
    bytes of PNG, within the pixel limit) that the resize would make a picture over MAX_IMAGE_PIXELS (256 x 2,560,000:
    2.6 GB at image_size 224) is an ImageError naming `name`, before any of it is made."""
    from PIL import Image

    width, height = image.size
    short = round(image_size * 256 / 224)
    size = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
    if size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise ImageError(
            f"{width}x{height} pixels, which the centre crop would resize to {size[0]}x{size[1]}; send a picture "
            f"whose sides are nearer alike (resized, at most {MAX_IMAGE_PIXELS} pixels: SCORE_MAX_IMAGE_PIXELS)",
            name,
        )
    if size != image.size:
        image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = round((size[0] - image_size) / 2), round((size[1] - image_size) / 2)
    return pixels(image.crop((left, top, left + image_size, top + image_size)))


def normalize(images: np.ndarray) -> np.ndarray:
    """A uint8 batch (N, 3, H, W) as the network takes it: float32 in [0, 1], ImageNet-normalised (the datamodule
    does the same on the training device, in torch)."""
    mean = np.asarray(IMAGENET_MEAN, dtype=np.float32)[:, None, None]
    std = np.asarray(IMAGENET_STD, dtype=np.float32)[:, None, None]
    return (images.astype(np.float32) / np.float32(255) - mean) / std


def serving_batch(state: dict, inputs: list[bytes], names: list[str]) -> np.ndarray:
    """Encoded photos (one name each, for messages) as the network's input batch (N, 3, S, S), S: image_size."""
    size = state["image_size"]
    crops = [centre_crop(read(data, name), size, name).transpose(2, 0, 1) for data, name in zip(inputs, names)]
    return normalize(np.stack(crops))
