"""Digit images as the MNIST network sees them in predict and serving: grey, 28x28 (bilinear, antialiased), white on
black (a dark digit on lighter paper is inverted, judged by its strokes, not the picture's edge; a photo's paper made
black), standardised with MNIST's statistics. numpy and Pillow only (the registered model ships it).

    python -m scripts.train predict --config configs/mnist.yaml --ckpt_path CKPT --data.predict_path digits/
"""

from __future__ import annotations

import numpy as np

from datamodules.preprocessing.images import pixels, read

MEAN, STD = 0.1307, 0.3081  # of the training images scaled to [0, 1]
# (x / 255 - MEAN) / STD as one multiply and one subtraction, two passes over a batch and no division (the slowest of
# the three): the datamodule normalises each training batch so (docs/measured.md), and predict and serving alike.
SCALE, SHIFT = np.float32(1 / (255 * STD)), np.float32(MEAN / STD)


def to_digit(image) -> np.ndarray:
    """A grey Pillow image of any size as MNIST's uint8 (1, 28, 28)."""
    from PIL import Image

    if image.size != (28, 28):
        image = image.resize((28, 28), Image.Resampling.BILINEAR)
    return pixels(image).transpose(2, 0, 1)


STROKE = 48  # how far from the paper's grey a pixel of a stroke is, at least (of 255)
BLACK = 24  # paper up to this grey is MNIST's black: its digits pass unchanged
MARGIN = 4  # MNIST centres each digit in a 20 x 20 box: the outer 4 pixels are paper


def paper_and_ink(digit: np.ndarray) -> tuple[float, bool]:
    """(the paper's grey, whether the strokes are darker than it) of one uint8 (28, 28) picture. The paper is its
    median grey (most of a digit's picture is paper, whatever its edge); the strokes, the pixels at least STROKE from
    it. Darker strokes outnumbering lighter ones are ink on paper: a dark edge adds to the ink, it does not turn
    white paper into a dark background (the border alone said so, and a photo with a dark edge came out wrong)."""
    paper = float(np.median(digit))
    darker = int((digit < paper - STROKE).sum())
    lighter = int((digit > paper + STROKE).sum())
    return paper, darker > lighter


def without_edge_strokes(digit: np.ndarray, paper: float) -> np.ndarray:
    """`digit` (light strokes on darker paper, float) with the strokes in its outer MARGIN pixels that reach its edge
    painted over in the paper's grey: a photo's edge, a shadow or the page's rim, not the digit (MNIST's keep inside
    a 20 x 20 box, 4 pixels from the edge). Kept as it is when nothing else would remain (a digit cropped to its
    edge)."""
    band = np.ones(digit.shape, dtype=bool)
    band[MARGIN:-MARGIN, MARGIN:-MARGIN] = False
    strokes = digit > paper + STROKE
    edge = strokes & band
    reached = np.zeros_like(strokes)
    reached[[0, -1], :], reached[:, [0, -1]] = strokes[[0, -1], :], strokes[:, [0, -1]]
    while True:  # grown through 8-connected strokes until it stops
        padded = np.pad(reached, 1)
        grown = edge & np.logical_or.reduce(
            [padded[1 + dy : 29 + dy, 1 + dx : 29 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
        )
        if (grown == reached).all():
            break
        reached = grown
    if not (strokes & ~reached).any():
        return digit
    return np.where(reached, paper, digit)


def as_white_on_black(digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the digits as MNIST's, light strokes on black; which were dark on light and so inverted) of a uint8 batch
    (N, 1, 28, 28). A digit on paper that is not black (inverted ink, or light strokes on grey) has what touches the
    edge painted over and its grey levels stretched: the paper to 0, the strokes' brightest to 255, as MNIST's are.
    MNIST's own digits, light on black, pass unchanged."""
    out, light = digits.copy(), np.zeros(len(digits), dtype=bool)
    for i, digit in enumerate(digits[:, 0]):
        paper, light[i] = paper_and_ink(digit)
        picture = 255.0 - digit if light[i] else digit.astype(np.float32)
        paper = 255.0 - paper if light[i] else paper
        if not light[i] and paper <= BLACK:
            continue
        picture = without_edge_strokes(picture, paper)
        top = float(picture.max())
        if top > paper + STROKE:
            picture = (picture - paper) * (255.0 / (top - paper))
        out[i, 0] = np.clip(np.rint(picture), 0, 255).astype(np.uint8)
    return out, light


def normalize(digits: np.ndarray) -> np.ndarray:
    """uint8 digits as the network takes them: float32, scaled to [0, 1] and standardised (the datamodule does the same
    on the training device, in torch)."""
    return digits.astype(np.float32) * SCALE - SHIFT


def serving_batch(state: dict, inputs: list[bytes], names: list[str]) -> np.ndarray:
    """Encoded digit images (one name each, for messages) as the network's input batch (N, 1, 28, 28)."""
    digits = np.stack([to_digit(read(data, name, grey=True)) for data, name in zip(inputs, names)])
    return normalize(as_white_on_black(digits)[0])
