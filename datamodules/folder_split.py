"""An image folder's split as a rule on files, and what names the images a run saw. A file's side (training or
validation, in a folder without val/) is a function of the file alone: a seeded 64-bit hash of its bytes
(datamodules/base.py's rule, as a table row's), per class, so renaming a picture moves it nowhere, exact copies share a
side and adding pictures moves no other one. The identity (the classes' and files' digest, the rule, the schema,
each split's digest and count, and each file's content and path hash with its split) goes in every checkpoint.

    python -m scripts.train fit --config configs/birds.yaml --data.init_args.data_dir my_photos/
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch

from datamodules import base
from datamodules.errors import DataError

FOLDERS = "split folders"  # the rule of a data_dir of train/ and val/: its folders are the split
Pictures = dict[str, dict[str, list[Path]]]  # split -> class -> files


def held_out_by_hash(seed: int, hashes: np.ndarray, fraction: float) -> np.ndarray:
    """Which of `hashes` (a class's images, or all) a share below `fraction` holds out; where none is on one side (a
    few images), the lowest share is held out, or the highest kept (with its copies); none if all are alike."""
    shares = base.hash_shares(seed, hashes)
    held = shares < fraction
    if not held.any():
        held = shares == shares.min()
    if held.all():
        held &= shares != shares.max()
    return held


def content_hash(data: bytes) -> int:
    """A 64-bit hash of bytes (a file's, an image's pixels): what an image's split and the data's digest are made of."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def image_schema(channels: int, size: int | str, classes: list[str]) -> dict:
    """The schema of images a network sees (channels x size x size) and their classes: an image task's identity's."""
    return {"image": f"image {channels}x{size}x{size}", "label": f"label: {', '.join(classes)}"}


def file_hashes(splits: Pictures) -> dict[Path, int]:
    """Each file's 64-bit hash of its bytes (content_hash), read once per inode (hard links: once)."""
    by_inode: dict[tuple[int, int], int] = {}
    hashes = {}
    for classes in splits.values():
        for files in classes.values():
            for path in files:
                stat = os.stat(path)
                key = (stat.st_dev, stat.st_ino)
                if key not in by_inode:
                    by_inode[key] = content_hash(path.read_bytes())
                hashes[path] = by_inode[key]
    return hashes


def hash_split(files: list[Path], hashes: np.ndarray, rule: dict, where: Path) -> tuple[list[Path], list[Path]]:
    """(kept, held out) of one class's files by `rule` (base.split_rule's: held_out_by_hash). Pictures added to a
    class of a few may move the one it held out for want of others: a later command's check (split_check.py) leaves
    out of validation what a checkpoint trained on."""
    held = held_out_by_hash(rule["seed"], hashes, rule["val_fraction"])
    if not held.any():
        raise DataError(
            f"{where}: {len(files)} image(s), {len(np.unique(hashes))} different, cannot be split into training and "
            f"validation with data.init_args.val_fraction {rule['val_fraction']}; add images or give separate train/ "
            "and val/ folders"
        )
    return [f for f, h in zip(files, held) if not h], [f for f, h in zip(files, held) if h]


def split_train(images: Pictures, hashes: dict[Path, int], rule: dict, train_dir: Path) -> Pictures:
    """`images` (train, test where present) with validation held out of train by `rule`: the hash rule, or a seeded
    permutation (a checkpoint's older than it: datamodules/permuted_split.py)."""
    parts = {}
    for name, paths in images["train"].items():
        if rule["method"] == base.METHOD:
            parts[name] = hash_split(
                paths, np.array([hashes[p] for p in paths], dtype=np.uint64), rule, train_dir / name
            )
        else:
            from datamodules.permuted_split import seeded_split

            parts[name] = seeded_split(paths, rule["val_fraction"], rule["seed"], train_dir / name)
    train, val = ({name: part[i] for name, part in parts.items()} for i in (0, 1))
    return {"train": train, "val": val} | {split: images[split] for split in images if split == "test"}


def path_key(path: Path, root: Path) -> int:
    """A 64-bit hash of a file's path below data_dir: an edited picture is the same path with other bytes."""
    return content_hash(path.relative_to(root).as_posix().encode())


def folder_identity(root: Path, pictures: Pictures, hashes: dict[Path, int], rule: dict, schema: dict) -> dict:
    """base.data_identity of the pictures: the digest of the sorted (class, file hash) pairs and of each split's, and
    `files`, each file's (content hash, path hash, split index: 0 train, 1 val, 2 test), for a later command to say
    what was added, removed or edited and to leave out of its held-out splits what the checkpoint trained on. Without
    a test/ folder, `test` is the validation split (what `test` scores)."""
    rows = [(index, name, path) for index, split in enumerate(base.SPLITS)
            for name, paths in pictures.get(split, {}).items() for path in paths]  # fmt: skip
    content = np.array([hashes[path] for _, _, path in rows], dtype=np.uint64)
    keys = np.array([content_hash(name.encode() + b"\0" + int(h).to_bytes(8, "little"))
                     for (_, name, _), h in zip(rows, content)], dtype=np.uint64)  # fmt: skip
    splits = np.array([index for index, _, _ in rows], dtype=np.int64)
    parts = tuple(torch.from_numpy((splits == index).nonzero()[0]) for index in range(len(base.SPLITS)))
    identity = base.data_identity(str(root), keys, None, rule, schema, parts)
    if "test" not in pictures:
        identity["splits"]["test"] = {**identity["splits"]["val"], "source": "the validation split (no test/ folder)"}
    paths = np.array([path_key(path, root) for _, _, path in rows], dtype=np.uint64)
    files = np.stack([content.view(np.int64), paths.view(np.int64), splits], axis=1).reshape(-1, 3)
    identity["files"] = torch.from_numpy(files)
    return identity


def leave_out(pictures: Pictures, hashes: dict[Path, int], root: Path, contents: set[int], paths: set[int]) -> dict:
    """Takes out of `pictures`' val and test each file whose bytes (`contents`) or path below `root` (`paths`: a
    picture edited since) a checkpoint trained on; returns those files, by split."""
    left: dict[str, list[Path]] = {}
    for split in ("val", "test"):
        for name, files in pictures.get(split, {}).items():
            trained = [f for f in files if hashes[f] in contents or path_key(f, root) in paths]
            pictures[split][name] = [f for f in files if f not in trained]
            left.setdefault(split, []).extend(trained)
    return {split: files for split, files in left.items() if files}
