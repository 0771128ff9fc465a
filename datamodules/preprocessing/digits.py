"""Digit images as the MNIST network sees them in predict and serving: grey, 28x28 (bilinear, antialiased), white on
black (a dark digit on lighter paper is inverted, judged by its strokes inside any frame around the paper, not by the
picture's edge or frame; a photo's paper made black, its frame painted over), standardised with MNIST's statistics.
numpy and Pillow only (the registered model ships it).

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
FRAME_MOST = 8  # a frame is at most this many of the 28 pixels deep: the paper inside it holds the digit
TO_EDGE = np.minimum(np.arange(28), np.arange(27, -1, -1))  # of each row (and column): pixels to the nearest edge
RING = np.minimum.outer(TO_EDGE, TO_EDGE)  # of each pixel: 0 on the picture's edge, 1 inside it, ..., 13 at its centre


def paper_and_ink(digit: np.ndarray, paper: float | None = None) -> tuple[float, bool]:
    """(the paper's grey, whether the strokes are darker than it) of one uint8 picture (28 x 28, or what is inside its
    frame, whose paper's grey is then given). The paper is its median grey (most of a digit's picture is paper,
    whatever its edge); the strokes, the pixels at least STROKE from it. Darker strokes outnumbering lighter ones are
    ink on paper: a dark edge adds to the ink, it does not turn white paper into a dark background (the border alone
    said so, and a photo with a dark edge came out wrong)."""
    paper = float(np.median(digit)) if paper is None else paper
    darker = int((digit < paper - STROKE).sum())
    lighter = int((digit > paper + STROKE).sum())
    return paper, darker > lighter


def frame_depth(digit: np.ndarray) -> int:
    """How many outer rings of pixels of a uint8 (28, 28) picture are a frame around its paper: a band of one grey all
    round (ring after ring, 9 in 10 of a ring's pixels within STROKE of the outermost ring's grey), inside which, at
    once or one ring later (the resize blurs the frame's inner edge), paper of another grey begins all round: 19 in
    20 of a ring's pixels, and 9 in 10 of the next's. 0 when there is none: MNIST's black margin is no frame, as the
    digit, not paper of another grey, lies inside it (none of its 70,000 is taken for one). A dark frame around white
    paper made the frame the picture's median grey, so its 'paper', and the paper the 'strokes': bold ink digits so
    framed were not inverted, and read as a 0."""
    edge = float(np.median(digit[RING == 0]))
    off = np.abs(digit.astype(np.float32) - edge) > STROKE
    depth = 0
    while depth < FRAME_MOST and off[depth == RING].mean() <= 0.1:
        depth += 1
    if depth == 0:
        return 0
    for inner in (depth, depth + 1):
        if off[inner == RING].mean() >= 0.95 and off[inner + 1 == RING].mean() >= 0.9:
            return inner
    return 0


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
    (N, 1, 28, 28). Paper and strokes are told apart inside a frame, if the picture has one (frame_depth), and the
    frame is painted over in the paper's grey. A digit on paper that is not black (inverted ink, or light strokes on
    grey) or in a frame has what touches the edge (or the frame) painted over and its grey levels stretched: the
    paper to 0, the strokes' brightest to 255, as MNIST's are. MNIST's own digits, light on black, pass unchanged."""
    out, light = digits.copy(), np.zeros(len(digits), dtype=bool)
    for i, digit in enumerate(digits[:, 0]):
        depth = frame_depth(digit)
        # Inside a frame the paper's grey is the ring's next to it: a large bold digit may be most of what is inside.
        framed_paper = float(np.median(digit[depth + 1 == RING])) if depth else None
        paper, light[i] = paper_and_ink(digit[depth : 28 - depth, depth : 28 - depth], framed_paper)
        picture = digit.astype(np.float32)
        if depth:  # the frame, and its blurred inner edge where nearer the paper's grey than the frame's, become paper
            frame = float(np.median(digit[RING == 0]))
            blur = (depth + 1 >= RING) & (np.abs(picture - paper) < np.abs(picture - frame))
            picture[(depth > RING) | blur] = paper
        picture = 255.0 - picture if light[i] else picture
        paper = 255.0 - paper if light[i] else paper
        if not light[i] and paper <= BLACK and not depth:
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
