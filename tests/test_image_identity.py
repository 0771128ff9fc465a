"""Every run knows exactly which images it saw: an image's split is a function of its bytes (adding, renaming or
copying photos moves no other one between training and validation), every checkpoint keeps the images' digest, the
split's rule and schema, and test and resume compare with them: the checkpoint's held-out images are scored, what
differs is one line, and no image it trained on is scored. Image folders and MNIST alike (tests/test_data_identity.py:
tables).

    .venv/bin/python -m pytest -q tests/test_image_identity.py
"""

from __future__ import annotations

import gzip
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.io import write_png

from datamodules import base, folder_split
from datamodules.errors import DataError
from datamodules.mnist import MNISTDataModule
from tests.conftest import CLASSES, REPO, bird_folders, birds_data, run_module, write_images

OLD_CHECKPOINTS = REPO / "tests" / "checkpoints"


def photos(root: Path, count: int, start: int = 0) -> Path:
    """A folder of class subfolders (no val/), `count` pictures a class numbered from `start`."""
    for channel, name in enumerate(CLASSES):
        write_images(root / name, count, channel, size=(24, 24), start=start)
    return root


def sides(data) -> dict[bytes, str]:
    """Each picture's bytes -> the split it is in ("train" or "val")."""
    return {path.read_bytes(): split for split in ("train", "val") for path in data.splits[split][0]}


def split_folder(root: Path, **options):
    data = birds_data(root, **options)
    data.setup("fit")
    return data


def test_adding_renaming_and_copying_photos_moves_no_photo_between_training_and_validation(tmp_path):
    root = photos(tmp_path / "birds", 20)
    before = sides(split_folder(root, val_fraction=0.25))
    photos(root, 12, start=20)  # the photographer's next batch
    (root / "chickens" / "3.jpg").rename(root / "chickens" / "IMG_0003.jpg")
    shutil.copy(root / "turkeys" / "4.png", root / "turkeys" / "4 (copy).png")
    data = split_folder(root, val_fraction=0.25)
    after = sides(data)
    assert {picture: after[picture] for picture in before} == before  # renamed ones too
    val = data.splits["val"][0]
    assert (root / "turkeys" / "4 (copy).png" in val) == (root / "turkeys" / "4.png" in val)  # copies share a side
    for name in CLASSES:  # each class keeps about val_fraction of its 32
        assert 3 <= sum(path.parent.name == name for path in val) <= 14


def idx_files(folder: Path, train: np.ndarray, test: np.ndarray) -> Path:
    """The four MNIST files of uint8 digits `train` and `test` (N, 28, 28), labelled 0-9 in turn."""
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, images in (("train", train), ("t10k", test)):
        labels = (np.arange(len(images)) % 10).astype(np.uint8)
        for name, magic, data in (("images-idx3-ubyte", 2051, images), ("labels-idx1-ubyte", 2049, labels)):
            header = struct.pack(">I", magic) + b"".join(struct.pack(">I", side) for side in data.shape)
            (folder / f"{prefix}-{name}.gz").write_bytes(gzip.compress(header + data.tobytes(), mtime=0))
    return folder


def digits(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, 28, 28), dtype=np.uint8)


def mnist_split(folder: Path, **options) -> MNISTDataModule:
    data = MNISTDataModule(data_dir=str(folder), **{"val_size": 40, "batch_size": 16, **options})
    data.setup("fit")
    return data


def mnist_sides(data: MNISTDataModule) -> dict[bytes, str]:
    return {image.numpy().tobytes(): split for split in ("train", "val") for image in data.splits[split][0]}


def test_an_mnist_image_keeps_its_split_when_images_are_added_or_reordered(tmp_path):
    train, test = digits(200, seed=0), digits(30, seed=1)
    fitted = mnist_split(idx_files(tmp_path / "before", train, test))
    before = mnist_sides(fitted)
    assert 20 <= sum(side == "val" for side in before.values()) <= 60  # about val_size 40
    more = idx_files(tmp_path / "after", np.concatenate([train[::-1], digits(60, seed=2)]), test)  # reordered, 60 more
    after = mnist_sides(mnist_split(more, val_size=52))  # the same share of the training file: 20%
    assert {image: after[image] for image in before} == before
    resumed = mnist_split(more)  # 40 of 260 images: a smaller share, but the checkpoint's rule is its 20%
    resumed.load_state_dict(fitted.state_dict())
    after = mnist_sides(resumed)
    assert {image: after[image] for image in before} == before


