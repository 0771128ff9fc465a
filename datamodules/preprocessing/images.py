"""Image files, with numpy and Pillow only: which files are images and which are no one's data, and encoded images as
upright 8-bit pictures: the one decoder of the datamodules (training, evaluation, predict) and of the registered model
(scripts/serving/pyfunc_model.py), which ships this file; and the photo models' centre crop (`photo_batch`: their
registered model's preprocessing). Batch scoring (scripts/serving/batch_score.py, scripts/score.py)
loads it by its path for `ignored`: a folder's files are left out there as training leaves them out.

    python -m scripts.train predict --config configs/birds.yaml --ckpt_path CKPT --data.predict_path photos/
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from datamodules.errors import DataError

if TYPE_CHECKING:
    from PIL.Image import Image


class ImageError(DataError):
    """A DataError about one image: "<name>: <reason>" (code that holds only its pixels names it "an image")."""

    def __init__(self, reason: str, name: str = "an image") -> None:
        super().__init__(f"{name}: {reason}")
        self.reason, self.name = reason, name

    def __reduce__(self) -> tuple:  # pickled (a process pool's result), it keeps its two parts
        return type(self), (self.reason, self.name)


# What one image to serve may be: encoded size, and decoded size read from its header before decoding (a small file
# can announce a huge picture). The scoring script (scripts/score.py) and the registered model check both.
MAX_IMAGE_BYTES = int(os.environ.get("SCORE_MAX_IMAGE_BYTES", str(10 * 2**20)))
MAX_IMAGE_PIXELS = int(os.environ.get("SCORE_MAX_IMAGE_PIXELS", str(40_000_000)))
FORMATS = "JPEG, PNG, WebP or GIF"
# The names of image files (in any case): a file so named is meant as an image, and a damaged one is refused by name
# rather than passed over. Others are told by their bytes (`is_image`). Windows and browsers save JPEGs as .jfif, .jpe.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".gif")
# Windows Explorer's thumbnail caches and folder settings, left in every folder of photos it has shown.
WINDOWS_FILES = ("thumbs.db", "ehthumbs.db", "ehthumbs_vista.db", "desktop.ini")
# What every ImageNet-pretrained backbone expects of its input (the photo models: datamodules/image_folder.py on the
# training device, normalize_photos below in serving).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# HEIF's brands (ISO/IEC 23008-12), at bytes 8-12 after "ftyp": an iPhone camera's photo (.heic), which Pillow does not
# read. Named as such, since "not a JPEG" leaves the owner of a photo that opens everywhere on their phone puzzled.
HEIF_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1")


def ignored(name: str) -> bool:
    """Dot files (.DS_Store, macOS's `._x.jpg` resource forks too), macOS zip debris (`__MACOSX/`) and Windows
    Explorer's files (Thumbs.db, desktop.ini) are no one's data."""
    return name.startswith(".") or name == "__MACOSX" or name.lower() in WINDOWS_FILES


def hidden(path: Path, root: Path) -> bool:
    """Whether `path` or a folder between it and `root` is `ignored`."""
    return any(ignored(part) for part in path.relative_to(root).parts)


def is_image(path: Path) -> bool:
    """Whether the file `path` is meant as an image: named as one (IMAGE_SUFFIXES) or, whatever its name, one by its
    first bytes (a JPEG saved as photo.jfif, or with no suffix at all); reads its header only."""
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return True
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path):
            return True
    except Image.DecompressionBombError:  # an image, too large: decoding it says so
        return True
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
        return False


class OversizeImage(DataError):
    """An image over MAX_IMAGE_BYTES or MAX_IMAGE_PIXELS (HTTP 413 in the scoring script)."""


def is_heif(source: bytes | str | Path) -> bool:
    """Whether `source` (a file or its bytes) begins as a HEIF image does."""
    if isinstance(source, bytes):
        head = source[:12]
    else:
        with open(source, "rb") as file:
            head = file.read(12)
    return head[4:8] == b"ftyp" and head[8:12] in HEIF_BRANDS


def open_image(source: bytes | str | Path, grey: bool = False):
    """`source` (a file or its bytes) as an upright Pillow image, 8-bit "RGB" or "L" (`grey`); (None, why) when it is
    not one readable image. Upright: a JPEG's EXIF orientation applied (phones store photos sideways). Grey pixels of
    more than 8 bits are scaled to 8 (`eight_bits`). A transparent image (RGBA, LA, a palette or a colour marked
    transparent) is laid on white, as a page shows it: dropping the alpha would show the colour its invisible pixels
    happen to store, black in a web canvas's export, where a digit drawn in black then vanishes."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            image.load()
            ImageOps.exif_transpose(image, in_place=True)  # in place: no copy of an upright photo
            if image.mode in ("F", "I") or image.mode.startswith("I;16"):
                image, reason = eight_bits(image)
                if image is None:
                    return None, reason
            if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
                image = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image.convert("RGBA"))
            mode = "L" if grey else "RGB"
            if image.mode != mode:  # convert() copies even an image already in the mode
                image = image.convert(mode)
    except UnidentifiedImageError:
        if is_heif(source):
            return None, "a HEIC photo (an iPhone camera's format), which is not read here: save it as JPEG"
        return None, f"not a {FORMATS} image"
    except Image.DecompressionBombError as error:
        return None, str(error)
    except (OSError, ValueError, SyntaxError, EOFError) as error:  # Pillow's for damaged or cut-short files
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return None, f"truncated ({reason})" if "truncated" in reason.lower() else reason
    if min(image.size) == 0:
        return None, f"decodes to {image.size[0]}x{image.size[1]} pixels, not one image"
    return image, None


