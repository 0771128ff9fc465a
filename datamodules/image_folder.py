"""Labelled image folders (`<split>/<class>/<image>`): find them, fetch them from an archive, check them.

Used by `datamodules.birds` (`python -m scripts.train fit --config configs/birds.yaml`); any
DataModule over a folder of class subfolders can use it. Every mistake is a `DataError` that
names the path: images outside class folders, classes that differ between splits, empty
classes, files that do not decode (all of them in one message, found before training starts).
"""

from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import torch

from datamodules.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")  # what torchvision.io.decode_image reads as one image


def hidden(path: Path, root: Path) -> bool:
    """Dot files and macOS zip debris (`__MACOSX/`) are no one's data."""
    return any(part.startswith(".") or part == "__MACOSX" for part in path.relative_to(root).parts)


def class_folders(split_dir: Path) -> list[Path]:
    """The class subfolders of a split, sorted by name (their index is the label)."""
    if not split_dir.is_dir():
        raise DataError(f"{split_dir}: no such folder; give data_dir a folder of class subfolders of images")
    loose = sorted(p.name for p in split_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if loose:
        shown = ", ".join(loose[:3]) + (f" and {len(loose) - 3} more" if len(loose) > 3 else "")
        raise DataError(
            f"{split_dir}: images not labelled ({shown} lie directly in it); put each image in a subfolder "
            f"named after its class, e.g. {split_dir / '<class>' / loose[0]}"
        )
    folders = sorted(p for p in split_dir.iterdir() if p.is_dir() and not hidden(p, split_dir))
    if not folders:
        raise DataError(f"{split_dir}: no class subfolders; put the images of each class in a folder named after it")
    return folders


def list_images(split_dir: Path) -> dict[str, list[Path]]:
    """Class name -> its files (any depth below the class folder), sorted; every class must have some."""
    classes = {}
    for folder in class_folders(split_dir):
        files = sorted(p for p in folder.rglob("*") if p.is_file() and not hidden(p, folder))
        if not files:
            raise DataError(f"{folder}: class {folder.name!r} has no images; add some or remove the folder")
        classes[folder.name] = files
    return classes


def check_same_classes(reference: str | Path, names: list[str], other: str | Path, other_names: list[str]) -> None:
    """Both must name the same classes, or a label index would mean different things in each."""
    differences = [
        f"{sorted(set(a) - set(b))} only in {where}"
        for a, b, where in ((names, other_names, reference), (other_names, names, other))
        if set(a) - set(b)
    ]
    if differences:
        raise DataError(f"{reference} and {other} have different classes: {'; '.join(differences)}; give both the same")


def decode(source: Path | bytes, grey: bool = False) -> tuple[torch.Tensor | None, str | None]:
    """(uint8 image: RGB (3, H, W) or grey (1, H, W), None), or (None, why it is not one image). `source` is a file,
    or the bytes of one (a request to the scoring script, scripts/score.py)."""
    from torchvision.io import ImageReadMode, decode_image

    encoded = torch.frombuffer(bytearray(source), dtype=torch.uint8) if isinstance(source, bytes) else str(source)
    try:
        # Phone photos are stored sideways with an EXIF orientation that says how to turn them upright.
        mode = ImageReadMode.GRAY if grey else ImageReadMode.RGB
        image = decode_image(encoded, mode=mode, apply_exif_orientation=True)
    except RuntimeError as error:
        # torchvision prefixes "function, source.cpp:line, ": keep the reason.
        return None, re.sub(r"^\w+, \S+:\d+, ", "", str(error).splitlines()[0])
    if image.dtype == torch.uint16:  # a 16-bit PNG: scale to 8 bits as its 8-bit version holds it (65535 -> 255)
        image = ((image.to(torch.int32) * 255 + 32767) // 65535).to(torch.uint8)
    if image.ndim != 3 or min(image.shape[1:]) == 0:
        return None, f"decodes to shape {tuple(image.shape)}, not one image"
    return image, None


def read_image(path: Path, grey: bool = False) -> torch.Tensor:
    """`path` as uint8 RGB (3, H, W), or grey (1, H, W); a DataError naming the file when it is not one image."""
    image, reason = decode(path, grey)
    if image is None:
        raise DataError(f"{path}: not a readable image ({reason}); remove or replace it")
    return image


def decode_error(path: Path) -> str | None:
    """Why `path` is not one readable RGB image, or None when it is (decodes it whole, once)."""
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        return f"not a {'/'.join(s[1:].upper() for s in IMAGE_SUFFIXES)} file by its name"
    return decode(path)[1]


def check_readable(paths: list[Path]) -> None:
    """One DataError listing every file that does not decode, so a run never dies mid-epoch on one."""
    bad = [(path, reason) for path in paths if (reason := decode_error(path)) is not None]
    if bad:
        lines = "; ".join(f"{path} ({reason})" for path, reason in bad)
        raise DataError(f"{len(bad)} file(s) are not readable images: {lines}; remove or replace them")


def seeded_split(files: list[Path], fraction: float, seed: int, where: Path) -> tuple[list[Path], list[Path]]:
    """(kept, held out) of one class's files: `fraction` of them, at least one, drawn with `seed`."""
    n_held = max(1, round(fraction * len(files)))
    if n_held >= len(files):
        raise DataError(
            f"{where}: {len(files)} image(s) cannot be split into training and validation with "
            f"val_fraction {fraction}; add images or give separate train/ and val/ folders"
        )
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    held = set(order[:n_held])
    return [f for i, f in enumerate(files) if i not in held], [f for i, f in enumerate(files) if i in held]


def fetch_archive(archive: str, target: Path) -> None:
    """Extracts `archive` (a path or http(s) URL of a zip or a tar, compressed or not) into `target`, once.

    Extraction goes to a temporary folder beside `target` that is renamed into place, so
    `target` is either absent or complete, and processes racing to create it cannot mix
    files. An archive holding one top folder (`fowl_data/train/...`) gives that folder's content.
    """
    if target.is_dir() and any(target.iterdir()):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as temp:
        temp = Path(temp)
        if archive.startswith(("http://", "https://")):
            source = temp / "download"
            try:
                with urllib.request.urlopen(archive, timeout=60) as response, source.open("wb") as file:
                    shutil.copyfileobj(response, file)
            except (urllib.error.URLError, OSError) as error:
                raise DataError(
                    f"{archive}: download failed ({getattr(error, 'reason', error)}); put the images in "
                    f"{target} yourself or set data.init_args.archive to a local copy"
                ) from None
        else:
            source = Path(archive)
            if not source.is_file():
                raise DataError(f"{archive}: no such archive; give data.init_args.archive an existing .zip or .tar.gz")
        unpacked = temp / "unpacked"
        try:
            if zipfile.is_zipfile(source):
                with zipfile.ZipFile(source) as archive_file:
                    archive_file.extractall(unpacked)  # drops ".." and absolute parts of member names
            else:
                with tarfile.open(source) as archive_file:
                    archive_file.extractall(unpacked, filter="data")  # refuses paths outside, links out, devices
        except (zipfile.BadZipFile, tarfile.TarError, OSError) as error:
            raise DataError(f"{archive}: cannot be extracted ({error}); check the file or download it again") from None
        entries = [p for p in unpacked.iterdir() if not hidden(p, unpacked)]
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked
        try:
            root.rename(target)
        except OSError:
            if not target.is_dir():  # else another process finished first: its copy is as good
                raise
