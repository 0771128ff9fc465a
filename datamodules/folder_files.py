"""The files of labelled image folders (`<split>/<class>/<image>`): find them, read and check them, and find the
pictures that two classes or two splits hold byte for byte.

Used by `datamodules.image_folder` (`python -m scripts.train fit --config configs/birds.yaml`); any
DataModule over a folder of class subfolders can use it. Every mistake is a `DataError` that
names the path: folders named like splits but not one, images outside class folders, classes that differ between
splits, empty classes, a file that links (symbolic or hard) would read under two labels or in two splits, files that
do not decode (all of them in one message, found before training starts).
"""

from __future__ import annotations

import hashlib
import os
import sys
import unicodedata
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from datamodules.errors import DataError
from datamodules.preprocessing.images import FORMATS, hidden, ignored, is_image, open_image, pixels

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


def predict_files(predict_path: str | None, say: bool) -> list[Path]:
    """The images to predict of `predict_path` (a folder, at any depth, or one image); `say`: name what is skipped."""
    if predict_path is None:
        raise DataError("predict needs data.init_args.predict_path: a folder of images or one image")
    path = Path(predict_path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError(f"{path}: no such file or folder; give predict_path a folder of images or one image")
    found = files_below(path)
    # A file that is no image (notes.txt, a zip of the same photos) is named and skipped, as MNIST's predict and
    # scripts.score skip it: it refused the whole folder. A damaged image is still refused, by check_readable.
    files = [file for file in found if is_image(file)]
    if not files:
        raise DataError(f"{path}: no images in this folder")
    skipped = [file for file in found if file not in files]
    if skipped and say:
        more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        print(f"{skipped[0]}{more}: not an image ({FORMATS}): skipped, no answer for it", file=sys.stderr)
    return files


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
    the layout torch's uint8 antialiased resize runs fastest on (the training crop: less time, the same pixels;
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


def check_colour(trained: float | None, files: list[Path], predict_path: str) -> None:
    """Predict refuses colour pictures for a network trained on grey ones only (digits or scans), and a folder of grey
    pictures only for one trained on colour ones only (photos): it answers them with confidence, a photo of a bird
    classed as the digit "0". `trained`: the share of colour among the checkpoint's training images (None: unknown); a
    black and white photo for a network of colour ones is refused too (its answers would be a guess)."""
    if trained not in (0, 1):
        return
    given = colour_share(files)
    if (trained == 0 and given > 0.5) or (trained == 1 and given == 0):
        found, learnt = ("colour", "grey") if trained == 0 else ("grey", "colour")
        raise DataError(
            f"{predict_path}: {found} pictures, but this checkpoint was trained on {learnt} images only (another "
            "task's data?); give it images like its training data, or give --ckpt_path a checkpoint trained on "
            "pictures like these (make predict takes the newest trained on the config's data_dir)"
        )


def check_readable(paths: list[Path]) -> None:
    """One DataError listing every file that does not decode, so a run never dies mid-epoch on one. A file is an
    image by its bytes, not its name: a JPEG named .jfif or .JPE is read, a text file named .jpg is refused."""
    bad = [(path, reason) for path in paths if (reason := decode(path)[1]) is not None]
    if bad:
        lines = "; ".join(f"{path} ({reason})" for path, reason in bad)
        raise DataError(f"{len(bad)} file(s) are not readable images: {lines}; remove or replace them")


def dangling_link(path: Path) -> DataError:
    return DataError(f"{path}: a link to {os.readlink(path)}, which does not exist; remove it or restore its target")


# ---- byte-identical copies of one picture in two classes or two splits (scraped data sets hold them) ----
# A copy under two labels is a DataError, a copy of a training picture in val/ or test/ is left out of it. Cheap on
# large folders: one stat a file for its size; of the files whose size a file of another class or split shares (many:
# photos of one size and quality have sizes within a few KB), the last 4 KB are read, and only the files whose size
# and tail another class's or split's file shares are read whole and hashed. Nothing is decoded.
Place = tuple[str, str]  # (split, class)
File = tuple[Path, Place, tuple[int, int], int]  # (path, place, (device, inode), size)
TAIL = 4096  # bytes: a JPEG's or PNG's last ones are compressed pixels, which differ between two pictures


def copies(splits: dict[str, dict[str, list[Path]]]) -> list[tuple[Path, Place, Path, Place]]:
    """(path, its place, the earlier file it copies, that file's place) for each file that repeats, byte for byte, a
    file of another class or split listed before it (train first); copies within one class of one split are not
    looked for (harmless: that picture weighs twice)."""
    files: list[File] = []
    for split, classes in splits.items():
        for name, paths in classes.items():
            for path in paths:
                stat = os.stat(path)
                files.append((path, (split, name), (stat.st_dev, stat.st_ino), stat.st_size))
    tails, digests = {}, {}  # by (device, inode): a file's hard links are read once
    files = shared(files, lambda file: file[3])
    files = shared(files, lambda file: (file[3], cached(tails, file, tail)))
    first: dict[bytes, tuple[Path, Place]] = {}
    found = []
    for file in files:  # in the order listed: train's before val's
        path, place = file[:2]
        original, where = first.setdefault(cached(digests, file, digest), (path, place))
        if where != place:
            found.append((path, place, original, where))
    return found


def shared(files: list[File], key: Callable[[File], object]) -> list[File]:
    """The files (in their order) whose `key` a file of another place shares."""
    places = defaultdict(set)
    keys = [key(file) for file in files]
    for file, value in zip(files, keys):
        places[value].add(file[1])
    return [file for file, value in zip(files, keys) if len(places[value]) > 1]


def cached(cache: dict, file: File, read: Callable[[Path], bytes]) -> bytes:
    """`read(path)` of the file, once per inode."""
    if file[2] not in cache:
        cache[file[2]] = read(file[0])
    return cache[file[2]]


def tail(path: Path) -> bytes:
    """A hash of the last TAIL bytes (kept for every file whose size is shared: a hash, not the bytes, in memory)."""
    with path.open("rb") as file:
        file.seek(max(0, os.fstat(file.fileno()).st_size - TAIL))
        return hashlib.blake2b(file.read(), digest_size=16).digest()


def digest(path: Path) -> bytes:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "blake2b").digest()


