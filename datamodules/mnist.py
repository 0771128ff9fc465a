"""MNIST: 28x28 grey handwritten digits -> 0-9, read from the four original idx files.

    python -m scripts.train fit --config configs/mnist.yaml
    python -m scripts.train predict --config configs/mnist.yaml --ckpt_path ... --data.predict_path my_digits/

The files (`train-images-idx3-ubyte` etc., gzipped or not) live in `data_dir`; `prepare_data` downloads missing ones
from torchvision's mirrors and checks their MD5. The whole set stays a uint8 tensor (N, 1, 28, 28), on the training GPU
when there is one; batches are slices of it (`InMemoryBatches`), scaled, normalised and, when training with `augment`,
randomly warped a whole batch at a time in `on_after_batch_transfer`. Validation is about `val_size` of the training
file's images, each by a seeded hash of its pixels (datamodules/base.py's rule); the split's rule and the data's digest
go in every checkpoint, and a test or resume on other files says what differs (datamodules/split_check.py). Predict
reads a folder of images, told by their bytes (PNG, JPEG saved as .jpg, .jfif or .jpe, WebP, GIF; white digit on black,
as MNIST; any size, made grey 28x28; dark digits on a light background are inverted, saying so on stderr) or an idx file
of images.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import struct
import sys
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from datamodules import base, folder_split
from datamodules.base import InMemoryDataModule
from datamodules.errors import DataError
from datamodules.preprocessing import digits as preprocessing
from datamodules.preprocessing.digits import MEAN, SCALE, SHIFT, STD
from datamodules.preprocessing.images import FORMATS, hidden, is_image, open_image

# Each file's idx magic number and the MD5 of its uncompressed bytes. torchvision's `resources`
# hash the .gz files, but equally good copies differ in their gzip headers (CI's copy does), so
# the data itself is what gets checked.
FILES = {
    "train-images-idx3-ubyte": (2051, "6bbc9ace898e44ae57da46a324031adb"),
    "train-labels-idx1-ubyte": (2049, "a25bea736e30d166cdddb491f175f624"),
    "t10k-images-idx3-ubyte": (2051, "2646ac647ad5339dbf082846283269ea"),
    "t10k-labels-idx1-ubyte": (2049, "27ae3e4e09519cfbb04c329615203637"),
}


def unzip(raw: bytes, where: Path | str) -> bytes:
    """The bytes of an idx file, gzipped (whatever its name) or not."""
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as error:  # zlib.error: a damaged deflate stream
        raise DataError(f"{where}: broken gzip data ({error}); delete it and download it again") from None


def parse_idx(data: bytes, magic: int, where: Path | str) -> torch.Tensor:
    """An idx array of unsigned bytes (`magic` 2049: labels, 2051: images) as a uint8 tensor. A header cut short, or
    one announcing no values at all (0 images), is a DataError naming the file: struct and torch.frombuffer would
    otherwise end in a traceback."""
    found = struct.unpack(">I", data[:4])[0] if len(data) >= 4 else None
    if found != magic:
        raise DataError(
            f"{where}: not an MNIST idx file (magic number {found}, expected {magic}); "
            "use the original files from http://yann.lecun.com/exdb/mnist/ or a mirror"
        )
    ndim = magic & 0xFF
    if len(data) < 4 + 4 * ndim:
        raise DataError(f"{where}: {len(data)} bytes do not hold an idx header of {ndim} dimensions (truncated?)")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    if len(data) != 4 + 4 * ndim + math.prod(shape):
        raise DataError(f"{where}: {len(data)} bytes do not hold the {shape} array its header announces (truncated?)")
    if math.prod(shape) == 0:
        what = "images" if ndim > 1 else "labels"
        raise DataError(f"{where}: its header announces a {shape} array, which holds no {what}; give a file of some")
    return torch.frombuffer(bytearray(data[4 + 4 * ndim :]), dtype=torch.uint8).reshape(shape)


def read_idx(path: Path, magic: int) -> torch.Tensor:
    return parse_idx(unzip(path.read_bytes(), path), magic, path)


def read_mnist_file(path: Path, name: str) -> torch.Tensor:
    """`path`, the file of FILES' `name`, as read_idx reads it; a DataError when its data is another of the four files
    (by FILES' MD5s): the test files copied in as the training files were trained on, and their test accuracy, a
    measure of what the network had seen, came out with no word. Other data in MNIST's format (Fashion-MNIST) is not
    judged."""
    data = unzip(path.read_bytes(), path)
    digest = hashlib.md5(data).hexdigest()
    other = next((other for other, (_, md5) in FILES.items() if md5 == digest and other != name), None)
    if other is not None:
        raise DataError(
            f"{path}: holds MNIST's {other} (by the MD5 of its data), not {name}; put {name} there (training and "
            "test on the same images, the test accuracy would measure nothing)"
        )
    return parse_idx(data, FILES[name][0], path)


def read_digit(path: Path) -> torch.Tensor:
    """One image file as a grey uint8 (1, 28, 28) tensor, as the registered model reads one
    (datamodules/preprocessing/digits.py)."""
    image, reason = open_image(path, grey=True)
    if image is None:
        raise DataError(f"{path}: not a readable image ({reason}); remove or replace it")
    return torch.from_numpy(preprocessing.to_digit(image).copy())


def as_white_on_black(digits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the digits, those on a light background inverted; which were): the serving code's rule."""
    inverted, light = preprocessing.as_white_on_black(digits.cpu().numpy())
    return torch.from_numpy(inverted), torch.from_numpy(light)


class MNISTDataModule(InMemoryDataModule):
    """
    Args:
        data_dir: folder holding the four idx files (gzipped or not); missing ones are downloaded there.
        predict_path: a folder of images (PNG, JPEG, WebP, GIF), one image, or an idx file of images to classify.
        batch_size: images per step and process.
        val_size: about this many training images held out for validation: each image by a seeded hash of its
            pixels (the same on every rank; adding or reordering images moves no other one).
        augment: warp training batches by a random small rotation, scale and shift per image.
        rotation: the largest rotation in degrees.
        translation: the largest shift as a fraction of the image side.
        scale: the largest zoom in or out, as a fraction (0.1: 90% to 110%).
        mirrors: base URLs to download from, tried in order; None: torchvision's MNIST mirrors.
        seed: of the validation split and the augmentation.
    """

    class_names = [str(digit) for digit in range(10)]
    serving_kind = "images"

    def __init__(
        self,
        data_dir: str = "data/mnist",
        predict_path: str | None = None,
        batch_size: int = 128,
        val_size: int = 5000,
        augment: bool = False,
        rotation: float = 10.0,
        translation: float = 0.1,
        scale: float = 0.1,
        mirrors: list[str] | None = None,
        seed: int = 42,
    ) -> None:
        super().__init__(batch_size, seed)
        if not 0 < val_size < 60000:
            raise DataError(f"data.init_args.val_size {val_size}: give 1 to 59999 (MNIST has 60000 training images)")
        self.save_hyperparameters()
        self.generator: torch.Generator | None = None
        self.generator_epoch = 0

    def path(self, name: str) -> Path | None:
        """The file holding `name`, gzipped or not; None when neither is there."""
        folder = Path(self.hparams.data_dir)
        return next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None)

    def missing_error(self, reason: str) -> DataError:
        names = ", ".join(f"{name}.gz" for name in FILES)
        return DataError(
            f"MNIST files missing in {self.hparams.data_dir} and {reason}; "
            f"put {names} (gzipped or not) there or set data.init_args.data_dir to their folder"
        )

    def prepare_data(self) -> None:
        """Downloads the files `data_dir` lacks (Lightning calls this on one process per node)."""
        if self.trainer is not None and self.trainer.state.fn == "predict":
            return  # predict reads predict_path only: no need for the training files
        missing = [name for name in FILES if self.path(name) is None]
        if not missing:
            return
        mirrors = self.hparams.mirrors
        if mirrors is None:
            from torchvision.datasets import MNIST

            mirrors = MNIST.mirrors
        folder = Path(self.hparams.data_dir)
        try:  # a data_dir that is a file (an idx file, a zip of them) ended in FileExistsError's traceback
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            why = "a file, not a folder" if folder.is_file() else f"cannot be made: {error.strerror}"
            raise DataError(
                f"{folder}: {why}; give data.init_args.data_dir the folder holding the four MNIST files (or one to "
                "download them to)"
            ) from None
        for name in missing:
            self.download(name, mirrors, folder)

    def download(self, name: str, mirrors: list[str], folder: Path) -> None:
        failures = []
        for mirror in mirrors:
            url = f"{mirror.rstrip('/')}/{name}.gz"
            try:
                with urllib.request.urlopen(url, timeout=30) as response:
                    raw = response.read()
            except (urllib.error.URLError, OSError) as error:
                failures.append(f"{url}: {getattr(error, 'reason', error)}")
                continue
            target = folder / f"{name}.gz"
            part = target.with_name(target.name + ".part")
            part.write_bytes(raw)  # a half-written file never carries the final name
            try:
                digest = hashlib.md5(unzip(raw, url)).hexdigest()
            except DataError:
                digest = "none (broken gzip)"
            if digest != FILES[name][1]:
                part.unlink()
                raise DataError(
                    f"{url}: not MNIST's {name} (MD5 of its data {digest}, expected {FILES[name][1]}); "
                    f"deleted the download. Try again later or put the files in {folder} yourself"
                )
            part.rename(target)
            return
        raise self.missing_error(f"the download failed ({'; '.join(failures)})")

    def load(self, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
        names = {kind: f"{prefix}-{kind}-idx{dims}-ubyte" for kind, dims in (("images", 3), ("labels", 1))}
        paths = {kind: self.path(name) for kind, name in names.items()}
        if None in paths.values():
            raise self.missing_error("this run does not download (prepare_data did not run)")
        images = read_mnist_file(paths["images"], names["images"])
        labels = read_mnist_file(paths["labels"], names["labels"])
        if images.shape[1:] != (28, 28) or len(images) != len(labels) or labels.max() > 9:
            raise DataError(
                f"{paths['images']}, {paths['labels']}: expected N 28x28 images and N labels 0-9, "
                f"got images {tuple(images.shape)} and labels {tuple(labels.shape)} up to {int(labels.max())}"
            )
        return images.unsqueeze(1), labels.long()

    def read_predict(self) -> tuple[torch.Tensor, list[str]]:
        if self.hparams.predict_path is None:
            raise DataError("predict needs data.init_args.predict_path: a folder of digit images or an idx file")
        path = Path(self.hparams.predict_path)
        if path.is_dir():
            entries = sorted(p for p in path.iterdir() if not hidden(p, path))
            files = [p for p in entries if p.is_file() and is_image(p)]  # a JPEG is one whatever its suffix (.jfif)
            if not files:
                raise DataError(f"{path}: no image ({FORMATS}) in this folder")
            # What is not read is named, as penguins' rows skipped are: a subfolder of digits, or a file that is no
            # image, got no answer, and the answers were fewer than the files without a word.
            if skipped := [p for p in entries if p not in files]:
                more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
                print(
                    f"{skipped[0]}{more}: not an image ({FORMATS}) directly in {path}: skipped, no answer for it",
                    file=sys.stderr,
                )
            return torch.stack([read_digit(p) for p in files]), [str(p) for p in files]
        if not path.is_file():
            raise DataError(f"{path}: no such file or folder; give predict_path a folder of images or an idx file")
        if is_image(path):
            return read_digit(path).unsqueeze(0), [str(path)]
        data = unzip(path.read_bytes(), path)
        if data[:4] != struct.pack(">I", 2051):  # a zip of PNGs: the training files' advice misled
            raise DataError(
                f"{path}: neither an image ({FORMATS}) nor an idx file of images; give predict_path a "
                "folder of images, one image, or an idx file of images"
            )
        images = parse_idx(data, 2051, path).unsqueeze(1)
        if images.shape[2:] != (28, 28):
            images = F.interpolate(images.float(), size=(28, 28), mode="area").round().to(torch.uint8)
        return images, [f"{path}[{i}]" for i in range(len(images))]

    def setup(self, stage: str) -> None:
        if stage != "predict":
            if not hasattr(self, "rows"):
                self.read_rows()
            wanted = ("test",) if stage == "test" else ("train", "val")
            self.splits.update({name: () for name in wanted if name not in self.splits})
            self.resplit(getattr(self, "rule", None) or self.config_rule())
        else:
            images, self.predict_names = self.read_predict()
            images, light = as_white_on_black(images)
            if light.any():
                inverted = [name for name, flag in zip(self.predict_names, light.tolist()) if flag]
                more = f" and {len(inverted) - 1} more" if len(inverted) > 1 else ""
                print(
                    f"{inverted[0]}{more}: dark digits on a light background; inverted to MNIST's white on black",
                    file=sys.stderr,
                )
            self.splits["predict"] = (images.to(self.data_device),)

    @property
    def data_device(self) -> torch.device:  # batches become slices on the training GPU: nothing is copied per step
        return self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")

    def read_rows(self) -> None:
        """Both files' images and labels (training's first), and each image's hash of its pixels (its split's key)."""
        images, labels = self.load("train")
        if self.hparams.val_size >= len(images):
            raise DataError(
                f"data.init_args.val_size {self.hparams.val_size}: the training files in {self.hparams.data_dir} "
                f"hold {len(images)} images, so none would be left to train on; give a val_size below "
                f"{len(images)} (e.g. {max(1, len(images) // 5)})"
            )
        test_images, test_labels = self.load("t10k")
        self.train_count, self.rows = len(images), (torch.cat([images, test_images]), torch.cat([labels, test_labels]))
        pixels = self.rows[0].reshape(len(self.rows[0]), -1).numpy()
        self.keys = np.array([folder_split.content_hash(image.tobytes()) for image in pixels], dtype=np.uint64)

    split_options = ("seed", "val_size")  # the rule's parts this datamodule's config gives (split_check.py)
    held_out = "its validation images are held out"  # what a checkpoint's rule restores (split_check.py)
    permuted = "the training file's images"  # what the split before the hash rule permuted (split_check.py)

    def config_rule(self) -> dict:
        """About val_size of the training file's images held out: a share of it, each image's by its pixels' hash."""
        rule = base.split_rule(self.seed, self.hparams.val_size / self.train_count, 0.0, ["image"])
        return rule | {"val_size": self.hparams.val_size}

    def resplit(self, rule: dict) -> None:
        """The splits by `rule` (this config's, or a checkpoint's: datamodules/split_check.py) and the identity."""
        (images, labels), count = self.rows, self.train_count
        if rule["method"] == base.METHOD:
            held = folder_split.held_out_by_hash(rule["seed"], self.keys[:count], rule["val_fraction"])
            held = torch.from_numpy(held)
            train, val = (~held).nonzero().flatten(), held.nonzero().flatten()
        else:
            from datamodules.permuted_split import permuted_rows

            train, val = permuted_rows(count, rule["val_size"], rule["seed"])
        if not len(val):
            raise DataError(
                f"{self.hparams.data_dir}: its {count} training images are all alike, which no split can divide into "
                "training and validation; give MNIST's files, or images of digits"
            )
        parts = (train, val, torch.arange(count, len(labels)))
        self.rule, self.split_indices = rule, {"train": train, "val": val}  # rows of the training files
        content = base.mixed(self.keys ^ labels.numpy().astype(np.uint64))  # the label too: the digest's rows
        schema = folder_split.image_schema(1, 28, self.class_names)
        self.identity = base.data_identity(str(self.hparams.data_dir), content, None, rule, schema, parts)
        for name, rows in zip(base.SPLITS, parts):
            if name in self.splits:
                self.splits[name] = (images[rows].to(self.data_device), labels[rows].to(self.data_device))

    def warp(self, images: torch.Tensor) -> torch.Tensor:
        """Every image of the batch rotated, scaled and shifted by its own random amount, in one call."""
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        if self.generator is None or self.generator.device != images.device or self.generator_epoch != epoch:
            # Seeded anew each epoch by (seed, rank, epoch), as the batches' order is by seed and epoch: a fit resumed
            # at an epoch's start warps as the uninterrupted one did, with no generator to keep in the checkpoint.
            rank, _ = self.rank_and_world_size
            seed = np.random.SeedSequence((self.seed & (2**64 - 1), rank, epoch)).generate_state(1, np.uint64)[0]
            self.generator = torch.Generator(images.device).manual_seed(int(seed))
            self.generator_epoch = epoch
        n = len(images)
        uniform = torch.rand(n, 4, generator=self.generator, device=images.device) * 2 - 1  # in [-1, 1)
        angle = uniform[:, 0] * math.radians(self.hparams.rotation)
        zoom = 1 + uniform[:, 1] * self.hparams.scale
        shift = uniform[:, 2:] * self.hparams.translation * 2  # grid coordinates span 2 per image side
        cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
        theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
        grid = F.affine_grid(theta, list(images.shape), align_corners=False)
        return F.grid_sample(images, grid, align_corners=False)  # outside the image: 0, the background

    serving_preprocess = staticmethod(preprocessing.serving_batch)

    def on_after_batch_transfer(self, batch: tuple[torch.Tensor, ...], dataloader_idx: int) -> tuple[torch.Tensor, ...]:
        # One new float tensor, normalised in place as preprocessing.normalize does: no batch-sized allocation per
        # operation (docs/measured.md).
        images = batch[0].to(torch.float32, copy=True)
        if self.hparams.augment and self.trainer is not None and self.trainer.training:
            images = self.warp(images)  # linear in the pixels, 0 outside: the same on 0-255 as on 0-1
        return (images.mul_(float(SCALE)).sub_(float(SHIFT)), *batch[1:])

    def images_to_show(self, inputs: torch.Tensor) -> torch.Tensor:
        return (inputs.float() * STD + MEAN).clamp(0, 1)