def test_a_checkpoint_keeps_the_images_digest_rule_and_schema(tmp_path):
    root = photos(tmp_path / "birds", 8)
    data = split_folder(root, val_fraction=0.25, seed=3)
    identity = data.state_dict()["identity"]
    assert identity["source"] == str(root) and len(identity["digest"]) == 16 and identity["rows"] == 16
    assert identity["split"] == {"method": "row hash", "seed": 3, "val_fraction": 0.25, "test_fraction": 0.0,
                                 "id_column": None, "columns": ["file bytes"]}  # fmt: skip
    assert identity["schema"] == {"image": "image 3x32x32", "label": "label: chickens, turkeys"}
    splits = identity["splits"]
    assert splits["train"]["rows"] == len(data.splits["train"][0]) and splits["val"]["rows"] == len(
        data.splits["val"][0]
    )
    assert splits["test"] == {**splits["val"], "source": "the validation split (no test/ folder)"}  # what test scores
    assert identity["files"].shape == (16, 3) and identity["files"].dtype == torch.int64
    (root / "chickens" / "0.png").rename(root / "chickens" / "renamed.png")
    assert split_folder(root, val_fraction=0.25, seed=3).identity["digest"] == identity["digest"]
    write_png(torch.zeros(3, 24, 24, dtype=torch.uint8), str(root / "chickens" / "renamed.png"))  # edited
    assert split_folder(root, val_fraction=0.25, seed=3).identity["digest"] != identity["digest"]

    mnist = mnist_split(idx_files(tmp_path / "mnist", digits(100, seed=0), digits(20, seed=1)), val_size=20, seed=5)
    identity = mnist.state_dict()["identity"]
    assert identity["split"]["method"] == "row hash" and identity["split"]["val_size"] == 20
    assert identity["split"]["val_fraction"] == 0.2 and identity["split"]["seed"] == 5
    assert identity["schema"] == {"image": "image 1x28x28", "label": "label: " + ", ".join(map(str, range(10)))}
    assert {name: split["rows"] for name, split in identity["splits"].items()} == {
        "train": len(mnist.splits["train"][0]), "val": len(mnist.splits["val"][0]), "test": 20}  # fmt: skip
    assert identity["rows"] == 120 and "row_hashes" not in identity  # no per-image hashes: the digests say it


# extra: serving
def test_the_registered_model_s_metadata_names_the_images_it_was_trained_on(tmp_path):
    from scripts.serving.mlflow_model import serving_inputs

    data = split_folder(photos(tmp_path / "birds", 6), val_fraction=0.25)
    served = serving_inputs(data)["data"]
    assert served == {key: value for key, value in data.identity.items() if key != "files"}
    assert served["schema"]["label"] == "label: chickens, turkeys" and served["digest"] == data.identity["digest"]


# end extra: serving


def test_a_checkpoint_s_split_rule_wins_and_the_line_says_so(tmp_path, capsys):
    root = photos(tmp_path / "birds", 12)
    fitted = split_folder(root, seed=1)
    tested = birds_data(root, seed=42)
    tested.setup("test")  # no test/: the validation images
    assert set(tested.splits["test"][0]) & set(fitted.splits["train"][0])  # seed 42's: images seed 1 trained on
    capsys.readouterr()
    tested.load_state_dict(fitted.state_dict())
    assert set(tested.splits["test"][0]) == set(fitted.splits["val"][0])
    assert capsys.readouterr().err.splitlines() == [
        f"{root}: split as the checkpoint's fit split it (data.init_args.seed 1, not 42): its validation images are "
        "held out, none it trained on"
    ]

    folder = idx_files(tmp_path / "mnist", digits(200, seed=0), digits(20, seed=1))
    fitted, validated = mnist_split(folder, seed=1), mnist_split(folder, seed=42, val_size=50)
    validated.load_state_dict(fitted.state_dict())
    assert torch.equal(validated.splits["val"][0], fitted.splits["val"][0])
    assert capsys.readouterr().err.splitlines() == [
        f"{folder}: split as the checkpoint's fit split it (data.init_args.seed 1, not 42, data.init_args.val_size "
        "40, not 50): its validation images are held out, none it trained on"
    ]


def edited_into_validation(path: Path, rule: dict) -> None:
    """`path` (a PNG) edited, one pixel at a time, until its new bytes hash into validation by `rule`."""
    from torchvision.io import decode_png, encode_png

    image = decode_png(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))
    for value in range(256):
        image[:, 0, 0] = value
        data = encode_png(image).numpy().tobytes()
        if (
            base.hash_shares(rule["seed"], np.array([folder_split.content_hash(data)], dtype=np.uint64))[0]
            < rule["val_fraction"]
        ):
            path.write_bytes(data)
            return
    raise AssertionError("no edit of one pixel hashed into validation")


