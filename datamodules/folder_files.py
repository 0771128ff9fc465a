"""The files of labelled image folders (`<split>/<class>/<image>`): find them, fetch them from an archive, read and
check them.

Used by `datamodules.image_folder` (`python -m scripts.train fit --config configs/birds.yaml`); any
DataModule over a folder of class subfolders can use it. Every mistake is a `DataError` that
names the path: folders named like splits but not one, images outside class folders, classes that differ between
splits, empty classes, a file that links (symbolic or hard) would read under two labels or in two splits, files that
do not decode (all of them in one message, found before training starts).
"""

from __future__ import annotations

import lzma
import os
import shutil
import tarfile
import tempfile
import unicodedata
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from datamodules.errors import DataError
from datamodules.preprocessing.images import hidden, ignored, is_image, open_image, pixels

# What other tools name their splits (Roboflow's valid/, Keras' and Kaggle's validation/, Train/ made on Windows).
SPLIT_NAMES = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val",
               "dev": "val", "test": "test", "testing": "test"}  # fmt: skip


def files_below(folder: Path) -> list[Path]:
    """The files at any depth below `folder`, sorted, hidden ones left out. Links are followed, to folders too
    (`Path.rglob` skips linked folders without a word); a folder reached twice through links is read once; a link
    to nothing is a DataError naming it, and so is a link to a folder above `folder` (a loop through its parent):
    the folders beside `folder` would be read as part of it, a class folder's link to its split labelling every
    other class's images as its own."""
    root, files, seen = os.path.realpath(folder), [], set()
    for top, folders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:  # a link back to a folder already read, or a second link to one folder
            folders.clear()
            continue
        if real != root and os.path.commonpath([real, root]) == real:
            raise DataError(
                f"{top}: a link to {os.readlink(top)}, a folder holding {folder} itself (a loop): what lies beside "
                f"{folder.name} would be read as in it; remove the link"
            )
        seen.add(real)
        folders[:] = [name for name in folders if not ignored(name)]
        for name in names:
            path = Path(top) / name
            if ignored(name):
                continue
            if not path.exists():
                raise dangling_link(path)
            files.append(path)
    return sorted(files)


def check_split_names(root: Path, splits: tuple[str, ...]) -> None:
    """A DataError naming a folder of `root` named like a split that is none of `splits` (`valid/`, `Train/`): beside
    train/ it was never read (validation held out of train/ instead, the test skipped), and in a data_dir of no
    split folders it was read as a class, the network taught to tell training pictures from validation ones."""
    for path in sorted(root.iterdir()):
        split = SPLIT_NAMES.get(path.name.strip().lower())
        if split is None or path.name in splits or not path.is_dir():
            continue
        if (root / split).is_dir() and os.path.samefile(root / split, path):  # macOS's disk: `Val/` read as val/
            continue
        fate = "ignored" if any((root / name).is_dir() for name in splits) else f"read as a class {path.name!r}"
        fix = f"move its class folders into {split}/" if (root / split).is_dir() else f"rename it {split}/"
        raise DataError(
            f"{path}: named like a split, but data_dir's splits are {', '.join(s + '/' for s in splits)} (it would be "
            f"{fate}); {fix}"
        )


