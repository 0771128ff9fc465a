"""Birds' image folders: layouts and their errors (each names the path), archives, crops and batches.

.venv/bin/python -m pytest -q tests/test_birds_data.py
"""

from __future__ import annotations

import re
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from torchvision.io import write_png

from datamodules.errors import DataError
from datamodules.image_folder import ImageFolderDataModule
from tests.conftest import CLASSES, bird_folders, birds_data, write_images

# ---- layouts ---------------------------------------------------------------------------------------------------


def test_train_val_folders_give_sorted_classes_and_labels(tmp_path):
    root = bird_folders(tmp_path / "birds")
    dm = birds_data(root)
    assert dm.class_names == list(CLASSES)  # known right after __init__: the CLI links it into the model
    dm.setup("fit")
    files, labels = dm.splits["train"]
    assert len(files) == 12 and all(f.parent.parent == root / "train" for f in files)
    assert all(CLASSES[label] == f.parent.name for f, label in zip(files, labels))
    assert {f.parent.parent for f in dm.splits["val"][0]} == {root / "val"}
    dm.setup("test")
    assert dm.splits["test"] == dm.splits["val"]  # no test/: the validation images


def test_test_folder_is_used_when_present(tmp_path):
    root = bird_folders(tmp_path / "birds", splits=("train", "val", "test"), count=2)
    dm = birds_data(root)
    dm.setup("test")
    assert {f.parent.parent for f in dm.splits["test"][0]} == {root / "test"}


def test_one_folder_is_split_by_a_seeded_fraction_of_each_class(tmp_path):
    root = tmp_path / "birds"
    for channel, name in enumerate(CLASSES):
        write_images(root / name, 10, channel)

    def split(seed: int) -> tuple[set[Path], set[Path]]:
        dm = birds_data(root, val_fraction=0.3, seed=seed)
        dm.setup("fit")
        return set(dm.splits["train"][0]), set(dm.splits["val"][0])

    train, val = split(seed=1)
    assert not train & val and len(train | val) == 20
    assert all(1 <= sum(f.parent.name == name for f in val) <= 9 for name in CLASSES)  # each file by its hash
    assert split(seed=1) == (train, val)
    assert split(seed=2)[1] != val


SPLIT_LIKE = [  # (the split folders made, the one blamed, what became of it, the fix)
    (("train", "valid"), "valid", "ignored", "rename it val/"),  # Roboflow's export: validated on a slice of train/
    (("train", "val", "Test"), "Test", "ignored", "rename it test/"),
    (("train", "val", "validation"), "validation", "ignored", "move its class folders into val/"),
    (("Train", "Val"), "Train", "read as a class 'Train'", "rename it train/"),  # classes 'Train' and 'Val'
]


@pytest.mark.parametrize("splits, blamed, fate, fix", SPLIT_LIKE, ids=["+".join(case[0]) for case in SPLIT_LIKE])
def test_a_folder_named_like_a_split_but_not_one_is_one_line_naming_it(tmp_path, splits, blamed, fate, fix):
    """Other tools' split names were read as classes (a network taught to tell training pictures from validation
    ones) or not at all (validation held out of train/ instead), without a word."""
    root = bird_folders(tmp_path / "birds", splits=splits, count=2)
    with pytest.raises(DataError) as error:
        birds_data(root).setup("fit")
    assert str(error.value) == (
        f"{root / blamed}: named like a split, but data_dir's splits are train/, val/, test/ (it would be {fate}); "
        f"{fix}"
    )


def test_a_split_folder_whose_name_differs_only_in_case_is_read_where_the_disk_ignores_case(tmp_path):
    """macOS's and Windows' disks open `val/` as `Val/`: the folder is read as the split (a link stands in here)."""
    root = bird_folders(tmp_path / "birds", count=2)
    (root / "Val").symlink_to("val")
    dm = birds_data(root)
    dm.setup("fit")
    assert len(dm.splits["val"][0]) == 4


# ---- errors: each names the path ----------------------------------------------------------------------------------