def without_copies(
    splits: dict[str, dict[str, list[Path]]],
) -> tuple[dict[str, dict[str, list[Path]]], list[tuple[Path, Place, Path, Place]]]:
    """`splits` without the copies of an earlier split's pictures of the same class (the first split keeps its
    own), and those left out. One picture in two classes is a DataError naming every such pair: which label is
    right only its owner can tell. A class that the copies would leave empty is a DataError too."""
    found = copies(splits)
    twice = [(path, place, original, where) for path, place, original, where in found if place[1] != where[1]]
    if twice:
        pairs = "; ".join(
            f"{path} = {original} ({where[1]!r} in {where[0]}, {place[1]!r} in {place[0]})"
            for path, place, original, where in twice
        )
        raise DataError(
            f"{len(twice)} picture(s) labelled twice, byte-identical files in two classes: {pairs}; remove each "
            "from the class it does not belong to"
        )
    dropped = {path for path, *_ in found}
    kept = {split: {name: [p for p in files if p not in dropped] for name, files in classes.items()}
            for split, classes in splits.items()}  # fmt: skip
    for path, (split, name), original, _ in found:
        if not kept[split][name]:
            raise DataError(
                f"{path.parent}: every picture of class {name!r} in {split} is a byte-identical copy of one in an "
                f"earlier split (such as {original}); add pictures of it that the others do not hold"
            )
    return kept, found


def left_out_lines(found: list[tuple[Path, Place, Path, Place]]) -> list[str]:
    """One line a split from which `without_copies` left copies out: the first, the count, and why."""
    lines = []
    for split in dict.fromkeys(place[0] for _, place, _, _ in found):
        ours = [(path, original, where) for path, place, original, where in found if place[0] == split]
        path, original, _ = ours[0]
        more = f" and {len(ours) - 1} more" if len(ours) > 1 else ""
        earlier = sorted({where[0] for _, _, where in ours}, key=["train", "val"].index)
        seen = " or ".join({"train": "trained", "val": "validated"}[name] for name in earlier)
        lines.append(
            f"{path}{more}: byte-identical to pictures in {' and '.join(earlier)} (this one to {original}): left out "
            f"of {split}, which would score the network on pictures it was {seen} on"
        )
    return lines