def class_folders(split_dir: Path) -> list[Path]:
    """The class subfolders of a split, sorted by name (their index is the label). A class folder may be a link to a
    folder of images elsewhere (a dataset assembled from folders kept apart); a link to the split folder or a folder
    holding it (`train/loop -> ..`) is a DataError naming it: every image of the split, or of the whole dataset, would
    be read again as a class named after the link."""
    if not split_dir.is_dir():
        raise DataError(f"{split_dir}: no such folder; give data_dir a folder of class subfolders of images")
    loose = sorted(p.name for p in split_dir.iterdir() if p.is_file() and not hidden(p, split_dir) and is_image(p))
    if loose:
        shown = ", ".join(loose[:3]) + (f" and {len(loose) - 3} more" if len(loose) > 3 else "")
        raise DataError(
            f"{split_dir}: images not labelled ({shown} lie directly in it); put each image in a subfolder "
            f"named after its class, e.g. {split_dir / '<class>' / loose[0]}"
        )
    for path in split_dir.iterdir():
        if path.is_symlink() and not path.exists():
            raise dangling_link(path)
    folders = sorted(p for p in split_dir.iterdir() if p.is_dir() and not hidden(p, split_dir))
    real = os.path.realpath(split_dir)
    for folder in folders:
        target = os.path.realpath(folder)
        if folder.is_symlink() and os.path.commonpath([target, real]) == target:
            holding = f"{split_dir} itself" if target == real else f"a folder holding {split_dir}"
            raise DataError(
                f"{folder}: a link to {os.readlink(folder)}, {holding} (a loop): every image below it would be read "
                f"as class {folder.name!r}; remove the link"
            )
    if not folders:
        raise DataError(f"{split_dir}: no class subfolders; put the images of each class in a folder named after it")
    named: dict[str, Path] = {}
    for folder in folders:
        other = named.setdefault(class_key(folder.name), folder)
        if other != folder:
            raise DataError(
                f"{folder}: named {folder.name!r}, as {other.name!r} is but for spaces or Unicode form (one class read "
                f"as two); move its images into {other} and remove it"
            )
    return folders


def class_key(name: str) -> str:
    """A class folder's name as a person reads it: Unicode composed (macOS writes names decomposed: "é" as "e" and
    an accent), runs of spaces as one, none at either end."""
    return " ".join(unicodedata.normalize("NFC", name).split())


def case_twins(names: list[str]) -> list[tuple[str, str]]:
    """Pairs of class names alike but for case ("Chickens", "chickens"): two classes to the network, which may be
    meant (letters: "A" and "a"), so they are only told of."""
    first: dict[str, str] = {}
    pairs = []
    for name in names:
        earlier = first.setdefault(class_key(name).casefold(), name)
        if earlier != name:
            pairs.append((earlier, name))
    return pairs


def list_images(split_dir: Path) -> dict[str, list[Path]]:
    """Class name -> its files (any depth below the class folder), sorted; every class must have some."""
    classes = {}
    for folder in class_folders(split_dir):
        files = files_below(folder)
        if not files:
            raise DataError(f"{folder}: class {folder.name!r} has no images; add some or remove the folder")
        classes[folder.name] = files
    return classes


def read_once(splits: dict[str, dict[str, list[Path]]]) -> dict[str, dict[str, list[Path]]]:
    """`splits` (split -> class -> files) with each file (symbolic links followed) once. A file reached twice within
    one class through a symbolic link is read once, as a folder is; one that two classes or two splits would read (a
    link to another class's or split's folder or file, or a hard link: one file under two names) is a DataError naming
    both paths: the model would be taught two answers for one picture, or scored on pictures it was trained on.
    Files are told apart by device and inode (one stat each, no file read): a hard link has no target for realpath
    to find. Hard links within one class are kept, as copies are (that picture weighs twice; scripts/bench/birds.py
    makes large classes of them)."""
    first: dict[tuple[int, int], tuple[Path, str, str]] = {}  # (device, inode) -> (path, split, class) that read it
    kept: dict[str, dict[str, list[Path]]] = {split: {} for split in splits}
    for split, classes in splits.items():
        for name, files in classes.items():
            kept[split][name] = []
            for path in files:
                stat = os.stat(path)
                seen = first.setdefault((stat.st_dev, stat.st_ino), (path, split, name))
                if seen[1:] != (split, name):
                    raise read_twice(seen, (path, split, name))
                if seen[0] == path or os.path.realpath(path) != os.path.realpath(seen[0]):
                    kept[split][name].append(path)
    return kept