def eight_bits(image: Image) -> tuple[Image | None, str | None]:
    """A grey Pillow image of wider pixels as 8-bit "L" ("LA" where a colour is marked transparent), or (None, why).
    16 bits ("I;16", a 16-bit PNG or TIFF): 65535 -> 255, as its 8-bit version holds it. 32-bit integers ("I", a TIFF)
    and floats ("F", a TIFF or PFM) carry no scale of their own: their values are read on the narrowest scale that
    holds them all: integers 0-255 or else 0-65535, floats 0-1 (numpy's and most tools' floating-point pictures) or
    else 0-255 (Pillow's convert("F")). A picture on the wider scale whose every pixel fits the narrower one would be
    all but black (at most 1/255 or 1/257 of white). Values beyond both have no brightness one can tell: refused."""
    from PIL import Image

    values = np.asarray(image)
    if values.size == 0:  # open_image refuses it for its size
        return image, None
    if image.mode == "F" and not np.isfinite(values).all():
        return None, "floating-point pixels that are not numbers (NaN or infinite): save it as an 8-bit PNG"
    low, high = values.min().item(), values.max().item()
    scales = [65535] if image.mode.startswith("I;16") else [1, 255] if image.mode == "F" else [255, 65535]
    scale = next((scale for scale in scales if low >= 0 and high <= scale), None)
    if scale is None:
        kind, number = ("floating-point", "{:g}") if image.mode == "F" else ("32-bit integer", "{}")
        return None, (
            f"{kind} pixels from {number.format(low)} to {number.format(high)}, in neither 0-{scales[0]} nor "
            f"0-{scales[1]}, so how bright each is cannot be told: save it as an 8-bit PNG"
        )
    grey = Image.fromarray(np.rint(values * (255 / scale)).astype(np.uint8), "L")
    if "transparency" in image.info:  # a 16-bit PNG's colour marked transparent, in 16-bit units
        alpha = np.where(values == image.info["transparency"], 0, 255).astype(np.uint8)
        grey = Image.merge("LA", (grey, Image.fromarray(alpha, "L")))
    return grey, None


def read(source: bytes | str | Path, name: str, grey: bool = False, fix: str = "send a JPEG, PNG or WebP file"):
    """`open_image`, or a DataError "<name>: not a readable image (why); <fix>"."""
    image, reason = open_image(source, grey)
    if image is None:
        raise DataError(f"{name}: not a readable image ({reason}); {fix}")
    return image