def test_images_outside_class_folders_are_not_labelled(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    write_images(root / "train", 1, 0, start=0)  # train/0.png next to the class folders
    with pytest.raises(DataError, match="not labelled") as error:
        birds_data(root).setup("fit")
    assert str(root / "train") in str(error.value) and "0.png" in str(error.value)


def test_train_and_val_with_different_classes(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    write_images(root / "val" / "ducks", 2, 2)
    with pytest.raises(DataError, match="different classes") as error:
        birds_data(root).setup("fit")
    message = str(error.value)
    assert "ducks" in message and str(root / "val") in message and str(root / "train") in message


def test_a_class_without_images(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    for path in (root / "val" / "turkeys").iterdir():
        path.unlink()
    with pytest.raises(DataError, match="no images") as error:
        birds_data(root).setup("fit")
    assert str(root / "val" / "turkeys") in str(error.value)


def test_a_split_without_class_folders(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    shutil.rmtree(root / "val")
    (root / "val").mkdir()
    with pytest.raises(DataError, match="no class subfolders") as error:
        birds_data(root).setup("fit")
    assert str(root / "val") in str(error.value)


@pytest.mark.parametrize("name, twin", [("chickens", "chickens "), ("crème", "cre\u0300me")], ids=["space", "nfd"])
def test_class_folders_named_alike_but_for_spaces_or_unicode_form_are_one_line(tmp_path, name, twin):
    """`chickens ` (a trailing space) beside `chickens`, or `crème` as macOS writes it (e and a combining accent)
    beside `crème` as Linux does, were two classes of one: the network taught to tell a picture from itself."""
    root = bird_folders(tmp_path / "birds", count=2)
    for split in ("train", "val"):
        for folder in (name, twin):
            write_images(root / split / folder, 2, 2)
    with pytest.raises(DataError) as error:
        birds_data(root).setup("fit")
    first, second = sorted((name, twin))
    assert str(error.value) == (
        f"{root / 'train' / second}: named {second!r}, as {first!r} is but for spaces or Unicode form (one class read "
        f"as two); move its images into {root / 'train' / first} and remove it"
    )


def test_class_folders_named_alike_but_for_case_are_two_classes_told_of(tmp_path, capsys):
    """`A` and `a` are two classes of a letters data set, `Chickens` and `chickens` a merge gone wrong: one line."""
    root = bird_folders(tmp_path / "birds", count=2)
    for split in ("train", "val"):
        write_images(root / split / "Chickens", 2, 2)
    dm = birds_data(root)
    dm.setup("fit")
    assert dm.class_names == ["Chickens", "chickens", "turkeys"]
    assert capsys.readouterr().err.splitlines() == [
        f"{root / 'train' / 'Chickens'} and {root / 'train' / 'chickens'}: class folders named alike but for case, "
        "trained as two classes; move one's images into the other if they are one"
    ]
    (root / "val" / "Chickens").rename(root / "val" / "Chickens ")  # in another split: the classes differ, and how
    with pytest.raises(DataError) as error:
        birds_data(root).setup("fit")
    assert str(error.value) == (
        f"{root / 'train'} and {root / 'val'} have different classes: ['Chickens'] only in {root / 'train'}; "
        f"['Chickens '] only in {root / 'val'}; 'Chickens' and 'Chickens ' differ only in case, spaces or Unicode "
        "form; give both the same"
    )


def test_missing_data_dir(tmp_path):
    with pytest.raises(DataError, match="no such folder") as error:
        _ = birds_data(tmp_path / "nowhere").class_names
    assert str(tmp_path / "nowhere") in str(error.value)


def test_every_unreadable_file_is_reported_at_setup_in_one_error(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    good = (root / "train" / "chickens" / "1.jpg").read_bytes()
    bad = {
        root / "train" / "chickens" / "truncated.jpg": good[: len(good) // 2],
        root / "train" / "turkeys" / "text.jpg": b"not an image at all",
        root / "val" / "chickens" / "empty.png": b"",
        root / "val" / "turkeys" / "notes.txt": b"a stray file",
    }
    for path, data in bad.items():
        path.write_bytes(data)
    dm = birds_data(root)
    with pytest.raises(DataError, match="4 file") as error:
        dm.setup("fit")
    assert all(str(path) in str(error.value) for path in bad)
    assert "truncated" in str(error.value)  # torchvision's reason comes along


def test_a_photo_is_an_image_by_its_bytes_whatever_its_suffix(tmp_path):
    """Windows and browsers save JPEGs as .jfif or .jpe: set-up refused them, and with them the whole run, as "not a
    JPG/JPEG/PNG/WEBP file by its name"; a photo with no suffix too, and a loose .jfif beside the class folders was
    passed over rather than named as not labelled."""
    root = bird_folders(tmp_path / "birds", count=2)
    renamed = {"train/chickens/1.jpg": "1.jfif", "train/turkeys/1.jpg": "1.JPE", "val/chickens/1.jpg": "1.JPG",
               "val/turkeys/0.png": "photo"}  # fmt: skip
    for name, new in renamed.items():
        (root / name).rename((root / name).with_name(new))
    dm = birds_data(root, predict_path=str(root / "train" / "turkeys"))
    dm.setup("fit")
    files = {path.relative_to(root).as_posix() for split in ("train", "val") for path in dm.splits[split][0]}
    assert {str(Path(name).with_name(new).as_posix()) for name, new in renamed.items()} <= files
    dm.setup("predict")
    assert sorted(Path(name).name for name in dm.predict_names) == ["0.png", "1.JPE"]
    shutil.copy(root / "train" / "chickens" / "1.jfif", root / "train" / "stray.jfif")
    with pytest.raises(DataError, match=r"images not labelled \(stray.jfif lie directly in it\)"):
        birds_data(root).setup("fit")


def test_predict_names_and_skips_a_file_that_is_no_image_and_refuses_a_damaged_one(tmp_path, capsys):
    """A notes.txt or a zip beside the photos refused the whole predict, where MNIST's predict and scripts.score skip
    it saying so; a photo that does not decode is still refused, by name."""
    write_images(tmp_path / "photos", 2, 0)
    (tmp_path / "photos" / "notes.txt").write_text("taken at dawn\n")
    (tmp_path / "photos" / "more").mkdir()
    (tmp_path / "photos" / "more" / "all.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    dm = birds_data(tmp_path / "nowhere", classes=list(CLASSES), predict_path=str(tmp_path / "photos"))
    dm.setup("predict")
    assert [Path(name).name for name in dm.predict_names] == ["0.png", "1.jpg"]
    assert capsys.readouterr().err == (
        f"{tmp_path / 'photos' / 'more' / 'all.zip'} and 1 more: not an image (JPEG, PNG, WebP or GIF): skipped, no "
        "answer for it\n"
    )
    (tmp_path / "photos" / "2.jpg").write_bytes(b"\xff\xd8 not really")
    with pytest.raises(DataError, match=r"1 file\(s\) are not readable images: \S+/2.jpg"):
        birds_data(tmp_path / "nowhere", classes=list(CLASSES), predict_path=str(tmp_path / "photos")).setup("predict")


def test_without_verify_images_a_bad_file_fails_when_its_batch_is_loaded(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    broken = root / "train" / "chickens" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really")
    dm = birds_data(root, verify_images=False, batch_size=8)
    dm.setup("fit")  # no decode pass
    with pytest.raises(DataError, match=f"{re.escape(str(broken))}: not a readable image"):
        list(dm.train_dataloader())


def test_dot_files_and_windows_explorer_s_files_are_no_one_s_data(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    (root / "train" / "._0.jpg").write_bytes(b"\x00\x05\x16\x07 a macOS resource fork")
    (root / "train" / "chickens" / "._1.jpg").write_bytes(b"\x00\x05\x16\x07 a macOS resource fork")
    # Windows Explorer's, in every folder of photos it showed: they ended set-up as "not readable images", or, with
    # verify_images false, the run when their batch came.
    (root / "train" / "turkeys" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0 a thumbnail cache")
    (root / "val" / "chickens" / "desktop.ini").write_text("[.ShellClassInfo]\n")
    write_images(tmp_path / "photos", 1, 0)
    (tmp_path / "photos" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0 a thumbnail cache")
    dm = birds_data(root, predict_path=str(tmp_path / "photos"))
    dm.setup("fit")
    dm.setup("predict")
    assert len(dm.splits["train"][0]) == 4 and len(dm.splits["val"][0]) == 4 and len(dm.predict_names) == 1


def test_linked_folders_are_followed_and_a_dangling_link_is_named(tmp_path):
    root = bird_folders(tmp_path / "birds", count=2)
    write_images(tmp_path / "elsewhere" / "more", 3, 0, start=10)
    (root / "train" / "chickens" / "more").symlink_to(tmp_path / "elsewhere" / "more")
    (root / "train" / "chickens" / "loop").symlink_to(root / "train" / "chickens")  # a cycle: read once, not forever
    write_images(tmp_path / "photos", 1, 0)
    (tmp_path / "photos" / "linked").symlink_to(tmp_path / "elsewhere" / "more")
    dm = birds_data(root, predict_path=str(tmp_path / "photos"))
    dm.setup("fit")
    files, labels = dm.splits["train"]
    assert sum(f.parent.name == "more" for f in files) == 3 and len(files) == 7
    dm.setup("predict")
    assert len(dm.predict_names) == 4
    (root / "val" / "turkeys" / "gone.jpg").symlink_to(tmp_path / "deleted.jpg")
    with pytest.raises(DataError) as error:
        birds_data(root).setup("fit")
    assert str(error.value) == (
        f"{root / 'val' / 'turkeys' / 'gone.jpg'}: a link to {tmp_path / 'deleted.jpg'}, which does not exist; remove "
        "it or restore its target"
    )


def test_a_class_folder_may_be_a_link_but_not_one_to_its_split_or_above(tmp_path):
    """A class linked in from elsewhere is a class; `train/loop -> ..` made a class 'loop' of every image of the
    dataset (`-> .`: of the split), trained on under two labels without a word."""
    root = bird_folders(tmp_path / "birds", count=2)
    for split in ("train", "val"):
        write_images(tmp_path / "elsewhere" / split / "geese", 2, 2)
        (root / split / "geese").symlink_to(tmp_path / "elsewhere" / split / "geese")
    dm = birds_data(root)
    assert dm.class_names == ["chickens", "geese", "turkeys"]
    dm.setup("fit")
    files, labels = dm.splits["train"]
    assert sorted(str(f) for f, label in zip(files, labels) if label == 1) == [
        str(root / "train" / "geese" / name) for name in ("0.png", "1.jpg")
    ]
    train, loop = root / "train", root / "train" / "loop"
    for target, holding in (("..", f"a folder holding {train}"), (".", f"{train} itself"),
                            (train, f"{train} itself"), (tmp_path, f"a folder holding {train}")):  # fmt: skip
        loop.symlink_to(target)
        with pytest.raises(DataError) as error:
            _ = birds_data(root).class_names
        assert str(error.value) == (
            f"{loop}: a link to {target}, {holding} (a loop): every image below it would be read as class 'loop'; "
            "remove the link"
        )
        loop.unlink()


TWICE = [  # (link, its target, the path blamed, the path spared, what is wrong), paths below the dataset
    ("train/hens", "chickens", "train/hens/0.png", "train/chickens/0.png", "labelled both 'chickens' and 'hens'"),
    ("train/chickens/more", "../turkeys", "train/chickens/more/0.png", "train/turkeys/0.png",
     "labelled both 'turkeys' and 'chickens'"),
    ("train/chickens/x.jpg", "../turkeys/1.jpg", "train/chickens/x.jpg", "train/turkeys/1.jpg",
     "labelled both 'turkeys' and 'chickens'"),
    ("train/chickens/more", "../geese", "train/chickens/more/0.png", "train/geese/0.png",
     "labelled both 'geese' and 'chickens'"),  # the link into geese is blamed, not geese's own link from elsewhere
    ("train/chickens/extra", "../../val/chickens", "train/chickens/extra/0.png", "val/chickens/0.png",
     "both trained on and scored in val"),
    ("train/turkeys/t.jpg", "../../test/chickens/1.jpg", "train/turkeys/t.jpg", "test/chickens/1.jpg",
     "both trained on and scored in test"),
    ("val/chickens/more", "../../test/chickens", "val/chickens/more/0.png", "test/chickens/0.png",
     "in both val and test"),
]  # fmt: skip


@pytest.mark.parametrize("link, target, blamed, spared, what", TWICE, ids=[" -> ".join(case[:2]) for case in TWICE])
def test_a_file_read_under_two_labels_or_in_two_splits_is_one_line_naming_both(tmp_path, link, target, blamed, spared,
                                                                               what):  # fmt: skip
    """A link to another class's or split's folder or file read its pictures again: the model was taught two
    answers to one picture, or validated (tested) on pictures it was trained on, without a word. A class folder
    linked in from elsewhere stays a class."""
    root = bird_folders(tmp_path / "birds", splits=("train", "val", "test"), count=2)
    write_images(tmp_path / "elsewhere" / "geese", 2, 2)
    (root / "train" / "geese").symlink_to(tmp_path / "elsewhere" / "geese")
    for split in ("val", "test"):
        write_images(root / split / "geese", 2, 2, start=2)
    birds_data(root).setup("fit")
    (root / link).symlink_to(target)
    with pytest.raises(DataError) as error:  # at fit for test/ too: it is listed with the other splits
        birds_data(root).setup("fit")
    via = f"a link to {target}" if blamed == link else f"through {root / link}, a link to {target}"
    assert str(error.value) == (
        f"{root / blamed}: the same file as {root / spared} ({via}): one picture {what}; remove the link"
    )


HARD = [  # (a new name, the file it names too, what is wrong): the later path in split and class order is blamed
    ("train/chickens/x.jpg", "train/turkeys/1.jpg", "train/turkeys/1.jpg", "train/chickens/x.jpg",
     "labelled both 'chickens' and 'turkeys'"),
    ("val/chickens/t.jpg", "train/chickens/1.jpg", "val/chickens/t.jpg", "train/chickens/1.jpg",
     "both trained on and scored in val"),
    ("test/turkeys/v.png", "val/turkeys/0.png", "test/turkeys/v.png", "val/turkeys/0.png", "in both val and test"),
]  # fmt: skip


@pytest.mark.parametrize("name, target, blamed, spared, what", HARD, ids=[" = ".join(case[:2]) for case in HARD])
def test_a_hard_link_read_under_two_labels_or_in_two_splits_is_one_line_naming_both(tmp_path, name, target, blamed,
                                                                                    spared, what):  # fmt: skip
    """A hard link (one file, two directory entries: `ln`, `cp -l`, a backup tool's copy) has no target for realpath
    to find: the picture was taught under two labels, or scored in val on a training picture, without a word."""
    root = bird_folders(tmp_path / "birds", splits=("train", "val", "test"), count=2)
    (root / "train" / "turkeys" / "again.jpg").hardlink_to(root / "train" / "turkeys" / "1.jpg")  # in one class...
    dm = birds_data(root)
    dm.setup("fit")
    assert len(dm.splits["train"][0]) == 5  # ...kept, as a copy is: scripts/bench/birds.py makes classes of them
    (root / name).hardlink_to(root / target)
    with pytest.raises(DataError) as error:
        birds_data(root).setup("fit")
    assert str(error.value) == (
        f"{root / blamed}: the same file as {root / spared} (a hard link: one file under two names): one picture "
        f"{what}; remove one of the two names"
    )


def test_a_file_reached_twice_in_one_class_is_read_once_and_never_in_both_splits(tmp_path):
    """One folder split by val_fraction put a file reached through two links in training and validation by chance."""
    root = tmp_path / "birds"
    for channel, name in enumerate(CLASSES):
        write_images(root / name, 6, channel)
        for i in range(6):
            (root / name / f"again{i}.png").symlink_to(f"{i}.{'jpg' if i % 2 else 'png'}")
    dm = birds_data(root, val_fraction=0.3)
    dm.setup("fit")
    train, val = dm.splits["train"][0], dm.splits["val"][0]
    assert not {f.resolve() for f in train} & {f.resolve() for f in val}  # 4 of 12 were in both
    assert len(train) + len(val) == 12 and {f.parent.name for f in val} == set(CLASSES)
    (root / "hens").symlink_to("chickens")  # two labels are refused in this layout as in train/
    with pytest.raises(DataError, match=re.escape(f"{root / 'hens' / '0.png'}: the same file as {root / 'chickens'}")):
        birds_data(root, val_fraction=0.3).setup("fit")
    (root / "hens").unlink()
    bird_folders(tmp_path / "split", count=2)  # with train/ and val/: a class's file twice is read once
    (tmp_path / "split" / "val" / "turkeys" / "again.jpg").symlink_to("1.jpg")
    dm = birds_data(tmp_path / "split")
    dm.setup("fit")
    assert len(dm.splits["val"][0]) == 4


def test_a_copy_of_a_picture_in_two_classes_is_one_line_naming_every_pair(tmp_path):
    """Scraped data sets hold byte-identical copies of one photo under two labels: the model was taught two answers
    for one picture without a word. Which label is right only the data's owner can tell."""
    root = bird_folders(tmp_path / "birds", splits=("train", "val", "test"), count=2)
    shutil.copy(root / "train" / "chickens" / "0.png", root / "train" / "turkeys" / "copy.png")
    shutil.copy(root / "val" / "chickens" / "1.jpg", root / "test" / "turkeys" / "copy.jpg")
    with pytest.raises(DataError) as error:
        birds_data(root).setup("fit")
    assert str(error.value) == (
        f"2 picture(s) labelled twice, byte-identical files in two classes: {root / 'train/turkeys/copy.png'} = "
        f"{root / 'train/chickens/0.png'} ('chickens' in train, 'turkeys' in train); {root / 'test/turkeys/copy.jpg'} "
        f"= {root / 'val/chickens/1.jpg'} ('chickens' in val, 'turkeys' in test); remove each from the class it does "
        "not belong to"
    )


def test_copies_of_training_pictures_are_left_out_of_val_and_test_in_one_line_each(tmp_path, capsys):
    """A copy of a training photo in val/ (or test/) scored the network on a picture it was trained on: a silently
    inflated accuracy. Copies within one class of one split weigh twice, harmless: kept."""
    root = bird_folders(tmp_path / "birds", splits=("train", "val", "test"), count=2)
    copies = {"val/chickens/c.jpg": "train/chickens/1.jpg", "test/turkeys/c.png": "train/turkeys/0.png",
              "test/turkeys/d.png": "val/turkeys/0.png", "train/turkeys/again.png": "train/turkeys/0.png"}  # fmt: skip
    for copy, original in copies.items():
        shutil.copy(root / original, root / copy)
    dm = birds_data(root)
    dm.setup("fit")
    dm.setup("test")
    assert root / "train/turkeys/again.png" in dm.splits["train"][0]
    assert {str(p.relative_to(root)) for p in dm.splits["val"][0]} == {
        f"val/{name}/{file}" for name in CLASSES for file in ("0.png", "1.jpg")
    }
    assert {str(p.relative_to(root)) for p in dm.splits["test"][0]} == {
        f"test/{name}/{file}" for name in CLASSES for file in ("0.png", "1.jpg")
    }
    assert capsys.readouterr().err.splitlines() == [
        f"{root / 'val/chickens/c.jpg'}: byte-identical to pictures in train (this one to "
        f"{root / 'train/chickens/1.jpg'}): left out of val, which would score the network on pictures it was "
        "trained on",
        f"{root / 'test/turkeys/c.png'} and 1 more: byte-identical to pictures in train and val (this one to "
        f"{root / 'train/turkeys/0.png'}): left out of test, which would score the network on pictures it was "
        "trained or validated on",
    ]
    for path in (root / "val" / "turkeys").iterdir():  # a class of copies only is left with nothing to score
        path.unlink()
        shutil.copy(root / "train" / "turkeys" / path.name, path)
    with pytest.raises(DataError) as error:
        birds_data(root).setup("fit")
    assert str(error.value) == (
        f"{root / 'val/turkeys'}: every picture of class 'turkeys' in val is a byte-identical copy of one in an "
        f"earlier split (such as {root / 'train/turkeys/0.png'}); add pictures of it that the others do not hold"
    )


def test_copies_in_one_class_split_by_val_fraction_are_never_on_both_sides(tmp_path):
    """One folder split by val_fraction put a photo's copy (or hard link) in training and its twin in validation."""
    root = tmp_path / "birds"
    for channel, name in enumerate(CLASSES):
        write_images(root / name, 6, channel)
        for original in list((root / name).iterdir()):
            copy = original.with_name(f"again{original.name}")
            if original.suffix == ".png":
                copy.hardlink_to(original)
            else:
                shutil.copy(original, copy)
    dm = birds_data(root, val_fraction=0.3)
    dm.setup("fit")
    train, val = dm.splits["train"][0], dm.splits["val"][0]
    assert len(train) + len(val) == 24 and {f.parent.name for f in val} == set(CLASSES)
    assert not {p.read_bytes() for p in train} & {p.read_bytes() for p in val}


# ---- archives -----------------------------------------------------------------------------------------------------


def test_archive_is_extracted_once_when_class_names_are_asked(tmp_path, monkeypatch):
    source = bird_folders(tmp_path / "fowl_data", count=2)
    archive = tmp_path / "fowl_data.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(source.rglob("*")):
            zf.write(path, path.relative_to(tmp_path))  # one top folder, fowl_data/, as the tutorial's zip
    target = tmp_path / "data" / "birds"
    dm = birds_data(target, archive=str(archive))
    assert dm.class_names == list(CLASSES)
    assert (target / "train" / "chickens" / "0.png").is_file()
    assert [p.name for p in target.parent.iterdir()] == ["birds"]  # no temporary folder left behind

    def extract(*args, **kwargs):
        raise AssertionError("extracted a second time")

    monkeypatch.setattr(zipfile.ZipFile, "extractall", extract)
    dm.prepare_data()
    birds_data(target, archive=str(archive)).setup("fit")


def test_archive_url_is_downloaded_and_extracted(tmp_path, serve):
    source = bird_folders(tmp_path / "served" / "images", count=2)
    with tarfile.open(tmp_path / "served" / "birds.tar.gz", "w:gz") as tar:
        for name in ("train", "val"):  # no top folder this time
            tar.add(source / name, arcname=name)
    url = f"{serve(tmp_path / 'served')}/birds.tar.gz"
    dm = birds_data(tmp_path / "birds", archive=url)
    dm.prepare_data()
    assert dm.class_names == list(CLASSES)
    assert len(list((tmp_path / "birds" / "val").rglob("*.png"))) == 2


def test_archive_that_does_not_exist(tmp_path):
    with pytest.raises(DataError, match="no such archive") as error:
        _ = birds_data(tmp_path / "birds", archive=str(tmp_path / "missing.zip")).class_names
    assert str(tmp_path / "missing.zip") in str(error.value)
    assert not (tmp_path / "birds").exists()


TUTORIAL_ZIP = "https://azureopendatastorage.blob.core.windows.net/testpublic/temp/fowl_data.zip"  # configs/birds.yaml


@pytest.mark.parametrize("kind", ["zip", "tar.gz", "tar"])
@pytest.mark.parametrize("archive", [TUTORIAL_ZIP, None], ids=["birds-config", "no-archive"])
def test_an_archive_given_as_data_dir_is_one_line_saying_to_give_it_as_archive(tmp_path, kind, archive):
    """A zip given as data_dir was 'a file, not a folder; give data_dir a folder to extract <the tutorial's URL>
    into' with the birds config (whose archive that is), and 'no such folder' without an archive."""
    source = bird_folders(tmp_path / "fowl_data", count=2)
    given = tmp_path / f"my_photos.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(given, "w") as zf:
            for path in sorted(source.rglob("*")):
                zf.write(path, path.relative_to(tmp_path))
    else:
        with tarfile.open(given, "w:gz" if kind == "tar.gz" else "w") as tar:
            tar.add(source, "fowl_data")
    before = given.read_bytes()
    with pytest.raises(DataError) as error:
        _ = birds_data(given, archive=archive).class_names
    assert str(error.value) == (
        f"{given}: a {'zip' if kind == 'zip' else 'tar'} archive, not a folder; give it as data.init_args.archive "
        f"{given}, and data.init_args.data_dir the folder to extract it into (e.g. {tmp_path / 'my_photos'})"
    )
    assert given.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["fowl_data", given.name]


@pytest.mark.parametrize("archive", [TUTORIAL_ZIP, None], ids=["birds-config", "no-archive"])
def test_a_file_given_as_data_dir_is_no_folder_and_no_archive(tmp_path, archive):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(DataError) as error:
        _ = birds_data(notes, archive=archive).class_names
    assert str(error.value) == (
        f"{notes}: a file, not a folder; give data.init_args.data_dir a folder of labelled images (a folder of "
        "images per class, or train/ and val/ of them)"
    )


def damage(tmp_path: Path, kind: str) -> Path:
    """A bird archive spoiled as downloads and copies spoil them."""
    source = bird_folders(tmp_path / "fowl_data", count=2)
    if kind.startswith("zip"):
        archive = tmp_path / "birds.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(source.rglob("*")):
                zf.write(path, path.relative_to(tmp_path))
            member = next(info for info in zf.infolist() if not info.is_dir())
        data = bytearray(archive.read_bytes())
        if kind == "zip-damaged":  # the first deflate block's type becomes 3, which does not exist
            start = member.header_offset + 30 + len(member.filename.encode()) + len(member.extra)
            data[start] |= 0x06
        else:
            data = data[: len(data) // 2]
    else:
        archive = tmp_path / ("birds.tar" if kind == "tar-truncated" else "birds.tar.gz")
        with tarfile.open(archive, "w" if kind == "tar-truncated" else "w:gz") as tar:
            tar.add(source, "fowl_data")
        data = bytearray(archive.read_bytes())
        if kind == "tar.gz-flipped":  # two bytes in the middle: deflate may decode them, gzip's CRC-32 may not
            data[len(data) // 2] ^= 0x01
            data[len(data) // 2 + 1] ^= 0x01
        else:
            data = data[: len(data) // 2 + 100]
    archive.write_bytes(data)
    return archive


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("tar.gz-flipped", r"damaged or cut short \((CRC check failed|Error -3 while decompressing)"),
        ("tar.gz-truncated", r"damaged or cut short \(Compressed file ended before the end-of-stream marker"),
        (
            "tar-truncated",
            r"a damaged or cut-short tar archive \((unexpected end of data|empty header|truncated header)",
        ),
        ("zip-damaged", r"damaged or cut short \(Error -3 while decompressing data: invalid block type"),
        ("zip-truncated", r"a zip archive without its central directory \(cut short\?\)"),
    ],
)
def test_a_damaged_or_truncated_archive_is_one_error_naming_it_and_why(tmp_path, kind, reason):
    archive = damage(tmp_path, kind)
    with pytest.raises(DataError, match=rf"^{re.escape(str(archive))}: {reason}.*; download it again$"):
        _ = birds_data(tmp_path / "data" / "birds", archive=str(archive)).class_names
    assert not (tmp_path / "data" / "birds").exists() and not list((tmp_path / "data").iterdir())


# ---- transforms and batches ---------------------------------------------------------------------------------------


def test_batches_are_cropped_uint8_then_normalised_on_the_device(tmp_path):
    root = tmp_path / "birds"
    for split in ("train", "val"):
        for channel, name in enumerate(CLASSES):
            write_images(root / split / name, 3, channel, size=(48, 80))  # not square, not 32
    write_images(tmp_path / "photos", 3, 0, size=(100, 60))
    dm = birds_data(root, predict_path=str(tmp_path / "photos"))
    dm.setup("fit")
    dm.setup("predict")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8 and labels.dtype == torch.long
    images, labels = dm.on_after_batch_transfer((images, labels), 0)
    assert images.dtype == torch.float32 and images.min() < 0 < images.max()
    (val_images, _) = next(iter(dm.val_dataloader()))
    assert val_images.shape == (4, 3, 32, 32)
    (batch,) = [b for b in dm.predict_dataloader()][:1]
    assert len(batch) == 1 and batch[0].shape == (3, 3, 32, 32)
    assert dm.predict_names == [str(tmp_path / "photos" / f"{i}.{'jpg' if i % 2 else 'png'}") for i in range(3)]


def test_a_photo_is_read_as_a_view_of_pillow_s_pixels_and_cropped_as_a_contiguous_copy_would_be(tmp_path):
    """decode hands the crops a channels-last (3, H, W) view instead of a transposed copy. The training crop runs
    faster on it; that it gives the same pixels is torch's uint8 resize behaving alike for both layouts, which this
    checks (it fails if a torch release changes that). Evaluation's crop is the same for both layouts too."""
    import numpy as np
    from PIL import Image

    from datamodules.folder_files import decode

    write_images(tmp_path, 4, 1, size=(75, 100))
    dm = ImageFolderDataModule(image_size=32)
    for path in sorted(tmp_path.iterdir()):
        image, reason = decode(path)
        assert reason is None and image.shape == (3, 75, 100) and image.dtype == torch.uint8
        assert image.permute(1, 2, 0).is_contiguous() and image.numpy().flags.writeable  # (H, W, C) in memory
        with Image.open(path) as picture:
            assert torch.equal(image, torch.from_numpy(np.array(picture.convert("RGB"))).permute(2, 0, 1))
        copy = image.contiguous()
        for seed in range(5):
            crops = []
            for version in (image, copy):
                torch.manual_seed(seed)
                crops.append(dm.transform(train=True)(version))
            assert torch.equal(*crops)
        assert torch.equal(dm.transform(train=False)(image), dm.transform(train=False)(copy))


def test_evaluation_crop_is_the_centre(tmp_path):
    # Resize(256/224 * size) then CenterCrop(size): a centred square survives, its border does not.
    image = torch.zeros(3, 64, 64, dtype=torch.uint8)
    image[:, 16:48, 16:48] = 255
    out = ImageFolderDataModule(image_size=28).transform(train=False)(image)
    assert out.shape == (3, 28, 28)
    assert out[:, 14, 14].min() == 255 and out[:, 0, 0].max() == 0


def test_predict_needs_no_training_data_when_classes_are_given(tmp_path):
    write_images(tmp_path / "photos", 2, 0)
    (tmp_path / "photos" / ".DS_Store").write_bytes(b"junk")  # hidden files are skipped
    dm = birds_data(tmp_path / "nowhere", classes=["turkeys", "chickens"], predict_path=str(tmp_path / "photos"))
    assert dm.class_names == ["turkeys", "chickens"]
    dm.setup("predict")
    assert [Path(name).name for name in dm.predict_names] == ["0.png", "1.jpg"]
    with pytest.raises(DataError, match="no such folder"):
        dm.setup("fit")


def test_evaluation_and_predict_refuse_a_strip_of_a_picture_before_resizing_it():
    """The crop the registered model serves with: a 1 x 150,000 picture would become 37 x 5,550,000 at image_size 32."""
    from datamodules.image_folder import eval_transform

    with pytest.raises(DataError, match=r"^an image: 1x150000 pixels, which the centre crop would resize to 37x555"):
        eval_transform(32)(torch.zeros(3, 150_000, 1, dtype=torch.uint8))
    assert eval_transform(32)(torch.zeros(3, 20, 300, dtype=torch.uint8)).shape == (3, 32, 32)


def test_a_transform_s_refusal_of_an_image_names_its_file(tmp_path, monkeypatch):
    """Evaluation's crop refuses a strip about "an image" (it has the pixels only) and any transform's DataError
    says nothing of the file: ImageFiles names it, so the run's one line says which of the folder's files it is."""
    import pickle

    from datamodules.image_folder import ImageFiles, eval_transform
    from datamodules.preprocessing.images import ImageError

    root = bird_folders(tmp_path / "birds", count=2)
    strip = root / "val" / "turkeys" / "strip.png"
    write_png(torch.full((3, 1, 60_000), 200, dtype=torch.uint8), str(strip))
    with pytest.raises(DataError) as error:
        ImageFiles([strip], [1], eval_transform(32))[0]
    assert str(error.value).startswith(f"{strip}: 60000x1 pixels, which the centre crop would resize to 2220000x37;")
    refused = ImageError("1x2 pixels; send more", "an image")
    assert str(pickle.loads(pickle.dumps(refused))) == "an image: 1x2 pixels; send more"

    def too_dark(image: torch.Tensor) -> torch.Tensor:
        raise DataError("too dark to see; give it some light")

    dm = birds_data(root)
    dm.setup("fit")
    monkeypatch.setattr(dm, "transform", lambda train: too_dark)
    with pytest.raises(DataError) as error:
        next(iter(dm.val_dataloader()))
    assert str(error.value) == f"{dm.splits['val'][0][0]}: too dark to see; give it some light"