def read_twice(earlier: tuple[Path, str, str], later: tuple[Path, str, str]) -> DataError:
    """The one line for a file read under two labels or in two splits. It blames the path through the link nearest
    the file (a link inside a class folder, not the class folder linked in from elsewhere that it points into); of
    two hard links, the later one (in val/ or test/ rather than train/)."""
    common = Path(os.path.commonpath([earlier[0], later[0]]))

    def nearest_link(path: Path) -> Path:  # `common` when there is none below it
        return next(p for p in (path, *path.parents) if p == common or p.is_symlink())

    deeper = len(nearest_link(earlier[0]).parts) > len(nearest_link(later[0]).parts)
    (path, split, name), (other, other_split, other_name) = (earlier, later) if deeper else (later, earlier)
    link = nearest_link(path)
    fix = "remove the link"
    if os.path.realpath(path) != os.path.realpath(other):  # a hard link, perhaps reached through a symbolic one
        via, fix = " (a hard link: one file under two names)", "remove one of the two names"
    elif link == path:
        via = f" (a link to {os.readlink(link)})"
    else:
        via = f" (through {link}, a link to {os.readlink(link)})"
    if split == other_split:
        what = f"one picture labelled both {other_name!r} and {name!r}"
    elif "train" in (split, other_split):
        what = f"one picture both trained on and scored in {({split, other_split} - {'train'}).pop()}"
    else:
        what = f"one picture in both {earlier[1]} and {later[1]}"
    return DataError(f"{path}: the same file as {other}{via}: {what}; {fix}")


def check_same_classes(reference: str | Path, names: list[str], other: str | Path, other_names: list[str]) -> None:
    """Both must name the same classes, or a label index would mean different things in each."""
    differences = [
        f"{sorted(set(a) - set(b))} only in {where}"
        for a, b, where in ((names, other_names, reference), (other_names, names, other))
        if set(a) - set(b)
    ]
    alike = [
        f"{a!r} and {b!r} differ only in case, spaces or Unicode form"
        for a in sorted(set(names) - set(other_names))
        for b in sorted(set(other_names) - set(names))
        if class_key(a).casefold() == class_key(b).casefold()
    ]
    if differences:
        raise DataError(
            f"{reference} and {other} have different classes: {'; '.join(differences + alike)}; give both the same"
        )


def decode(source: Path | bytes, grey: bool = False) -> tuple[torch.Tensor | None, str | None]:
    """(uint8 image: RGB (3, H, W) or grey (1, H, W), None), or (None, why it is not one image). `source` is a file,
    or the bytes of one. The serving code's decoder (datamodules/preprocessing/images.py, Pillow): training, evaluation,
    predict and the registered model read an image alike.

    The image is a (C, H, W) view of Pillow's (H, W, C) pixels, channels-last in memory: no transposing copy, and
    the layout torch's uint8 antialiased resize runs fastest on (the training crop: ~30% less time, the same pixels;
    tests/test_birds_data.py checks both)."""
    image, reason = open_image(source, grey)
    if image is None:
        return None, reason
    return torch.from_numpy(np.array(pixels(image))).permute(2, 0, 1), None  # np.array: a writable copy


def read_image(path: Path, grey: bool = False) -> torch.Tensor:
    """`path` as uint8 RGB (3, H, W), or grey (1, H, W); a DataError naming the file when it is not one image."""
    image, reason = decode(path, grey)
    if image is None:
        raise DataError(f"{path}: not a readable image ({reason}); remove or replace it")
    return image