def test_images_added_removed_or_edited_are_named_and_no_image_trained_on_is_scored(tmp_path, capsys):
    root = photos(tmp_path / "birds", 16)
    fitted = split_folder(root, val_fraction=0.25)
    state, trained = fitted.state_dict(), set(fitted.splits["train"][0])
    edited = next(path for path in sorted(trained) if path.suffix == ".png")
    edited_into_validation(edited, state["identity"]["split"])  # a training picture retouched since
    removed = sorted(fitted.splits["val"][0])[0]
    removed.unlink()
    photos(root, 2, start=16)  # and four pictures more
    capsys.readouterr()
    tested = birds_data(root, val_fraction=0.25)
    tested.setup("test")
    assert edited in tested.splits["test"][0]  # by its new bytes, a validation image
    tested.load_state_dict(state)
    assert edited not in tested.splits["test"][0] and not set(tested.splits["test"][0]) & trained
    added = [root / name / f"{i}.{'jpg' if i % 2 else 'png'}" for name in CLASSES for i in (16, 17)]
    new_val = sum(path in tested.splits["test"][0] for path in added)
    (line,) = capsys.readouterr().err.splitlines()[-1:]
    assert line == (
        f"{root}: not the images the checkpoint saw (training: {4 - new_val} added, 0 removed, 0 edited; validation: "
        f"{new_val} added, 1 removed, 1 edited; digest {state['identity']['digest']}, now {tested.identity['digest']}):"
        f" each image keeps its split by its own bytes, so none it trained on is tested; left out of validation, as "
        f"the checkpoint trained on them: {edited}"
    )
    scored = list(tested.splits["test"][0])
    tested.load_state_dict(state)  # a resumed fit compares twice: before the weights load, and as the state loads
    assert tested.splits["test"][0] == scored and not capsys.readouterr().err


def test_a_folder_trained_with_val_and_tested_without_it_scores_no_image_it_trained_on(tmp_path, capsys):
    """The same pictures, the folder's train/ and val/ merged since: the same digest, but no rule to restore."""
    root = bird_folders(tmp_path / "split", count=6)
    fitted = split_folder(root)
    trained = {path.read_bytes() for path in fitted.splits["train"][0]}
    merged = tmp_path / "merged"
    for split in ("train", "val"):
        for path in (root / split).rglob("*.*"):
            (merged / path.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, merged / path.parent.name / f"{split}-{path.name}")
    tested = birds_data(merged)
    tested.setup("test")
    assert {path.read_bytes() for path in tested.splits["test"][0]} & trained  # the config's split: trained ones
    assert tested.identity["digest"] == fitted.identity["digest"]  # the same pictures of the same classes
    capsys.readouterr()
    tested.load_state_dict(fitted.state_dict())
    assert tested.splits["test"][0] and not {path.read_bytes() for path in tested.splits["test"][0]} & trained
    assert capsys.readouterr().err.splitlines()[0] == (
        f"{merged}: the checkpoint was split by split folders, this data by row hash: what it trained on is left out "
        "of what is scored"
    )


def test_an_older_checkpoint_is_tested_on_the_images_its_permutation_held_out(tmp_path, capsys):
    """Checkpoints written before the hash split (tests/checkpoints/) kept no rule: a seeded permutation of each
    class's files (MNIST: of the training file's rows) held out its validation images, and so it does again."""
    from datamodules.permuted_split import permuted_rows, seeded_split

    root = photos(tmp_path / "birds", 10)
    state = torch.load(OLD_CHECKPOINTS / "birds.ckpt", weights_only=False)["ImageFolderDataModule"]
    assert "identity" not in state
    data = birds_data(root, val_fraction=0.3, seed=7)
    data.setup("test")
    data.load_state_dict(state)
    expected = {path for name in CLASSES for path in seeded_split(sorted((root / name).iterdir()), 0.3, 7, root)[1]}
    assert set(data.splits["test"][0]) == expected
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{root}: the checkpoint predates kept split rules: split as its fit split then (a seeded permutation of each "
        "class's images, seed 7)"
    )
    folder = idx_files(tmp_path / "mnist", digits(64, seed=0), digits(20, seed=1))
    mnist = mnist_split(folder, val_size=16)
    mnist.load_state_dict(torch.load(OLD_CHECKPOINTS / "mnist.ckpt", weights_only=False)["MNISTDataModule"])
    train, val = permuted_rows(64, 16, 42)
    assert torch.equal(mnist.split_indices["val"], val) and torch.equal(mnist.split_indices["train"], train)


def test_a_few_pictures_a_class_still_hold_one_out_and_one_picture_cannot_be_split(tmp_path):
    root = photos(tmp_path / "birds", 2)
    data = split_folder(root, val_fraction=0.1)
    assert sorted(path.parent.name for path in data.splits["val"][0]) == list(CLASSES)
    (root / "chickens" / "1.jpg").unlink()
    shutil.copy(root / "chickens" / "0.png", root / "chickens" / "1.png")  # two pictures, one image
    with pytest.raises(DataError, match=r"chickens: 2 image\(s\), 1 different, cannot be split into training and"):
        split_folder(root, val_fraction=0.1)


