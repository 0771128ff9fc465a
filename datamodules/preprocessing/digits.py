"""Digit images as the MNIST network sees them in predict and serving: grey, 28x28 (bilinear, antialiased), white on
black (a dark digit on a light background is inverted), standardised with MNIST's statistics. numpy and Pillow only
(the registered model ships it).

    python -m scripts.train predict --config configs/mnist.yaml --ckpt_path CKPT --data.predict_path digits/
"""

from __future__ import annotations

import numpy as np

from datamodules.preprocessing.images import pixels, read

MEAN, STD = 0.1307, 0.3081  # of the training images scaled to [0, 1]


def to_digit(image) -> np.ndarray:
    """A grey Pillow image of any size as MNIST's uint8 (1, 28, 28)."""
    from PIL import Image

    if image.size != (28, 28):
        image = image.resize((28, 28), Image.Resampling.BILINEAR)
    return pixels(image).transpose(2, 0, 1)


def light_background(digits: np.ndarray) -> np.ndarray:
    """Per digit of a uint8 batch (N, 1, 28, 28): whether its border is light (two thirds of white on average), a dark
    digit on a light background. MNIST's are white on black (their borders are black): the network reads the reverse
    as noise, and answers it with confidence."""
    border = np.ones((28, 28), dtype=bool)
    border[3:-3, 3:-3] = False
    return digits[:, 0, border].astype(np.float32).mean(1) > 170


def as_white_on_black(digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the digits, those on a light background inverted; which were)."""
    light = light_background(digits)
    return np.where(light[:, None, None, None], 255 - digits, digits), light


def normalize(digits: np.ndarray) -> np.ndarray:
    """uint8 digits as the network takes them: float32 in [0, 1], standardised (the datamodule does the same on the
    training device, in torch)."""
    return (digits.astype(np.float32) / np.float32(255) - MEAN) / STD


def serving_batch(state: dict, inputs: list[bytes], names: list[str]) -> np.ndarray:
    """Encoded digit images (one name each, for messages) as the network's input batch (N, 1, 28, 28)."""
    digits = np.stack([to_digit(read(data, name, grey=True)) for data, name in zip(inputs, names)])
    return normalize(as_white_on_black(digits)[0])