def colour_share(files: list[Path], sample: int = 32) -> float:
    """The share of colour images among up to `sample` of `files` spread over the list: an image is grey when its
    channels differ by under 2 levels on average (a grey JPEG's colour noise)."""
    step = max(1, len(files) // sample)
    chosen = files[::step][:sample]
    colour = 0
    for path in chosen:
        image = read_image(path).int()
        colour += bool((image - image.roll(1, dims=0)).abs().float().mean() >= 2)
    return colour / max(1, len(chosen))


def check_readable(paths: list[Path]) -> None:
    """One DataError listing every file that does not decode, so a run never dies mid-epoch on one. A file is an
    image by its bytes, not its name: a JPEG named .jfif or .JPE is read, a text file named .jpg is refused."""
    bad = [(path, reason) for path in paths if (reason := decode(path)[1]) is not None]
    if bad:
        lines = "; ".join(f"{path} ({reason})" for path, reason in bad)
        raise DataError(f"{len(bad)} file(s) are not readable images: {lines}; remove or replace them")


def seeded_split(files: list[Path], fraction: float, seed: int, where: Path) -> tuple[list[Path], list[Path]]:
    """(kept, held out) of one class's files: `fraction` of them, at least one, drawn with `seed`."""
    n_held = max(1, round(fraction * len(files)))
    if n_held >= len(files):
        raise DataError(
            f"{where}: {len(files)} image(s) cannot be split into training and validation with "
            f"data.init_args.val_fraction {fraction}; add images or give separate train/ and val/ folders"
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
    # A target that is a file (or lies below one) ended, after the whole extraction, in the rename's traceback.
    blocked = next((path for path in (target, *target.parents) if path.exists() and not path.is_dir()), None)
    if blocked is not None:
        raise DataError(
            f"{target}: {'' if blocked == target else f'{blocked} is '}a file, not a folder; give "
            f"data.init_args.data_dir a folder to extract {archive} into"
        )
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
        extract(source, unpacked, archive)
        entries = [p for p in unpacked.iterdir() if not hidden(p, unpacked)]
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked
        try:
            root.rename(target)
        except OSError:
            if not target.is_dir():  # else another process finished first: its copy is as good
                raise


def extract(source: Path, folder: Path, archive: str) -> None:
    """Extracts the zip or tar (gzip, bzip2, xz or none) `source` into `folder`, checked whole: a DataError naming
    `archive` and the reason when it is damaged or cut short, so no damaged image is trained on without a word."""
    with source.open("rb") as file:
        zip_like = file.read(2) == b"PK"  # a zip begins with its first member's header, and ends with its directory
    try:
        if zip_like or zipfile.is_zipfile(source):
            if not zipfile.is_zipfile(source):
                raise DataError(
                    f"{archive}: a zip archive without its central directory (cut short?); download it again"
                )
            with zipfile.ZipFile(source) as archive_file:
                archive_file.extractall(folder)  # checks each member's CRC-32; drops ".." and absolute parts of names
            return
        with tarfile.open(source) as archive_file:
            archive_file.extractall(folder, filter="data")  # refuses paths outside, links out, devices
            # tarfile stops at the archive's end marker; the compressed stream's own check (gzip's CRC-32, xz's and
            # bzip2's) runs only when it is read to its very end.
            while archive_file.fileobj.read(1 << 20):
                pass
    except tarfile.ReadError as error:
        if "could not be opened successfully" in str(error):  # its multi-line list of the formats tried
            raise DataError(f"{archive}: neither a zip nor a tar archive; give a .zip, .tar or .tar.gz") from None
        raise DataError(f"{archive}: a damaged or cut-short tar archive ({error}); download it again") from None
    except OSError as error:
        if error.errno is not None:  # the system's: a full disk, no permission
            raise DataError(
                f"{archive}: cannot be extracted into {folder.parent} ({error}); free space there"
            ) from None
        raise damaged(archive, error) from None  # gzip's "CRC check failed", bzip2's "Invalid data stream"
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, NotImplementedError,
            RuntimeError) as error:  # fmt: skip
        raise damaged(archive, error) from None


def damaged(archive: str, error: BaseException) -> DataError:
    return DataError(f"{archive}: damaged or cut short ({error}); download it again")


def dangling_link(path: Path) -> DataError:
    return DataError(f"{path}: a link to {os.readlink(path)}, which does not exist; remove it or restore its target")
