"""Byte-identical copies of one picture in two classes or two splits of a labelled image folder (scraped data sets
hold them): a copy under two labels is a DataError, a copy of a training picture in val/ or test/ is left out of it.

Cheap on large folders: one stat a file for its size; of the files whose size a file of another class or split
shares (many: photos of one size and quality have sizes within a few KB), the last 4 KB are read, and only the files
whose size and tail another class's or split's file shares are read whole and hashed. Nothing is decoded.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from datamodules.errors import DataError

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