def check_size(name: str, data: bytes) -> None:
    """Refuses an empty image, or one over MAX_IMAGE_BYTES or MAX_IMAGE_PIXELS (read from its header; every frame of
    an animated GIF or multi-page TIFF counts), before any frame is decoded."""
    import re

    from PIL import Image, UnidentifiedImageError

    if not data:
        raise DataError(f"{name}: empty file; send the image's bytes")
    if len(data) > MAX_IMAGE_BYTES:
        raise OversizeImage(
            f"{name}: {len(data)} bytes; send images of at most {MAX_IMAGE_BYTES} bytes (SCORE_MAX_IMAGE_BYTES sets "
            "the limit)"
        )
    try:
        with Image.open(io.BytesIO(data)) as header:  # reads the header only
            width, height = header.size
            # Pillow counts frames by walking their headers: none is decoded (a 15 KB GIF can hold 40 of 4000x4000).
            frames = getattr(header, "n_frames", 1)
    except Image.DecompressionBombError as error:  # Pillow's own guard, past twice its limit: its message has the size
        found = re.search(r"\((\d+) pixels\)", str(error))
        size = f"{found.group(1)} pixels" if found else "over 178 megapixels"
        raise OversizeImage(f"{name}: {size}; {pixel_limit()}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
        return  # not an image Pillow knows, or a damaged one: decoding says why
    if width * height * frames > MAX_IMAGE_PIXELS:
        many = f" x {frames} frames" if frames > 1 else ""
        raise OversizeImage(f"{name}: {width}x{height} pixels{many}; {pixel_limit()}")


def pixel_limit() -> str:
    return (
        f"send images of at most {MAX_IMAGE_PIXELS // 1_000_000} megapixels, all frames together "
        f"(SCORE_MAX_IMAGE_PIXELS={MAX_IMAGE_PIXELS} sets the limit)"
    )


def pixels(image) -> np.ndarray:
    """A Pillow image as uint8 (H, W, C): C = 3 for RGB, 1 for grey."""
    array = np.asarray(image, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array


# Photos as the photo network (configs/birds.yaml, any labelled folder) sees them in evaluation, predict and serving:
# upright, shorter side resized to 256/224 of the crop, the centre crop, ImageNet-normalised.


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


def normalize_photos(images: np.ndarray) -> np.ndarray:
    """A uint8 batch (N, 3, H, W) as the network takes it: float32 in [0, 1], ImageNet-normalised (the datamodule
    does the same on the training device, in torch)."""
    mean = np.asarray(IMAGENET_MEAN, dtype=np.float32)[:, None, None]
    std = np.asarray(IMAGENET_STD, dtype=np.float32)[:, None, None]
    return (images.astype(np.float32) / np.float32(255) - mean) / std


def example_png() -> bytes:
    """A 64 x 64 colour gradient as a PNG file: an image datamodule's default input example for its registered model."""
    from PIL import Image

    y, x = np.mgrid[0:64, 0:64]
    buffer = io.BytesIO()
    Image.fromarray(np.stack([x * 4, y * 4, (x + y) * 2], -1).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def photo_batch(state: dict, inputs: list[bytes], names: list[str]) -> np.ndarray:
    """Encoded photos (one name each, for messages) as the network's input batch (N, 3, S, S), S: image_size."""
    size = state["image_size"]
    crops = [centre_crop(read(data, name), size, name).transpose(2, 0, 1) for data, name in zip(inputs, names)]
    # A network of colour photos only answers grey pictures (another task's digits) with confidence: refused when the
    # request holds grey ones only, as predict refuses such a folder (datamodules/image_folder.py). A grey picture's
    # channels differ by under 2 levels on average (a grey JPEG's colour noise), as the fit measured its images.
    if state.get("colour_share") == 1 and all(
        np.abs(crop.astype(np.int16) - np.roll(crop, 1, axis=0)).mean() < 2 for crop in crops
    ):
        raise DataError(
            f"{names[0]}: grey pictures, but this model was trained on colour images only (another task's data?); "
            "send pictures like its training data"
        )
    return normalize_photos(np.stack(crops))
