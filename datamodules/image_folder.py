"""A labelled image folder (any photos in class subfolders) for transfer learning: ImageFolderDataModule. The birds
recipe (configs/birds.yaml: chickens and turkeys) and the digits one (configs/digits_folder.yaml: small grey PNGs)
are its configs.

    python -m scripts.train fit --config configs/birds.yaml --data.init_args.data_dir my_photos/
    python -m scripts.train predict --config configs/birds.yaml --ckpt_path ... --data.init_args.predict_path photos/

`data_dir` holds either `train/` and `val/` (and optionally `test/`) with one subfolder per class, or just the class
subfolders, split into training and validation by each file's bytes: a seeded hash holds out about `val_fraction` of
every class (datamodules/folder_split.py), so renaming or adding photos moves no other one, and every checkpoint keeps
which images the fit saw (`identity`). When it is missing and `archive` names a .zip/.tar.gz (path or URL, e.g. the
Azure ML tutorial's `fowl_data.zip`), the archive is extracted there once. Images are decoded by Pillow (the serving
code's decoder) in DataLoader workers and cropped there (training: random resized crop and horizontal flip; evaluation:
resize and centre crop); batches travel as uint8 and become ImageNet-normalised floats on the training device
(`on_after_batch_transfer`).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from datamodules import base, folder_split
from datamodules.base import ClassificationDataModule
from datamodules.errors import DataError
from datamodules.folder_files import (
    case_twins,
    check_colour,
    check_readable,
    check_same_classes,
    check_split_names,
    class_folders,
    colour_share,
    left_out_lines,
    list_images,
    predict_files,
    read_image,
    read_once,
    without_copies,
)
from datamodules.folder_split import FOLDERS, file_hashes, folder_identity, leave_out, split_train
from datamodules.preprocessing import images as preprocessing
from datamodules.preprocessing.images import IMAGENET_MEAN, IMAGENET_STD, MAX_IMAGE_PIXELS, ImageError

WORKERS_PER_CORE = 4  # the most DataLoader processes a core: data.init_args.num_workers' bound

SPLITS = ("train", "val", "test")
MIN_STEPS_PER_EPOCH = 4  # of a training split no larger than one batch (fit_batch_to_training_set)


class ImageFiles(Dataset):
    """Image files decoded as uint8 RGB and transformed; items are (image, label), or (image,) without labels."""

    def __init__(self, files: list[Path], labels: list[int] | None, transform) -> None:
        self.files, self.labels, self.transform = files, labels, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple:
        path = self.files[index]
        image = read_image(path)  # its DataError names the path already
        try:
            image = self.transform(image)
        except DataError as error:  # the transform has the pixels only: the run's one line must say which file
            raise DataError(f"{path}: {error.reason if isinstance(error, ImageError) else error}") from None
        return (image,) if self.labels is None else (image, self.labels[index])


class ImageFolderDataModule(ClassificationDataModule):
    """
    Args:
        data_dir: folder of labelled images: `train/`, `val/` (, `test/`) of class subfolders, or class subfolders.
        archive: .zip or .tar.gz (path or http(s) URL) extracted into data_dir when data_dir is missing.
        predict_path: a folder of images (any depth, no labels needed) or one image to classify.
        classes: label names in index order; None: the sorted class folders of the training data.
            Give them to predict where the training data is not at hand (becomes `class_names`).
        val_fraction: share of each class held out for validation when data_dir has no `val/` (about: each file by
            the seeded hash of its bytes).
        batch_size: images per step and process.
        image_size: side of the square crops the network sees (224: the ImageNet size).
        num_workers: DataLoader processes decoding images (0: in the training process).
        seed: of the validation split; every rank computes the same one.
        min_crop: the smallest share of an image's area a training crop keeps (0.08: ImageNet's; digits, whose
            strokes a small crop loses: 0.5 or more).
        flip: mirror training images left to right at random (photos; not digits or text, which a mirror changes).
        verify_images: decode every image once at setup, so one error names every bad file before
            training starts. That pass costs about an epoch of decoding on every process: False skips
            it for large folders, and a bad file then stops the run when its batch is loaded.
    """

    preprocessing_options = ("image_size",)
    serving_kind = "images"
    tests_on_validation = False  # set by setup("test"): no test/, so the validation images stand in

    def __init__(
        self,
        data_dir: str = "data/birds",
        archive: str | None = None,
        predict_path: str | None = None,
        classes: list[str] | None = None,
        val_fraction: float = 0.2,
        batch_size: int = 16,
        image_size: int = 224,
        num_workers: int = 2,
        seed: int = 42,
        verify_images: bool = True,
        min_crop: float = 0.08,
        flip: bool = True,
    ) -> None:
        super().__init__(batch_size, seed)
        if not 0 < val_fraction < 1:
            raise DataError(f"data.init_args.val_fraction {val_fraction}: give a fraction between 0 and 1 (exclusive)")
        if not 0 < min_crop <= 1:
            raise DataError(
                f"data.init_args.min_crop {min_crop}: give a share of the image's area, above 0 and at most 1"
            )
        largest = math.isqrt(MAX_IMAGE_PIXELS)  # the side of the biggest picture the crop (and the serving code) makes
        if not 1 <= image_size <= largest:
            raise DataError(f"data.init_args.image_size {image_size}: give 1 to {largest} pixels (the crop's side)")
        cores = os.cpu_count() or 1  # the machine's: a launcher binds each training process to one core of them
        # Past a few processes a core, more workers decode no faster, and each holds batches in memory (100,000 forked
        # until memory ran out).
        if not 0 <= num_workers <= WORKERS_PER_CORE * cores:
            raise DataError(
                f"data.init_args.num_workers {num_workers}: give 0 (decode in the training process) to "
                f"{WORKERS_PER_CORE * cores} ({WORKERS_PER_CORE} per core of this machine's {cores})"
            )
        self.save_hyperparameters()
        self.root = Path(data_dir)
        self.splits: dict[str, tuple[list[Path], list[int] | None]] = {}
        self.checked: set[Path] = set()
        self._class_names: list[str] | None = None
        self._labelled: dict[str, dict[str, list[Path]]] | None = None
        self._pictures: dict[str, dict[str, list[Path]]] | None = None
        self.hashes: dict[Path, int] = {}  # each file's hash of its bytes (folder_split.py)
        self._colour: float | None = None

    def fetch(self) -> None:
        """Makes sure data_dir exists, extracting the archive when it does not (idempotent, atomic)."""
        if self.root.is_dir() and any(self.root.iterdir()):
            return
        if self.root.is_file():  # before the archive: the config's (the tutorial's URL) is not what the user gave
            from datamodules.archives import file_as_data_dir

            raise file_as_data_dir(self.root, self.hparams.archive)
        if self.hparams.archive is not None:
            from datamodules.archives import fetch_archive  # only the first fit on a machine extracts

            fetch_archive(self.hparams.archive, self.root)
        elif not self.root.is_dir():
            raise DataError(
                f"{self.root}: no such folder; give data.init_args.data_dir a folder of labelled images "
                "or data.init_args.archive a .zip/.tar.gz to extract there"
            )

    def prepare_data(self) -> None:
        if self.hparams.classes is not None and self.trainer is not None and self.trainer.predicting:
            return  # the classes are known (the checkpoint's): predicting needs no training data, nor its download
        self.fetch()

    def split_dir(self, split: str) -> Path | None:
        """data_dir/<split> when data_dir is split into folders; `train` falls back to data_dir itself."""
        check_split_names(self.root, SPLITS)
        present = [name for name in SPLITS if (self.root / name).is_dir()]
        if present and "train" not in present:
            raise DataError(f"{self.root}: has {'/, '.join(present)}/ but no train/; add it or rename the folder")
        if split == "train":
            return self.root / "train" if present else self.root
        return self.root / split if split in present else None

    @property
    def class_names(self) -> list[str]:
        if self._class_names is None:
            if self.hparams.classes is not None:
                self._class_names = list(self.hparams.classes)
            else:
                self.fetch()  # the CLI asks right after __init__, before prepare_data
                self._class_names = [folder.name for folder in class_folders(self.split_dir("train"))]
        return self._class_names

    def labelled(self) -> dict[str, dict[str, list[Path]]]:
        """Every labelled split of data_dir (train, and val and test where present) by class, listed once: each real
        file read once in all of them (a link that would read one under two labels or in two splits is a DataError
        naming both paths), and each split's classes the model's."""
        if self._labelled is None:
            folders = {split: folder for split in SPLITS if (folder := self.split_dir(split)) is not None}
            images = read_once({split: list_images(folder) for split, folder in folders.items()})
            given = "data.init_args.classes (the checkpoint's, at validate, test and predict)"
            reference = given if self.hparams.classes is not None else folders["train"]
            for split, folder in folders.items():
                check_same_classes(reference, self.class_names, folder, sorted(images[split]))
            if self.trainer is None or self.trainer.is_global_zero:
                for name, twin in case_twins(sorted(images["train"])):
                    print(
                        f"{folders['train'] / name} and {folders['train'] / twin}: class folders named alike but for "
                        "case, trained as two classes; move one's images into the other if they are one",
                        file=sys.stderr,
                    )
            self._labelled = images
        return self._labelled

    def pictures(self, rule: dict | None = None) -> dict[str, dict[str, list[Path]]]:
        """train, val (held out of train where data_dir has no val/, by `rule`: a checkpoint's, else the config's;
        datamodules/folder_split.py) and test where present, by class: a byte-identical copy of a picture in two
        classes is a DataError, one of an earlier split's picture is left out of the later split (validation, test)
        with a line on stderr, so no score counts a picture trained on. Sets `identity`."""
        if self._pictures is None or rule is not None:
            images = dict(self.labelled())
            self.hashes = self.hashes or file_hashes(images)
            if rule is None or ("val" in images) != (rule["method"] == FOLDERS):  # the folders are the split
                rule = {"method": FOLDERS} if "val" in images else self.config_rule()
            if "val" not in images:
                images = split_train(images, self.hashes, rule, self.split_dir("train"))
            first, (self._pictures, found) = self._pictures is None, without_copies(images)
            if first and (self.trainer is None or self.trainer.is_global_zero):
                for line in left_out_lines(found):
                    print(line, file=sys.stderr)
            self.set_identity(rule)
        return self._pictures

    split_options = ("seed", "val_fraction")  # what split_check.py names of a rule; what it says it restores:
    held_out, permuted = "its validation images are held out", "each class's images"

    def config_rule(self) -> dict:
        return base.split_rule(self.seed, self.hparams.val_fraction, 0.0, ["file bytes"])

    def set_identity(self, rule: dict) -> None:
        schema = folder_split.image_schema(3, self.hparams.image_size, self.class_names)
        self.identity = folder_identity(self.root, self._pictures, self.hashes, rule, schema)

    def resplit(self, rule: dict) -> None:
        """The split by a checkpoint's rule (datamodules/split_check.py), in the splits this command has set up."""
        self.pictures(rule)
        self.set_splits()

    def leave_out(self, contents: set[int], paths: set[int]) -> dict[str, list[Path]]:
        """folder_split.leave_out of the pictures (split_check.py: what a checkpoint trained on), the splits anew."""
        left = leave_out(self._pictures, self.hashes, self.root, contents, paths)
        self.set_identity(self.identity["split"])
        self.set_splits()
        return left

    def set_splits(self) -> None:
        """The splits set up so far, from `pictures()`: test is the validation split where there is no test/."""
        for split in [split for split in SPLITS if split in self.splits]:
            source = "val" if split == "test" and self.tests_on_validation else split
            self.splits[split] = self.flatten(self._pictures[source])

    def flatten(self, images: dict[str, list[Path]]) -> tuple[list[Path], list[int]]:
        index = {name: i for i, name in enumerate(self.class_names)}
        pairs = [(path, index[name]) for name, paths in images.items() for path in paths]
        return [path for path, _ in pairs], [label for _, label in pairs]

    def setup(self, stage: str) -> None:
        if stage != "predict":  # predicting needs no training data when `classes` names the labels
            self.fetch()
        if stage in ("fit", "validate") and "train" not in self.splits:
            self.splits["train"] = self.splits["val"] = ([], [])
            self.pictures()
            self.set_splits()
            self.fit_batch_to_training_set()
        if stage == "test" and "test" not in self.splits:
            self.splits["test"] = ([], [])
            self.tests_on_validation = "test" not in self.pictures()  # the evaluation report and test_acc's line too
            self.set_splits()
            if self.tests_on_validation and (self.trainer is None or self.trainer.is_global_zero):
                print(
                    f"{self.hparams.data_dir}: no test/ folder, so `test` scores the validation split, which chose the "
                    "checkpoint: its scores are optimistic; add a test/ folder of class subfolders for a fair score",
                    file=sys.stderr,
                )
        if stage == "predict":
            files = predict_files(self.hparams.predict_path, self.trainer is None or self.trainer.is_global_zero)
            self.splits["predict"] = (files, None)
            self.predict_names = [str(path) for path in files]
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}[stage]
        unchecked = [path for split in wanted for path in self.splits[split][0] if path not in self.checked]
        if self.hparams.verify_images:
            check_readable(unchecked)
            self.checked.update(unchecked)

    def fit_batch_to_training_set(self) -> None:
        """A training split no larger than a batch (12 photos at batch 16) is one optimizer step an epoch: a few
        epochs leave the network at chance. The batch becomes a quarter of the split (four steps an epoch), said in one
        line on stderr; a batch_size below the split's size is kept as given."""
        _, world_size = self.rank_and_world_size
        per_process = -(-len(self.splits["train"][0]) // world_size)
        if per_process > self.batch_size or per_process < 2:
            return
        given, self.batch_size = self.batch_size, -(-per_process // MIN_STEPS_PER_EPOCH)
        if self.trainer is None or self.trainer.is_global_zero:
            print(
                f"{self.split_dir('train')}: {per_process} training images a process at data.init_args.batch_size "
                f"{given} would be one optimizer step an epoch; training at batch {self.batch_size} "
                f"({-(-per_process // self.batch_size)} steps an epoch); give a batch_size below {per_process} to "
                "choose another",
                file=sys.stderr,
            )

    def transform(self, train: bool):
        from torchvision.transforms import v2

        size = self.hparams.image_size
        if train:
            crop = v2.RandomResizedCrop(size, scale=(self.hparams.min_crop, 1.0), antialias=True)
            return v2.Compose([crop, v2.RandomHorizontalFlip()]) if self.hparams.flip else crop
        return eval_transform(size)

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        files, labels = self.splits[split]
        workers = self.hparams.num_workers
        dataset = ImageFiles(files, labels, self.transform(train=split == "train"))
        rank, world_size = self.rank_and_world_size
        # Training: Lightning's DistributedSampler (shards padded to one length); evaluation: each image once.
        sampler = None
        if split in ("val", "test") and world_size > 1:
            from datamodules.evaluation_shard import EvaluationShard

            sampler = EvaluationShard(dataset, rank, world_size, split)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            sampler=sampler,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=self.trainer is not None and self.trainer.strategy.root_device.type == "cuda",
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict")

    def serving_state(self) -> dict:
        """The crop's size, and the colour of the training images: the registered model refuses a request of grey
        pictures only for a network trained on colour ones only, as predict refuses such a folder."""
        if "train" in self.splits and self._colour is None:  # fitting: grey images (digits) or colour ones learnt
            self._colour = colour_share(self.splits["train"][0])
        return {
            "image_size": self.hparams.image_size,
            **({"colour_share": self._colour} if "train" in self.splits else {}),
        }

    def state_dict(self) -> dict:
        state = super().state_dict()
        if "train" in self.splits:
            state["colour_share"] = self.serving_state()["colour_share"]
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if getattr(self, "identity", None):  # the crop's size may be the checkpoint's now
            self.identity["schema"] = folder_split.image_schema(3, self.hparams.image_size, self.class_names)
        if self.trainer is not None and self.trainer.predicting and "predict" in self.splits:
            check_colour(state.get("colour_share"), self.splits["predict"][0], self.hparams.predict_path)

    serving_preprocess = staticmethod(preprocessing.photo_batch)

    def on_after_batch_transfer(self, batch: tuple[torch.Tensor, ...], dataloader_idx: int) -> tuple[torch.Tensor, ...]:
        return (normalize_images(batch[0]), *batch[1:])

    def images_to_show(self, inputs: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(IMAGENET_MEAN, device=inputs.device)[:, None, None]
        std = torch.tensor(IMAGENET_STD, device=inputs.device)[:, None, None]
        return (inputs.float() * std + mean).clamp(0, 1)


class EvaluationCrop:
    """ImageNet's evaluation recipe on a uint8 (3, H, W) image: shorter side to 256/224 of the crop, the centre crop;
    the serving code's own (datamodules/preprocessing/images.py), so evaluation, predict and the registered model crop
    a photo alike. An image too narrow to resize (a strip of 60,000 x 1 pixels) is an ImageError about "an image":
    ImageFiles names its file."""

    def __init__(self, image_size: int) -> None:
        self.image_size = image_size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        from PIL import Image

        picture = Image.fromarray(image.permute(1, 2, 0).numpy())
        return torch.from_numpy(preprocessing.centre_crop(picture, self.image_size).transpose(2, 0, 1).copy())


def eval_transform(image_size: int) -> EvaluationCrop:
    """Evaluation's and predict's crop (the registered model's too)."""
    return EvaluationCrop(image_size)


def normalize_images(images: torch.Tensor) -> torch.Tensor:
    """A uint8 batch (N, 3, H, W) as the network takes it: floats in [0, 1], ImageNet-normalised (as
    datamodules/preprocessing/images.py's normalize_photos does in numpy)."""
    from torchvision.transforms.v2.functional import normalize

    return normalize(images.float().div_(255), IMAGENET_MEAN, IMAGENET_STD)