# ---- through the CLI: a fit, its test with another seed, a resume on more photos and on another class ----


def folder_args(root: Path, outputs: Path, *more) -> list:
    return ["--config", "configs/birds.yaml", "--data.init_args.data_dir", root, "--data.init_args.archive", "null",
            "--data.init_args.image_size", "32", "--data.init_args.num_workers", "0", "--trainer.enable_progress_bar",
            "false", "--trainer.default_root_dir", outputs, *more]  # fmt: skip


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> dict:
    """One epoch of the birds recipe on a folder without val/, split seed 1, its checkpoints in a folder of its own."""
    folder = tmp_path_factory.mktemp("birds_identity")
    root = photos(folder / "birds", 8)
    fit = run_module("scripts.train", "fit", *folder_args(root, folder / "outputs", "--data.init_args.seed", "1",
                     "--trainer.max_epochs", "1", "--checkpoint_dir", folder / "checkpoints"))  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    return {"folder": folder, "root": root}


def dataset_inputs(outputs: Path) -> dict[str, list[tuple[str, str, str]]]:
    """Each run's (context, name, digest) dataset inputs, by its command (fit-..., test-...)."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    runs = [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]
    return {run.info.run_name.split("-")[0]: sorted((next(t.value for t in d.tags), d.dataset.name, d.dataset.digest)
                                                    for d in run.inputs.dataset_inputs) for run in runs}  # fmt: skip


@pytest.mark.slow
def test_a_fit_logs_its_images_and_a_test_with_another_seed_scores_the_fit_s_validation_images(fitted, tmp_path):
    folder, root = fitted["folder"], fitted["root"]
    test = run_module("scripts.train", "test", *folder_args(root, folder / "outputs", "--ckpt_path",
                      folder / "checkpoints" / "best.ckpt"))  # fmt: skip
    assert test.returncode == 0, test.stderr[-3000:]
    assert (f"{root}: split as the checkpoint's fit split it (data.init_args.seed 1, not 42): its validation images "
            "are held out, none it trained on") in test.stderr  # fmt: skip
    inputs = dataset_inputs(folder / "outputs")
    # Its test after the fit scored the validation images: one dataset to MLflow (a name and digest), logged once.
    assert [context for context, _, _ in inputs["fit"]] == ["training", "validation"]
    validation = next(pair for pair in inputs["fit"] if pair[0] == "validation")
    assert inputs["test"] == [("test", "birds", validation[2])]  # the fit's validation images, by their digest


@pytest.mark.slow
def test_a_resume_on_more_photos_says_so_and_goes_on_and_one_on_another_class_is_refused(fitted, tmp_path):
    shutil.copytree(fitted["root"], tmp_path / "birds")
    photos(tmp_path / "birds", 2, start=8)
    for checkpoints in ("more", "ducks"):
        shutil.copytree(fitted["folder"] / "checkpoints", tmp_path / checkpoints)
    args = ["--data.init_args.seed", "1", "--trainer.max_epochs", "2"]
    resume = run_module("scripts.train", "fit", *folder_args(tmp_path / "birds", tmp_path / "outputs", *args,
                        "--checkpoint_dir", tmp_path / "more"))  # fmt: skip
    assert resume.returncode == 0, resume.stderr[-3000:]
    assert f"{tmp_path / 'birds'}: not the images the checkpoint saw (training: " in resume.stderr
    assert "each image keeps its split by its own bytes, so the fit goes on" in resume.stderr
    write_images(tmp_path / "birds" / "ducks", 4, 2, size=(24, 24))
    refused = run_module("scripts.train", "fit", *folder_args(tmp_path / "birds", tmp_path / "outputs", *args,
                         "--checkpoint_dir", tmp_path / "ducks"))  # fmt: skip
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'birds'}: not the classes the checkpoint was trained on (chickens, turkeys; now chickens, "
        "ducks, turkeys); a resumed fit goes on with its classes: give the images it was trained on, or a new "
        "--checkpoint_dir to train anew"
    )


@pytest.mark.slow
def test_an_older_mnist_checkpoint_is_tested_saying_its_split_is_the_permutation_it_was(tmp_path):
    folder = idx_files(tmp_path / "mnist", digits(64, seed=0), digits(20, seed=1))
    test = run_module("scripts.train", "test", "--config", "configs/mnist.yaml", "--ckpt_path",
                      OLD_CHECKPOINTS / "mnist.ckpt", "--data.init_args.data_dir", folder, "--data.init_args.val_size",
                      "16", "--trainer.default_root_dir", tmp_path / "outputs")  # fmt: skip
    assert test.returncode == 0, test.stderr[-3000:]
    assert "test_acc" in test.stdout
    assert (f"{folder}: the checkpoint predates kept split rules: split as its fit split then (a seeded permutation "
            "of the training file's images, seed 42)") in test.stderr  # fmt: skip
