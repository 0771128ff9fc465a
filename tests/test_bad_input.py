"""Every mistake a user can make, as one table: options, configs, data of the three tasks, checkpoints, devices and
launches, outputs, tracking, export, plots and Azure ML submission. Each is typed as a user types it (its own
process), and must end in one line on stderr naming the culprit and the fix, exit status 1, no traceback, no run
recorded, and nothing of the user's written over. Also the answers that would be wrong without a word: evaluating or
predicting with no checkpoint, a checkpoint of other classes, penguins measured in other units, one species, a
species that is no species.

The cases run side by side (two at a time: most of each is Python importing Lightning), then each test reads its own.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import resource
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from mlflow.entities import ViewType
from torchvision.io import write_png

from tests import warm_launcher
from tests.conftest import REPO, bird_folders, free_port, write_images

pytestmark = pytest.mark.slow

PENGUIN_CSV = "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\n"
ROWS = "".join(f"Dream,{39 + i / 10},18.{i},18{i},3{i}00,{i % 3}\n" for i in range(9))
NOT_A_SPECIES = (PENGUIN_CSV + ROWS).replace(",1\n", ",12\n", 1)  # line 3: 12, which holds the characters of 0/1/2
USER_FILES = {  # what the user owns: must be byte-identical afterwards
    "notes.txt": "my notes\n",
    "broken.yaml": "trainer:\n  max_epochs: 3\n   devices: [1\n",
    # Flipper length and body mass in the course's scaled units, as the course printed its example.
    "course_units.csv": "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nBiscoe,50.4,15.3,20,50\n",
    "atlantis.csv": "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nAtlantis,50.4,15.3,200,5000\n",
    "one_species.csv": PENGUIN_CSV + "".join(f"Torgersen,{39 + i / 10},18.{i},18{i},3{i}00,0\n" for i in range(9)),
    "not_a_species.csv": NOT_A_SPECIES,
    "five_rows.csv": PENGUIN_CSV + "".join(ROWS.splitlines(True)[:5]),
    "missing_columns.csv": "Island,CulmenLength,Species\nDream,39,0\n",
    "non_numeric.csv": PENGUIN_CSV + "Dream,39.1,18.7,181,3750,0\nDream,abc,18.7,181,3750,0\n",
    "no_complete_row.csv": PENGUIN_CSV + "Dream,,18.7,181,3750,0\nBiscoe,39,,181,3750,1\n",
    "unknown_island.csv": PENGUIN_CSV + "Atlantis,39.1,18.7,181,3750,0\n",
    "empty.csv": "",
    "infinite.csv": PENGUIN_CSV + ROWS.replace("39.4,", "inf,"),  # line 6
    "nan_spelled.csv": PENGUIN_CSV + ROWS.replace(",3200,", ",nan,"),  # line 4
    "absurd_mass.csv": PENGUIN_CSV + ROWS.replace(",3600,", ",3600000000,"),  # line 8: grams typed a million-fold
    "predict_infinite.csv": "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nBiscoe,50.4,15.3,200,-inf\n",
    # A spreadsheet's row with a value past the header's: pandas would take the first as the index, shifting the rest.
    "extra_values.csv": "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nBiscoe,50.4,15.3,200,5000,7\n",
    "thousands.csv": PENGUIN_CSV + ROWS.replace(",3400,", ",3,400,"),  # line 6: a thousands separator splits a cell
    # Two BodyMass columns: the first was read without a word, whichever was meant.
    "two_masses.csv": "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,BodyMass\n"
    "Biscoe,50.4,15.3,200,4000,5000\n",
    "semicolons.csv": (PENGUIN_CSV + ROWS).replace(",", ";").replace(".", ","),  # a spreadsheet in German
}


def idx(magic: int, shape: tuple[int, ...], cut: int = 0) -> bytes:
    """An MNIST idx file of zeros, gzipped; `cut` bytes short of what its header announces."""
    data = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in shape) + bytes(math.prod(shape))
    return gzip.compress(data[: len(data) - cut], mtime=0)


def mnist_files(folder: Path, images: int = 10, **replace: bytes) -> None:
    """The four MNIST files of `images` digits each, blank but for one dot in its own place (each image its own:
    copies share a split), labels 0-9 in turn, some replaced by other bytes."""
    folder.mkdir(parents=True)
    labels = gzip.compress(struct.pack(">II", 2049, images) + bytes(i % 10 for i in range(images)), mtime=0)
    pixels = b"".join(bytes(i) + b"\xff" + bytes(28 * 28 - i - 1) for i in range(images))
    digits = gzip.compress(struct.pack(">IIII", 2051, images, 28, 28) + pixels, mtime=0)
    files = {"train-images-idx3-ubyte": digits, "train-labels-idx1-ubyte": labels,
             "t10k-images-idx3-ubyte": digits, "t10k-labels-idx1-ubyte": labels}  # fmt: skip
    for name, data in {**files, **replace}.items():
        (folder / f"{name}.gz").write_bytes(data)


def archives(user: Path) -> None:
    """Bird archives spoiled as downloads and copies spoil them: a zip whose first deflate block is of a type that does
    not exist, a .tar.gz cut in half."""
    source = bird_folders(user / "archived" / "fowl_data", count=2)
    with zipfile.ZipFile(user / "damaged.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(source.rglob("*")):
            zf.write(path, path.relative_to(source.parent))
        member = next(info for info in zf.infolist() if not info.is_dir())
    data = bytearray((user / "damaged.zip").read_bytes())
    data[member.header_offset + 30 + len(member.filename.encode()) + len(member.extra)] |= 0x06
    (user / "damaged.zip").write_bytes(data)
    with tarfile.open(user / "fowl.tar.gz", "w:gz") as tar:  # a good one
        tar.add(source, "fowl_data")
    with tarfile.open(user / "cut.tar.gz", "w:gz") as tar:
        tar.add(source, "fowl_data")
    data = (user / "cut.tar.gz").read_bytes()
    (user / "cut.tar.gz").write_bytes(data[: len(data) // 2])


def make_user_folder(user: Path) -> None:
    user.mkdir(parents=True)
    for name, text in USER_FILES.items():
        (user / name).write_text(text)
    (user / "garbage.csv").write_bytes(bytes(range(256)) * 4)
    with zipfile.ZipFile(user / "penguins.xlsx", "w", zipfile.ZIP_DEFLATED) as workbook:  # what Excel saves
        workbook.writestr("xl/worksheets/sheet1.xml", "<worksheet>" + "<row/>" * 500 + "</worksheet>")
    (user / "unicode_text.csv").write_bytes((PENGUIN_CSV + ROWS).replace(",", "\t").encode("utf-16"))  # a BOM first
    (user / "cut_short.ckpt").write_bytes(b"PK\x03\x04" + bytes(100))  # a zip's first bytes, then nothing
    damaged = idx(2051, (10, 28, 28))
    damaged = damaged[:10] + b"\xff" + damaged[11:]  # the first deflate block's type: 3, which does not exist
    mnist_files(user / "mnist-damaged", **{"train-images-idx3-ubyte": damaged})
    mnist_files(user / "mnist-truncated", **{"train-images-idx3-ubyte": idx(2051, (10, 28, 28), cut=100)})
    mnist_files(user / "mnist-labels-as-images", **{"train-images-idx3-ubyte": idx(2049, (10,))})
    (user / "mnist-empty").mkdir()
    (user / "digits-none").mkdir()
    (user / "digits-none" / "readme.txt").write_text("no digits here\n")
    (user / "digits-broken").mkdir()
    (user / "digits-broken" / "7.png").write_bytes(b"\x89PNG not really")
    (user / "digits.zip").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: neither an image nor an idx file
    bird_folders(user / "birds-broken", count=2)
    (user / "birds-broken" / "val" / "turkeys" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    bird_folders(user / "birds-broken-late", count=2)
    (user / "birds-broken-late" / "train" / "turkeys" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    bird_folders(user / "birds-other-val", splits=("train",), count=2)
    write_images(user / "birds-other-val" / "val" / "chickens", 2, 0)
    write_images(user / "birds-other-val" / "val" / "ducks", 2, 2)
    bird_folders(user / "birds-empty-class", splits=("train",), count=2)
    (user / "birds-empty-class" / "train" / "geese").mkdir()
    write_images(user / "birds-no-train" / "val" / "chickens", 2, 0)
    bird_folders(user / "birds", count=2)
    archives(user)
    bird_folders(user / "birds-strip", count=2)
    strip = torch.full((3, 1, 60_000), 200, dtype=torch.uint8)  # a readable picture the centre crop cannot resize
    write_png(strip, str(user / "birds-strip" / "val" / "turkeys" / "strip.png"))
    bird_folders(user / "birds-dangling", count=2)
    bird_folders(user / "birds-loop", count=2)
    (user / "birds-loop" / "train" / "chickens" / "loop").symlink_to("..")  # the turkeys would be read as chickens
    bird_folders(user / "birds-split-loop", count=2)
    (user / "birds-split-loop" / "train" / "loop").symlink_to("..")  # every image would be read as a class 'loop'
    bird_folders(user / "birds-class-twice", count=2)
    (user / "birds-class-twice" / "train" / "hens").symlink_to("chickens")  # the chickens, also labelled hens
    bird_folders(user / "birds-copy-in-two-classes", count=2)
    copied = user / "birds-copy-in-two-classes"
    shutil.copy(copied / "train" / "chickens" / "0.png", copied / "val" / "turkeys" / "copy.png")  # a chicken too
    bird_folders(user / "birds-val-in-train", count=2)
    (user / "birds-val-in-train" / "train" / "chickens" / "extra").symlink_to("../../val/chickens")  # scored as unseen
    (user / "birds-dangling" / "val" / "turkeys" / "gone.jpg").symlink_to("../../../deleted.jpg")
    mnist_files(user / "mnist-test-truncated", **{"t10k-images-idx3-ubyte": idx(2051, (10, 28, 28), cut=100)})
    header_cut = gzip.compress(struct.pack(">II", 2051, 10), mtime=0)  # the magic number, one of three dimensions
    mnist_files(user / "mnist-header-cut-short", **{"train-images-idx3-ubyte": header_cut})
    (user / "no-digits.idx").write_bytes(gzip.decompress(idx(2051, (0, 28, 28))))  # an idx file of 0 images
    for name, channel in (("ducks", 2), ("geese", 0), ("turkeys", 1)):
        for split in ("train", "val"):
            write_images(user / "other-birds" / split / name, 2, channel)


BIRDS = ["--config", "configs/birds.yaml", "--data.init_args.image_size", "32", "--data.init_args.num_workers", "0",
         "--data.init_args.archive", "null"]  # fmt: skip
MNIST = ["--config", "configs/mnist.yaml", "--data.init_args.val_size", "2"]
SUBMIT = ["configs/penguins.yaml", "--compute", "c"]
AZURE = ("scripts.submit", "scripts.pipeline")  # their refusals come before the Azure SDK's import
NOT_AN_IMAGE = "not a JPEG, PNG, WebP or GIF image"  # the decoder's reason (datamodules/preprocessing/images.py)
GIVE_CKPT = (
    "needs --ckpt_path: the .ckpt a fit wrote (outputs/<exp>/<run>/checkpoints/best.ckpt; `make evaluate` and "
    "`make predict` find the newest); without it the network is untrained"
)


@dataclass
class Case:
    name: str
    args: list[str]
    line: str  # the last line on stderr, with {user}, {outputs}, {port} and the checkpoints' paths filled in
    module: str = "scripts.train"
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = str(REPO)
    trained: bool = False  # refused after training began: its run, which measured nothing, is left deleted


def Submit(name: str, args: list[str], line: str, **options) -> Case:  # noqa: N802 (reads as a kind of Case)
    return Case(name, args, line, module="scripts.submit", **options)


CASES = [
    # ---- options and configs ----
    Case("unknown-option", ["fit", "--model.optimiser", "SGD"],
         "error: unrecognized arguments: --model.optimiser SGD (check the name against --print_config)"),
    Case("unknown-option-of-the-datamodule", ["fit", "--data.init_args.batchsize", "3"],
         "error: unrecognized arguments: --data.init_args.batchsize (datamodules.penguins.PenguinDataModule takes no "
         "such argument; check the name against --print_config)"),
    Case("wrong-type", ["fit", "--trainer.max_epochs", "abc"],
         "error: trainer.max_epochs: 'abc' is not a valid value; give int"),
    Case("wrong-type-in-a-class", ["fit", "--model.optimizer.init_args.lr", "fast"],
         "error: model.optimizer.init_args.lr: 'fast' is not a valid value; give float"),
    Case("wrong-type-in-the-datamodule", ["fit", "--data.init_args.batch_size", "0.5"],
         "error: data.init_args.batch_size: '0.5' is not a valid value; give int"),
    Case("not-a-choice", ["fit", "--trainer.precision", "7"],
         "error: trainer.precision: '7' is not a valid value; give 64 or 32 or 16 or transformer-engine or "
         "transformer-engine-float16 or 16-true or 16-mixed or bf16-true or bf16-mixed or 32-true or 64-true or bf16"),
    Case("yaml-syntax", ["fit", "--config", "{user}/broken.yaml"],
         "error: {user}/broken.yaml, line 3, column 11: not valid YAML (mapping values are not allowed here); fix the "
         "file there"),
    Case("config-missing", ["fit", "--config", "{user}/penguins.yaml"],
         "error: --config {user}/penguins.yaml: no such file; give a YAML file such as configs/penguins.yaml"),
    Case("class-that-does-not-import", ["fit", "--model.network.class_path", "lightning_modules.nope.Net"],
         "error: model.network: lightning_modules.nope: lightning_modules has no class or module nope; give a class "
         "that exists, as configs/ do"),
    Case("class-name-typo", ["fit", "--model.network.class_path", "lightning_modules.penguin_net.PenguinNt"],
         "error: model.network: lightning_modules.penguin_net.PenguinNt: lightning_modules.penguin_net has no class "
         "or module PenguinNt (closest: lightning_modules.penguin_net.PenguinNet); give a class that exists, as "
         "configs/ do"),
    Case("optimizer-name-typo", ["fit", "--model.optimizer", "torch.optim.Adamm"],
         "error: model.optimizer: torch.optim.Adamm: torch.optim has no class or module Adamm (closest: "
         "torch.optim.Adam, torch.optim.RAdam, torch.optim.NAdam); give a class that exists, as configs/ do"),
    Case("optimizer-that-is-not-one", ["fit", "--model.optimizer.class_path", "torch.nn.Linear"],
         "error: model.optimizer: torch.nn.Linear cannot be used here (Expected 'torch.nn.Linear' to be a subclass "
         "of <class 'Optimizer'>); give a class as configs/ do"),
    Case("datamodule-that-is-not-one", ["fit", "--data.class_path", "torch.nn.Linear"],
         "error: data: torch.nn.Linear is not a ClassificationDataModule; give a class derived from it, as configs/ "
         "do"),
    Case("negative-lr", ["fit", "--model.optimizer.init_args.lr", "-0.1"],
         "error: model.optimizer: Invalid learning rate: -0.1; correct its init_args (see --print_config)"),
    Case("negative-max-epochs", ["fit", "--trainer.max_epochs", "-5"],
         "error: `max_epochs` must be a non-negative integer or -1. You passed in -5."),
    Case("strategy-that-does-not-exist", ["fit", "--trainer.strategy", "foo"],
         "error: trainer: You selected an invalid strategy name: `strategy='foo'`. It must be either a string or an "
         "instance of `lightning.pytorch.strategies.Strategy`. Example choices: auto, ddp, ddp_spawn, deepspeed, ... "
         "Find a complete list of options in our documentation at https://lightning.ai"),
    Case("batch-size-0", ["fit", "--data.init_args.batch_size", "0"],
         "error: data.init_args.batch_size 0: give 1 or more (samples per step and process)"),
    Case("batch-size-negative-birds", ["fit", *BIRDS, "--data.init_args.batch_size", "-4"],
         "error: data.init_args.batch_size -4: give 1 or more (samples per step and process)"),
    Case("batch-size-negative-mnist", ["fit", *MNIST, "--data.init_args.batch_size", "-1"],
         "error: data.init_args.batch_size -1: give 1 or more (samples per step and process)"),
    Case("max-epochs-0", ["fit", "--trainer.max_epochs", "0"],
         "error: --trainer.max_epochs 0: a fit of no epoch trains nothing (its test would measure an untrained "
         "network); give 1 or more (-1: no limit), or `test --ckpt_path` to evaluate"),
    Case("register-model-without-tracking", ["fit", "--register_model", "x", "--trainer.logger", "false"],
         "error: --register_model needs the MLflow logger and checkpoints; check trainer.logger"),
    Case("register-model-name-azure-refuses", ["fit", "--register_model", "penguins/v2"],
         "error: --register_model 'penguins/v2': Azure ML refuses it; give 1-255 letters, digits, '-', '_' or '.', "
         "starting with a letter or digit, e.g. penguins"),
    # ---- machine, launch, outputs ----
    Case("gpu-without-one", ["fit", "--trainer.accelerator", "gpu"],
         "error: --trainer.accelerator gpu: torch sees no GPU on this machine; give --trainer.accelerator cpu (or "
         "leave out configs/trainer/gpu.yaml)"),
    Case("devices-0", ["fit", "--trainer.devices", "0"],
         "error: --trainer.devices 0: on CPUs each device is a training process; give 1 to {workers} (4 a core "
         "of this machine's {cores})"),
    # ---- counts no machine runs: each refused before anything starts ----
    Case("devices-past-the-cores", ["fit", "--trainer.accelerator", "cpu", "--trainer.devices", "64"],
         "error: --trainer.devices 64: on CPUs each device is a training process; give 1 to {workers} (4 a core "
         "of this machine's {cores})"),
    Case("devices-negative-on-cpus", ["fit", "--trainer.devices", "-5"],
         "error: --trainer.devices -5: on CPUs each device is a training process; give 1 to {workers} (4 a core "
         "of this machine's {cores})"),
    Case("num-nodes-0", ["fit", "--trainer.num_nodes", "0"], "error: --trainer.num_nodes 0: give 1 or more"),
    Case("num-nodes-without-a-launcher", ["fit", "--trainer.num_nodes", "2"],
         "error: --trainer.num_nodes 2: no launcher started this process, so no other node's processes would join it "
         "(it would wait for them forever); give 1, or start every node with torchrun or mpirun (python -m "
         "scripts.submit --nodes N does)"),
    Case("accumulate-grad-batches-0", ["fit", "--trainer.accumulate_grad_batches", "0"],
         "error: --trainer.accumulate_grad_batches 0: give 1 or more"),
    Case("check-val-every-n-epoch-0", ["fit", "--trainer.check_val_every_n_epoch", "0"],
         "error: --trainer.check_val_every_n_epoch 0: give 1 or more"),
    Case("val-check-interval-0", ["fit", "--trainer.val_check_interval", "0"],
         "error: --trainer.val_check_interval 0: give a share of an epoch (0 to 1) or batches"),
    Case("num-workers-negative", ["fit", *BIRDS, "--data.init_args.num_workers", "-1"],
         "error: data.init_args.num_workers -1: give 0 (decode in the training process) to {workers} (4 per core of "
         "this machine's {cores})"),
    Case("num-workers-past-the-cores", ["fit", *BIRDS, "--data.init_args.num_workers", "100000"],
         "error: data.init_args.num_workers 100000: give 0 (decode in the training process) to {workers} (4 per core "
         "of this machine's {cores})"),
    Case("image-size-0", ["fit", *BIRDS, "--data.init_args.image_size", "0"],
         "error: data.init_args.image_size 0: give 1 to 6324 pixels (the crop's side)"),
    Case("image-size-past-the-pixel-limit", ["fit", *BIRDS, "--data.init_args.image_size", "1000000"],
         "error: data.init_args.image_size 1000000: give 1 to 6324 pixels (the crop's side)"),
    # extra: sweeps
    Case("sweep-jobs-past-the-cores", ["configs/sweeps/penguins.yaml", "--n_jobs", "1000", "--outputs", "{outputs}"],
         "error: --n_jobs 1000: give 1 to {cores} trials at once (this machine's cores)", module="scripts.sweep"),
    # end extra: sweeps
    # extra: bench
    Case("bench-rounds-0", ["--repeats", "0"], "error: argument --repeats: 0: give 1 or more",
         module="scripts.bench.mnist"),
    Case("bench-steps-past-an-epoch", ["--steps", "5000"],
         "error: argument --steps: 5000: give 12 to 430", module="scripts.bench.loop_cost"),
    Case("bench-batch-size-0", ["--batch-size", "0"], "error: argument --batch-size: 0: give 1 or more",
         module="scripts.bench.birds"),
    Case("bench-epochs-not-a-number", ["--epochs", "many"],
         "error: argument --epochs: 'many' is not a whole number", module="scripts.bench.penguins"),
    # end extra: bench
    # extra: serving
    Case("export-opset-the-exporter-cannot-write", ["{penguins_ckpt}", "--opset", "5"],
         "error: --opset 5: give 18 to 28 (what torch and onnx write)", module="scripts.export"),
    # end extra: serving
    Case("outputs-not-writable", ["fit", "--trainer.default_root_dir", "{user}/notes.txt/outputs"],
         "error: {user}/notes.txt/outputs: cannot write there (Not a directory); give --trainer.default_root_dir a "
         "folder you can write"),
    Case("checkpoint-dir-is-a-file", ["fit", "--checkpoint_dir", "{user}/notes.txt"],
         "error: --checkpoint_dir {user}/notes.txt: a file, not a folder; give a folder, or a path that does not "
         "exist yet"),
    Case("torchrun-devices", ["fit", "--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu",
                              "--trainer.devices", "1"],
         "error: the launcher started 2 processes (WORLD_SIZE), but the Trainer has devices 1 x num_nodes 1: give "
         "--trainer.devices 2 --trainer.num_nodes 1 (devices: processes per node)",
         env={"WORLD_SIZE": "2", "LOCAL_RANK": "0", "RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "{port}"}),
    Case("azure-nodes", ["fit", "--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu",
                         "--trainer.devices", "2"],
         "error: the launcher started 4 processes (WORLD_SIZE), but the Trainer has devices 2 x num_nodes 1: give "
         "--trainer.devices 2 --trainer.num_nodes 2 (devices: processes per node)",
         env={"WORLD_SIZE": "4", "LOCAL_RANK": "0", "RANK": "0", "NODE_RANK": "0", "LOCAL_WORLD_SIZE": "2",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}"}),  # fmt: skip
    Case("predict-on-several-processes", ["predict", "--ckpt_path", "{penguins_ckpt}", "--config",
                                          "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu",
                                          "--trainer.devices", "2", "--data.init_args.predict_path",
                                          "configs/examples/penguins.csv"],
         "error: predict runs in one process: give --trainer.devices 1 --trainer.num_nodes 1"),
    # ---- checkpoints ----
    Case("validate-without-checkpoint", ["validate"], f"error: validate {GIVE_CKPT}"),
    Case("test-without-checkpoint", ["test"], f"error: test {GIVE_CKPT}"),
    Case("predict-without-checkpoint", ["predict", "--data.init_args.predict_path", "configs/examples/penguins.csv"],
         f"error: predict {GIVE_CKPT}"),
    Case("checkpoint-missing", ["test", "--ckpt_path", "{user}/nope.ckpt"],
         "error: {user}/nope.ckpt: no such checkpoint; give --ckpt_path a .ckpt that fit wrote "
         "(outputs/<exp>/<run>/checkpoints/)"),
    Case("checkpoint-that-is-not-one", ["test", "--ckpt_path", "{user}/notes.txt"],
         "error: {user}/notes.txt: not a checkpoint this can read (not torch.save's zip format, or cut short); give a "
         ".ckpt written by scripts.train fit"),
    Case("checkpoint-cut-short", ["test", "--ckpt_path", "{user}/cut_short.ckpt"],
         "error: {user}/cut_short.ckpt: not a checkpoint this can read (not torch.save's zip format, or cut short); "
         "give a .ckpt written by scripts.train fit"),
    Case("test-with-another-network-width", ["test", "--ckpt_path", "{penguins_ckpt}",
                                             "--model.network.init_args.hidden", "64"],
         "error: --model.network.init_args.hidden 64: {penguins_ckpt} was trained with 10, and validate, test and "
         "predict use its network as trained; leave --model.network.init_args.hidden out"),
    Case("birds-checkpoint-on-penguins", ["test", "--ckpt_path", "{birds_ckpt}"],
         "error: --ckpt_path {birds_ckpt}: trained on classes ['chickens', 'turkeys'], but the data has ['Adelie', "
         "'Gentoo', 'Chinstrap']; give the checkpoint of this task, or data of its classes"),
    Case("penguins-checkpoint-on-mnist", ["test", *MNIST, "--ckpt_path", "{penguins_ckpt}"],
         "error: --ckpt_path {penguins_ckpt}: trained on classes ['Adelie', 'Gentoo', 'Chinstrap'], but the data has "
         "['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']; give the checkpoint of this task, or data of its "
         "classes"),
    Case("birds-test-other-classes", ["test", *BIRDS, "--ckpt_path", "{birds_ckpt}", "--data.init_args.data_dir",
                                      "{user}/other-birds"],
         "error: data.init_args.classes (the checkpoint's, at validate, test and predict) and {user}/other-birds/train "
         "have different classes: ['chickens'] only in data.init_args.classes (the checkpoint's, at validate, test "
         "and predict); ['ducks', 'geese'] only in {user}/other-birds/train; give both the same"),
    Case("resume-with-another-lr", ["fit", "--checkpoint_dir", "{penguins_ckpt_dir}",
                                    "--model.optimizer.init_args.lr", "0.01"],
         "error: --model.optimizer.init_args.lr 0.01: {penguins_ckpt_dir}/last.ckpt was trained with 0.001, and a "
         "resume goes on as it began; give --model.optimizer.init_args.lr 0.001, or a new --checkpoint_dir to train "
         "anew"),
    Case("resume-of-another-task", ["fit", "--checkpoint_dir", "{birds_ckpt_dir}"],
         "error: --data.class_path datamodules.penguins.PenguinDataModule: {birds_ckpt_dir}/last.ckpt was trained "
         "with datamodules.image_folder.ImageFolderDataModule (and 14 more option(s)), and a resume goes on as it "
         "began; give --data.class_path datamodules.image_folder.ImageFolderDataModule, or a new --checkpoint_dir to "
         "train anew"),
    # extra: serving
    Case("export-missing", ["{user}/nope.ckpt"],
         "error: {user}/nope.ckpt: no such checkpoint file; give the path of a .ckpt (outputs/.../best.ckpt)",
         module="scripts.export"),
    Case("export-opset-not-a-number", ["{user}/nope.ckpt", "--opset", "many"],
         "error: --opset: 'many' is not a valid value; give int (python -m scripts.export --help lists the options)",
         module="scripts.export"),
    Case("export-not-a-checkpoint", ["{user}/notes.txt"],
         "error: {user}/notes.txt: not a checkpoint this can read (UnpicklingError); give a .ckpt written by "
         "scripts.train fit", module="scripts.export"),
    # end extra: serving
    # ---- penguins ----
    Case("csv-missing", ["fit", "--data.init_args.csv_path", "{user}/nope.csv"],
         "error: {user}/nope.csv: no such file; give data.init_args.csv_path an existing CSV"),
    Case("csv-missing-columns", ["fit", "--data.init_args.csv_path", "{user}/missing_columns.csv"],
         "error: {user}/missing_columns.csv: missing columns; a penguin CSV needs island, bill_length_mm, "
         "bill_depth_mm, flipper_length_mm, body_mass_g, species or Island, CulmenLength, CulmenDepth, FlipperLength, "
         "BodyMass, Species (no CulmenDepth, FlipperLength, BodyMass)"),
    Case("csv-non-numeric", ["fit", "--data.init_args.csv_path", "{user}/non_numeric.csv"],
         "error: {user}/non_numeric.csv: column CulmenLength has a non-numeric value 'abc' on line 3; fix or remove "
         "that row"),
    Case("csv-no-complete-row", ["fit", "--data.init_args.csv_path", "{user}/no_complete_row.csv"],
         "error: {user}/no_complete_row.csv: no row has all of Island, CulmenLength, CulmenDepth, FlipperLength, "
         "BodyMass, Species"),
    Case("csv-unknown-island", ["fit", "--data.init_args.csv_path", "{user}/unknown_island.csv"],
         "error: {user}/unknown_island.csv: unknown island 'Atlantis' in column Island on line 2; the model knows "
         "Torgersen, Biscoe, Dream"),
    Case("csv-empty", ["fit", "--data.init_args.csv_path", "{user}/empty.csv"],
         "error: {user}/empty.csv: not a readable CSV (No columns to parse from file)"),
    Case("csv-not-text", ["fit", "--data.init_args.csv_path", "{user}/garbage.csv"],
         "error: {user}/garbage.csv: not a readable CSV ('utf-8' codec can't decode byte 0x80 in position 128: "
         "invalid start byte)"),
    Case("one-species", ["fit", "--data.init_args.csv_path", "{user}/one_species.csv"],
         "error: {user}/one_species.csv: every complete row is Adelie; a classifier needs rows of at least two "
         "species (Adelie, Gentoo, Chinstrap)"),
    Case("not-a-species", ["fit", "--data.init_args.csv_path", "{user}/not_a_species.csv"],
         "error: {user}/not_a_species.csv: line 3: Species '12' is none of Adelie, Gentoo, Chinstrap or 0/1/2; fix or "
         "remove that row"),
    Case("too-few-rows", ["fit", "--data.init_args.csv_path", "{user}/five_rows.csv"],
         "error: {user}/five_rows.csv: 5 complete rows leave no Adelie, Chinstrap, Gentoo in the validation split; "
         "give more rows of each species (or change data.init_args.val_fraction / test_fraction)"),
    Case("csv-infinite", ["fit", "--data.init_args.csv_path", "{user}/infinite.csv"],
         "error: {user}/infinite.csv: line 6, column CulmenLength: 'inf' is not a finite number; give the "
         "measurement, or leave the cell empty to drop the row"),
    Case("csv-nan-spelled-out", ["fit", "--data.init_args.csv_path", "{user}/nan_spelled.csv"],
         "error: {user}/nan_spelled.csv: line 4, column BodyMass: 'nan' is not a finite number; give the "
         "measurement, or leave the cell empty to drop the row"),
    Case("csv-absurd-value", ["fit", "--data.init_args.csv_path", "{user}/absurd_mass.csv"],
         "error: {user}/absurd_mass.csv: line 8, column BodyMass: 3.6e+09 is no penguin's (1500 to 9000 g); fix or "
         "remove that row"),
    Case("predict-infinite", ["predict", "--ckpt_path", "{penguins_ckpt}", "--data.init_args.predict_path",
                              "{user}/predict_infinite.csv"],
         "error: {user}/predict_infinite.csv: line 2, column BodyMass: '-inf' is not a finite number; give the "
         "measurement, or leave the cell empty to drop the row"),
    Case("csv-thousands-separator", ["fit", "--data.init_args.csv_path", "{user}/thousands.csv"],
         "error: {user}/thousands.csv: line 6 has 7 values, the header names 6 columns (Island, CulmenLength, "
         "CulmenDepth, FlipperLength, BodyMass, Species); remove the extra values (a thousands separator: 5000, not "
         "5,000) or name their columns"),
    Case("csv-semicolons", ["fit", "--data.init_args.csv_path", "{user}/semicolons.csv"],
         "error: {user}/semicolons.csv: its columns are separated by ';', not commas; save it as a comma-separated CSV "
         "in UTF-8 (a spreadsheet's \"CSV UTF-8 (Comma delimited)\")"),
    Case("csv-utf-16", ["fit", "--data.init_args.csv_path", "{user}/unicode_text.csv"],
         "error: {user}/unicode_text.csv: UTF-16 text, not UTF-8; save it as a comma-separated CSV in UTF-8 (a "
         "spreadsheet's \"CSV UTF-8 (Comma delimited)\")"),
    Case("csv-excel-workbook", ["fit", "--data.init_args.csv_path", "{user}/penguins.xlsx"],
         "error: {user}/penguins.xlsx: a zip archive (an Excel workbook?), not a CSV; save it as a comma-separated CSV "
         "in UTF-8 (a spreadsheet's \"CSV UTF-8 (Comma delimited)\")"),
    Case("predict-column-twice", ["predict", "--ckpt_path", "{penguins_ckpt}", "--data.init_args.predict_path",
                                  "{user}/two_masses.csv"],
         "error: {user}/two_masses.csv: column BodyMass is named 2 times (columns 5 and 6); keep one, or rename the "
         "others"),
    Case("predict-extra-values", ["predict", "--ckpt_path", "{penguins_ckpt}", "--data.init_args.predict_path",
                                  "{user}/extra_values.csv"],
         "error: {user}/extra_values.csv: line 2 has 6 values, the header names 5 columns (Island, CulmenLength, "
         "CulmenDepth, FlipperLength, BodyMass); remove the extra values (a thousands separator: 5000, not 5,000) or "
         "name their columns"),
    Case("fractions-leave-nothing", ["fit", "--data.init_args.val_fraction", "0.6",
                                     "--data.init_args.test_fraction", "0.5"],
         "error: data.init_args.val_fraction 0.6 + test_fraction 0.5: give fractions of 0 or more that leave rows to "
         "train on (a sum below 1)"),
    Case("course-units", ["predict", "--ckpt_path", "{penguins_ckpt}", "--data.init_args.predict_path",
                          "{user}/course_units.csv"],
         "error: {user}/course_units.csv: line 2: FlipperLength 20 is far outside what the model was trained on (172 "
         "to 230); give millimetres and grams, as in the training data"),
    Case("predict-unknown-island", ["predict", "--ckpt_path", "{penguins_ckpt}", "--data.init_args.predict_path",
                                    "{user}/atlantis.csv"],
         "error: {user}/atlantis.csv: unknown island 'Atlantis' in column Island on line 2; the model knows "
         "Torgersen, Biscoe, Dream"),
    Case("predict-without-a-csv", ["predict", "--ckpt_path", "{penguins_ckpt}"],
         "error: predict needs data.init_args.predict_path: a CSV of penguins"),
    Case("predict-csv-missing", ["predict", "--ckpt_path", "{penguins_ckpt}", "--data.init_args.predict_path",
                                 "{user}/nope.csv"],
         "error: {user}/nope.csv: no such file; give data.init_args.predict_path an existing CSV"),
    # ---- MNIST ----
    Case("mnist-gz-damaged", ["fit", *MNIST, "--data.init_args.data_dir", "{user}/mnist-damaged"],
         "error: {user}/mnist-damaged/train-images-idx3-ubyte.gz: broken gzip data (Error -3 while decompressing "
         "data: invalid block type); delete it and download it again"),
    Case("mnist-truncated", ["fit", *MNIST, "--data.init_args.data_dir", "{user}/mnist-truncated"],
         "error: {user}/mnist-truncated/train-images-idx3-ubyte.gz: 7756 bytes do not hold the (10, 28, 28) array its "
         "header announces (truncated?)"),
    Case("mnist-labels-as-images", ["fit", *MNIST, "--data.init_args.data_dir", "{user}/mnist-labels-as-images"],
         "error: {user}/mnist-labels-as-images/train-images-idx3-ubyte.gz: not an MNIST idx file (magic number 2049, "
         "expected 2051); use the original files from http://yann.lecun.com/exdb/mnist/ or a mirror"),
    Case("mnist-missing-offline", ["fit", *MNIST, "--data.init_args.data_dir", "{user}/mnist-empty",
                                   "--data.init_args.mirrors", "[http://127.0.0.1:{port}]"],
         "error: MNIST files missing in {user}/mnist-empty and the download failed (http://127.0.0.1:{port}/"
         "train-images-idx3-ubyte.gz: [Errno 111] Connection refused); put train-images-idx3-ubyte.gz, "
         "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz (gzipped or not) there or "
         "set data.init_args.data_dir to their folder"),
    Case("mnist-test-file-truncated", ["fit", *MNIST, "--data.init_args.data_dir", "{user}/mnist-test-truncated"],
         "error: {user}/mnist-test-truncated/t10k-images-idx3-ubyte.gz: 7756 bytes do not hold the (10, 28, 28) array "
         "its header announces (truncated?)"),  # found before the first step: no run, no checkpoint left
    Case("mnist-header-cut-short", ["fit", *MNIST, "--data.init_args.data_dir", "{user}/mnist-header-cut-short"],
         "error: {user}/mnist-header-cut-short/train-images-idx3-ubyte.gz: 8 bytes do not hold an idx header of 3 "
         "dimensions (truncated?)"),
    Case("mnist-predict-idx-of-no-images", ["predict", *MNIST, "--ckpt_path", "{mnist_ckpt}",
                                            "--data.init_args.predict_path", "{user}/no-digits.idx"],
         "error: {user}/no-digits.idx: its header announces a (0, 28, 28) array, which holds no images; give a file of "
         "some"),
    Case("mnist-data-dir-is-a-file", ["fit", *MNIST, "--data.init_args.data_dir", "{user}/notes.txt",
                                      "--data.init_args.mirrors", "[http://127.0.0.1:{port}]"],
         "error: {user}/notes.txt: a file, not a folder; give data.init_args.data_dir the folder holding the four "
         "MNIST files (or one to download them to)"),
    Case("mnist-predict-a-zip", ["predict", *MNIST, "--ckpt_path", "{mnist_ckpt}", "--data.init_args.predict_path",
                                 "{user}/digits.zip"],
         "error: {user}/digits.zip: neither an image (JPEG, PNG, WebP or GIF) nor an idx file of images; give "
         "predict_path a folder of images, one image, or an idx file of images"),
    Case("mnist-val-size-0", ["fit", *MNIST, "--data.init_args.val_size", "0"],
         "error: data.init_args.val_size 0: give 1 to 59999 (MNIST has 60000 training images)"),
    Case("mnist-predict-no-images", ["predict", *MNIST, "--ckpt_path", "{mnist_ckpt}",
                                     "--data.init_args.predict_path", "{user}/digits-none"],
         "error: {user}/digits-none: no image (JPEG, PNG, WebP or GIF) in this folder"),
    Case("mnist-predict-broken-image", ["predict", *MNIST, "--ckpt_path", "{mnist_ckpt}",
                                        "--data.init_args.predict_path", "{user}/digits-broken"],
         f"error: {{user}}/digits-broken/7.png: not a readable image ({NOT_AN_IMAGE}); remove or replace it"),
    # ---- birds ----
    Case("birds-folder-missing", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/nope"],
         "error: {user}/nope: no such folder; give data.init_args.data_dir a folder of labelled images or "
         "data.init_args.archive a .zip/.tar.gz to extract there"),
    Case("birds-archive-missing", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/nope",
                                   "--data.init_args.archive", "{user}/nope.zip"],
         "error: {user}/nope.zip: no such archive; give data.init_args.archive an existing .zip or .tar.gz"),
    Case("birds-val-of-other-classes", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-other-val"],
         "error: {user}/birds-other-val/train and {user}/birds-other-val/val have different classes: ['turkeys'] only "
         "in {user}/birds-other-val/train; ['ducks'] only in {user}/birds-other-val/val; give both the same"),
    Case("birds-empty-class", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-empty-class"],
         "error: {user}/birds-empty-class/train/geese: class 'geese' has no images; add some or remove the folder"),
    Case("birds-no-train-folder", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-no-train"],
         "error: {user}/birds-no-train: has val/ but no train/; add it or rename the folder"),
    Case("birds-unreadable-image", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-broken"],
         f"error: 1 file(s) are not readable images: {{user}}/birds-broken/val/turkeys/broken.jpg ({NOT_AN_IMAGE}); "
         "remove or replace them"),
    Case("birds-unreadable-image-in-a-worker", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-broken-late",
                                                "--data.init_args.verify_images", "false",
                                                "--data.init_args.num_workers", "1"],
         f"error: {{user}}/birds-broken-late/train/turkeys/broken.jpg: not a readable image ({NOT_AN_IMAGE}); remove "
         "or replace it", trained=True),  # a batch after the first
    Case("birds-image-too-narrow-to-crop", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-strip"],
         "error: {user}/birds-strip/val/turkeys/strip.png: 60000x1 pixels, which the centre crop would resize to "
         "2220000x37; send a picture whose sides are nearer alike (resized, at most 40000000 pixels: "
         "SCORE_MAX_IMAGE_PIXELS)", trained=True),  # met in the first epoch's validation
    Case("birds-val-fraction-0", ["fit", *BIRDS, "--data.init_args.val_fraction", "0"],
         "error: data.init_args.val_fraction 0.0: give a fraction between 0 and 1 (exclusive)"),
    Case("birds-weights-missing", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds",
                                   "--model.network.init_args.weights_path", "{user}/nope.pth"],
         "error: {user}/nope.pth: no such weights file; give weights_path a state dict (.pth)"),
    Case("birds-zip-damaged", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/unzipped",
                               "--data.init_args.archive", "{user}/damaged.zip"],
         "error: {user}/damaged.zip: damaged or cut short (Error -3 while decompressing data: invalid block type); "
         "download it again"),
    Case("birds-tar-gz-cut-short", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/untarred",
                                    "--data.init_args.archive", "{user}/cut.tar.gz"],
         "error: {user}/cut.tar.gz: damaged or cut short (Compressed file ended before the end-of-stream marker was "
         "reached); download it again"),
    Case("birds-extract-into-a-file", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/notes.txt",
                                       "--data.init_args.archive", "{user}/fowl.tar.gz"],
         "error: {user}/notes.txt: a file, not a folder; give data.init_args.data_dir a folder to extract "
         "{user}/fowl.tar.gz into"),
    Case("birds-dangling-link", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-dangling"],
         "error: {user}/birds-dangling/val/turkeys/gone.jpg: a link to ../../../deleted.jpg, which does not exist; "
         "remove it or restore its target"),
    Case("birds-link-above-its-class", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-loop"],
         "error: {user}/birds-loop/train/chickens/loop: a link to .., a folder holding "
         "{user}/birds-loop/train/chickens itself (a loop): what lies beside chickens would be read as in it; remove "
         "the link"),
    Case("birds-class-link-above-its-split", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-split-loop"],
         "error: {user}/birds-split-loop/train/loop: a link to .., a folder holding {user}/birds-split-loop/train (a "
         "loop): every image below it would be read as class 'loop'; remove the link"),
    Case("birds-class-linked-to-another", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-class-twice"],
         "error: {user}/birds-class-twice/train/hens/0.png: the same file as {user}/birds-class-twice/train/chickens/"
         "0.png (through {user}/birds-class-twice/train/hens, a link to chickens): one picture labelled both "
         "'chickens' and 'hens'; remove the link"),
    Case("birds-validation-linked-into-training", ["fit", *BIRDS, "--data.init_args.data_dir",
                                                   "{user}/birds-val-in-train"],
         "error: {user}/birds-val-in-train/train/chickens/extra/0.png: the same file as {user}/birds-val-in-train/val/"
         "chickens/0.png (through {user}/birds-val-in-train/train/chickens/extra, a link to ../../val/chickens): one "
         "picture both trained on and scored in val; remove the link"),
    Case("birds-copy-in-two-classes", ["fit", *BIRDS, "--data.init_args.data_dir", "{user}/birds-copy-in-two-classes"],
         "error: 1 picture(s) labelled twice, byte-identical files in two classes: {user}/birds-copy-in-two-classes/"
         "val/turkeys/copy.png = {user}/birds-copy-in-two-classes/train/chickens/0.png ('chickens' in train, "
         "'turkeys' in val); remove each from the class it does not belong to"),
    Case("birds-predict-nothing-there", ["predict", *BIRDS, "--ckpt_path", "{birds_ckpt}",
                                         "--data.init_args.predict_path", "{user}/nope"],
         "error: {user}/nope: no such file or folder; give predict_path a folder of images or one image"),
    # ---- tracking ----
    Case("file-store", ["fit"],
         "error: MLFLOW_TRACKING_URI file://{user}/mlruns: a plain-file MLflow store (in maintenance mode in MLflow 3, "
         "and it cannot hold this config's parameters); use sqlite:///path/to/mlflow.db, a server's http:// URL, or "
         "unset it for outputs/mlflow.db",
         env={"MLFLOW_TRACKING_URI": "file://{user}/mlruns"}),
    Case("server-down", ["fit"],
         "error: MLFLOW_TRACKING_URI http://127.0.0.1:{port}: the tracking server does not answer ([Errno 111] "
         "Connection refused); start it, correct the URI, or unset MLFLOW_TRACKING_URI to track to outputs/mlflow.db",
         env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:{port}"}),
    Case("databricks-without-credentials", ["fit"],
         "error: MLFLOW_TRACKING_URI databricks: no Databricks credentials found; set DATABRICKS_HOST and "
         "DATABRICKS_TOKEN (or run `databricks auth login`), or unset MLFLOW_TRACKING_URI to track to "
         "outputs/mlflow.db",
         env={"MLFLOW_TRACKING_URI": "databricks", "HOME": "{user}/../home"}),  # no ~/.databrickscfg
    Case("plot-of-no-run", ["0123abc", "--tracking-uri", "sqlite:///{outputs}/mlflow.db"],
         "error: sqlite:///{outputs}/mlflow.db: Run with id=0123abc not found; give a run id of this store (`make "
         "mlflow-ui` lists them), or none for the newest run", module="scripts.plot"),
    # extra: azure
    # ---- Azure ML submission: each before the Azure SDK is imported ----
    Submit("submit-config-missing", ["configs/nope.yaml", "--compute", "c"],
         "error: configs/nope.yaml: no such config in this folder; give a path like configs/penguins.yaml"),
    Submit("submit-no-compute", ["configs/penguins.yaml"],
         "error: give the compute cluster to run on: --compute NAME (or --compute serverless)"),
    Submit("submit-no-nodes", [*SUBMIT, "--nodes", "0"],
         "error: --nodes 0 --processes_per_node 1: both must be 1 or more"),
    Submit("submit-nodes-not-a-number", [*SUBMIT, "--nodes", 'two'],
         "error: --nodes: 'two' is not a valid value; give int (python -m scripts.submit --help lists the "
         "options)"),
    Submit("submit-distribution", [*SUBMIT, "--distribution", 'tf'],
         "error: --distribution: 'tf' is not a valid value; give pytorch, mpi (python -m scripts.submit "
         "--help lists the options)"),
    Submit("submit-input-without-path", [*SUBMIT, "--inputs+", "data_dir"],
         "error: --inputs data_dir: give OPTION=PATH, e.g. data.init_args.data_dir=azureml:mnist:1"),
    Submit("submit-input-not-there", [*SUBMIT, "--inputs+", "x=no/"],
         "error: --inputs x=no/: no such file or folder no/"),
    Submit("submit-inputs-of-one-name", [*SUBMIT, "--inputs", "[data.dir=azureml:a:1, model.dir=azureml:b:1]"],
         "error: --inputs model.dir=azureml:b:1: another input also ends in .dir"),
    Submit("submit-input-mode", [*SUBMIT, "--inputs+", "data.init_args.data_dir=azureml:mnist:1,mode=copy"],
         "error: --inputs data.init_args.data_dir=azureml:mnist:1,mode=copy: 'mode=copy' is not "
         "type=(uri_folder|uri_file|mltable) or mode=(ro_mount|download|direct|eval_mount|eval_download)"),
    Submit("submit-input-type", [*SUBMIT, "--inputs+", "data.init_args.data_dir=azureml:mnist:1,type=folder"],
         "error: --inputs data.init_args.data_dir=azureml:mnist:1,type=folder: 'type=folder' is not "
         "type=(uri_folder|uri_file|mltable) or mode=(ro_mount|download|direct|eval_mount|eval_download)"),
    Submit("submit-folder-as-file", [*SUBMIT, "--inputs+", "data.init_args.path=configs,type=uri_file"],
         "error: --inputs data.init_args.path=configs,type=uri_file: configs is a folder"),
    # end extra: azure
    # extra: azure, horovod
    Submit("submit-horovod-without-mpi", [*SUBMIT, "--presets", "[configs/trainer/horovod.yaml]", "--nodes", "2"],
         "error: Horovod's processes are started by mpirun: add --distribution mpi"),
    Submit("submit-horovod-image", [*SUBMIT, "--presets+", "configs/trainer/horovod.yaml", "--image", "x"],
         "error: --image: Horovod jobs run on the image strategies/horovod/Dockerfile builds; edit its FROM"),
    # end extra: azure, horovod
    # extra: azure
    Submit("submit-ddp-mpi-preset", [*SUBMIT, "--presets+", "configs/trainer/ddp_mpi.yaml"],
         "error: --presets configs/trainer/ddp_mpi.yaml: submit adds it itself; give --nodes, "
         "--processes_per_node and --distribution"),
    Submit("submit-ddp-preset", [*SUBMIT, "--presets+", "configs/trainer/ddp.yaml"],
         "error: --presets configs/trainer/ddp.yaml: submit adds it itself; give --nodes, "
         "--processes_per_node and --distribution"),
    Submit("submit-devices", [*SUBMIT, "--processes_per_node", "4", "--train_args", "--trainer.devices 2"],
         "error: --train_args --trainer.devices: the job's processes decide it; give --processes_per_node"),
    Submit("submit-num-nodes", [*SUBMIT, "--train_args=--trainer.num_nodes=3"],
         "error: --train_args --trainer.num_nodes=3: the job's processes decide it; give --nodes"),
    Submit("submit-strategy", [*SUBMIT, "--train_args", "--trainer.strategy ddp"],
         "error: --train_args --trainer.strategy: the job's processes decide it; give --distribution (or "
         "--presets+ a preset)"),
    Submit("submit-train-args-unclosed-quote", [*SUBMIT, "--train_args", "--trainer.logger.init_args.run_name 'a b"],
         "error: --train_args --trainer.logger.init_args.run_name 'a b: not a command line (no closing quotation); "
         "close each quote it opens"),
    Submit("submit-stream-a-dry-run", [*SUBMIT, "--dry_run", "true", "--stream", "true"],
         "error: --stream follows a submitted job: leave out --dry_run"),
    Submit("submit-workspace-half-named", [*SUBMIT, "--workspace", "ws"],
         "error: name the workspace with all three of --subscription_id --resource_group --workspace"),
    Submit("submit-subscription-not-a-guid", [*SUBMIT, "--subscription_id", "my-subscription", "--resource_group", "rg",
                                              "--workspace", "penguins-ws"],
         "error: --subscription_id 'my-subscription': Azure takes a GUID, 8-4-4-4-12 hexadecimal digits; give the "
         "workspace's, as its config.json (the studio's 'Download config file') has it"),
    Submit("submit-tier", [*SUBMIT, "--tier", "low"],
         "error: --tier: 'low' is not a valid value; give spot, standard (python -m scripts.submit --help lists the "
         "options)"),
    Submit("submit-timeout", [*SUBMIT, "--timeout", "4 hours"],
         "error: --timeout '4 hours': give seconds (3600) or a duration such as 90m, 4h, 1h30m or 2d"),
    # end extra: azure
    # extra: azure, sweeps
    Submit("submit-timeout-of-a-sweep", [*SUBMIT, "--sweep", "configs/sweeps/penguins.yaml", "--timeout", "1h"],
         "error: --timeout with --sweep: a sweep's limits are its file's budget.time and budget.trial_time"),
    # end extra: azure, sweeps
    # extra: azure
    Submit("submit-shm-size", [*SUBMIT, "--shm_size", "8GB"],
         "error: --shm_size '8GB': give a number and a unit of b, k, m or g, e.g. 8g"),
    Submit("submit-environment-not-registered", [*SUBMIT, "--environment", "lightning-training"],
         "error: --environment 'lightning-training': give a registered one as azureml:NAME:VERSION, e.g. "
         "azureml:lightning-training:1"),
    Submit("submit-environment-and-image", [*SUBMIT, "--environment", "azureml:lightning-training:1", "--image", "x"],
         "error: --image and --environment: a registered environment has its image; give one of them"),
    Submit("submit-yaml-file-without-dry-run", [*SUBMIT, "--yaml_file", "{user}/job.yml"],
         "error: --yaml_file {user}/job.yml writes the job's YAML instead of submitting it: add --dry_run true"),
    Submit("submit-yaml-file-a-folder", [*SUBMIT, "--dry_run", "true", "--yaml_file", "{user}"],
         "error: --yaml_file {user}: a folder; give a file name in it, e.g. {user}/job.yml"),
    Submit("submit-yaml-file-under-a-file", [*SUBMIT, "--dry_run", "true", "--yaml_file", "{user}/notes.txt/job.yml"],
         "error: --yaml_file {user}/notes.txt/job.yml: {user}/notes.txt is a file, not a folder; give another path"),
    Submit("submit-from-another-folder", [str(REPO / "configs/penguins.yaml"), "--compute", "c"],
         "error: environment.yml is not in this folder: run from the repository's root (the job's code)",
           cwd="{user}", env={"PYTHONPATH": str(REPO)}),
    # end extra: azure
    # extra: azure, serving
    # ---- Azure ML pipelines and deployment, before the Azure SDK is imported ----
    Case("pipeline-serverless-gpus-without-a-gpu-size", ["configs/birds.yaml", "--compute", "serverless",
                                                         "--presets+", "configs/trainer/gpu.yaml"],
         "error: --compute serverless: the configs run on GPUs and serverless picks a CPU VM; give --instance_type a "
         "GPU size, e.g. Standard_NC4as_T4_v3", module="scripts.pipeline"),
    Case("pipeline-instance-type-of-a-cluster", [*SUBMIT, "--instance_type", "Standard_DS3_v2"],
         "error: --instance_type Standard_DS3_v2: the VM size of serverless compute; the cluster c has its own: leave "
         "it out, or give --compute serverless", module="scripts.pipeline"),
    Case("deploy-gpu-size-for-the-cpu-environment", ["online", "penguins-classifier:1", "--endpoint", "penguins",
                                                      "--instance_type", "Standard_NC4as_T4_v3", "--dry_run", "true"],
         "error: --instance_type Standard_NC4as_T4_v3: a GPU size, but the model scores on CPUs (ONNX Runtime's CPU "
         "build, in its requirements and scripts/serving/environment.yml); give a CPU size such as Standard_DS3_v2, or "
         "--scoring script --environment a registered serving environment built for GPUs", module="scripts.deploy"),
    # end extra: azure, serving
    # extra: spark
    # ---- Spark, before a JVM starts ----
    Case("spark-master-not-a-url", ["fit", "--config", "configs/penguins.yaml", "--num_processes", "2", "--master",
                                    "local[two]"],
         "error: --master local[two]: not a Spark master URL; give local[N], local-cluster[W,C,M] (W workers of C "
         "cores and M MB), spark://HOST:PORT, yarn or k8s://HOST:PORT",
         module="scripts.spark", env={"JAVA_HOME": "/none"}),  # no JVM would start: Spark is never asked
    Case("spark-more-processes-than-slots", ["fit", "--config", "configs/penguins.yaml", "--num_processes", "3",
                                             "--master", "local[2]", "--trainer.default_root_dir", "{outputs}"],
         "error: --num_processes 3: its 3 Spark tasks run at once (a barrier stage), and the master local[2] has 2 "
         "task slots (1 executor x (2 cores // spark.task.cpus 1)); give --master local[3] (or "
         "local-cluster[3,1,1024])", module="scripts.spark", env={"JAVA_HOME": "/none"}),
    Case("spark-without-java", ["fit", "--config", "configs/penguins.yaml", "--num_processes", "1",
                                "--trainer.default_root_dir", "{outputs}"],
         "error: Spark did not start on local[1] ([JAVA_GATEWAY_EXITED] Java gateway process exited before sending its "
         "port number); check --master, and Java 17 (`java -version`, JAVA_HOME)",
         module="scripts.spark", env={"JAVA_HOME": "{user}/no-java"}),
    # end extra: spark
    # extra: serving
    # ---- batch scoring (python -m scripts.score) with a penguin model made from a checkpoint by scripts.serve ----
    Case("score-empty-csv", ["{penguins_model}", "{user}/empty.csv"],
         "error: {user}/empty.csv is empty: send a CSV whose first line names the columns, one row a line",
         module="scripts.score"),
    Case("score-binary-csv", ["{penguins_model}", "{user}/garbage.csv"],
         "error: {user}/garbage.csv is not a readable CSV (not UTF-8 text); send a CSV of rows in the data's column "
         "names",
         module="scripts.score"),
    Case("score-extra-values", ["{penguins_model}", "{user}/extra_values.csv"],
         "error: {user}/extra_values.csv: line 2 has 6 values, the header names 5 columns (Island, CulmenLength, "
         "CulmenDepth, FlipperLength, BodyMass); remove the extra values (a thousands separator: 5000, not 5,000) or "
         "name their columns",
         module="scripts.score"),
    Case("score-a-folder-for-rows", ["{penguins_model}", "{user}/digits-broken"],
         "error: {user}/digits-broken: a folder; this model scores rows: give a CSV file of them",
         module="scripts.score"),
    Case("score-output-not-writable", ["{penguins_model}", "{user}/five_rows.csv", "--output",
                                       "{user}/notes.txt/predictions.csv"],
         "error: --output {user}/notes.txt/predictions.csv: cannot be written here; give a path in a folder you can "
         "write to", module="scripts.score"),
    # end extra: serving
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A penguin, a bird and an MNIST checkpoint, made side by side, for the cases that need one."""
    root = tmp_path_factory.mktemp("trained")
    bird_folders(root / "birds", count=2)
    mnist_files(root / "mnist", images=12)
    tasks = {
        "penguins": ["--config", "configs/penguins.yaml"],
        "birds": [*BIRDS, "--data.init_args.data_dir", str(root / "birds")],
        "mnist": [*MNIST, "--data.init_args.data_dir", str(root / "mnist")],
    }

    def fit(task: str) -> subprocess.CompletedProcess:
        args = ["fit", *tasks[task], "--trainer.max_epochs", "1", "--test_after_fit", "false",
                "--trainer.default_root_dir", str(root / task)]  # fmt: skip
        return warm_launcher.run("scripts.train", args, REPO, timeout=600)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(tasks, pool.map(fit, tasks)))
    found = {}
    for task, result in results.items():
        assert result.returncode == 0, f"{task}: {result.stderr[-2000:]}"
        (found[f"{task}_ckpt"],) = (root / task).glob("*/*/checkpoints/best.ckpt")
    return found


def checksums(*folders: Path) -> dict[str, str]:
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for folder in folders
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@dataclass
class Outcome:
    result: subprocess.CompletedProcess
    values: dict[str, str]
    untouched: bool  # the user's files and the checkpoints byte-identical afterwards
    outputs: Path


def empty_store(folder: Path) -> Path:
    """An MLflow sqlite store with its tables and no run, as a user's outputs/mlflow.db is after their first fit."""
    store = folder / "mlflow.db"
    MlflowClient(f"sqlite:///{store}").search_experiments(max_results=1)  # MLflow makes a new store's tables here
    return store


def run_case(case: Case, folder: Path, template: Path, checkpoints: dict[str, Path], store: Path) -> Outcome:
    user, outputs = folder / "user", folder / "outputs"
    shutil.copytree(template, user, symlinks=True)
    folders = {f"{key}_dir": Path(path).parent for key, path in checkpoints.items()}  # --checkpoint_dir of a fit
    cores = os.cpu_count()
    values = {"user": str(user), "outputs": str(outputs), "port": str(free_port()), "cores": cores,
              "workers": 4 * cores, **checkpoints, **folders}  # fmt: skip
    values = {key: str(value) for key, value in values.items()}
    # The user's folder and the checkpoints the case is given (a command cannot reach one it is not told of): hashing
    # all of them (28 MB) for each of the ~170 cases took ~20 s of CPU.
    given = " ".join([*case.args, *case.env.values(), case.cwd])
    named = [key for key in values if key.endswith("_ckpt") and f"{{{key}" in given]  # {key} or {key_dir}
    theirs = [user, *(Path(values[key]).parent for key in named)]
    before = checksums(*theirs)
    args = [arg.format(**values) for arg in case.args]
    if case.module == "scripts.train":
        if "--trainer.default_root_dir" not in args:
            args += ["--trainer.default_root_dir", str(outputs)]
            # An outputs folder that has a store already: MLflow makes a new one's tables in ~0.7 s of CPU (its
            # migrations), half of a refused command's here; its refusals must leave no run in it either.
            outputs.mkdir(parents=True)
            shutil.copy(store, outputs / "mlflow.db")
        if "--config" not in args or args[args.index("--config") + 1].startswith("configs/trainer/"):
            args[1:1] = ["--config", "configs/penguins.yaml"]  # the penguins task unless the case names one
    environ = {**os.environ, **{key: value.format(**values) for key, value in case.env.items()}}
    cwd = case.cwd.format(**values)
    if case.module in AZURE:  # a fresh interpreter: -X importtime tells what it imported before the error
        result = subprocess.run([sys.executable, "-X", "importtime", "-m", case.module, *args], cwd=cwd, env=environ,
                                capture_output=True, text=True, timeout=600)  # fmt: skip
    else:
        result = warm_launcher.run(case.module, args, cwd, environ, timeout=600)
    return Outcome(result, values, checksums(*theirs) == before, outputs)


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict[str, Outcome]:
    """Runs the cases this session selected, two at a time."""
    selected = {item.callspec.id for item in request.session.items if item.originalname == "test_a_mistake"}
    cases = [case for case in CASES if case.name in selected]
    template = tmp_path_factory.mktemp("template") / "user"
    make_user_folder(template)
    keys = ("penguins_ckpt", "birds_ckpt", "mnist_ckpt", "penguins_model")
    needs = {key for case in cases for arg in case.args for key in keys if f"{{{key}" in arg}
    checkpoints = dict(request.getfixturevalue("trained")) if needs else {}
    if "penguins_model" in needs:  # the model folder `python -m scripts.score` takes, as scripts.serve makes it
        serving = tmp_path_factory.mktemp("serving")
        made = warm_launcher.run("scripts.serve", [str(checkpoints["penguins_ckpt"]), "--prepare_only", "true",
                                                   "--serving_dir", str(serving)], REPO, timeout=600)  # fmt: skip
        assert made.returncode == 0, made.stderr[-3000:]
        checkpoints["penguins_model"] = made.stdout.strip().splitlines()[-1]
    root, store = tmp_path_factory.mktemp("cases"), empty_store(tmp_path_factory.mktemp("store"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = pool.map(lambda case: run_case(case, root / case.name, template, checkpoints, store), cases)
        return {case.name: outcome for case, outcome in zip(cases, done)}


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_mistake(case: Case, outcomes: dict[str, Outcome]):
    """One line on stderr naming the culprit and what to give instead, exit status 1, no traceback, nothing of the
    user's written over, no run recorded."""
    outcome = outcomes[case.name]
    stderr = outcome.result.stderr
    if case.module in AZURE:  # the check comes before the ~4 s import of the Azure SDK
        imported = [text.rsplit("|", 1)[-1].strip() for text in stderr.splitlines() if text.startswith("import time:")]
        assert not [name for name in imported if name.startswith("azure")]
        stderr = "\n".join(text for text in stderr.splitlines() if not text.startswith("import time:"))
    assert outcome.result.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == case.line.format(**outcome.values)
    assert outcome.untouched, "a file of the user's, or a checkpoint, was written over"
    assert not list(outcome.outputs.glob("*/*/")), "a run folder was left"
    if (outcome.outputs / "mlflow.db").exists():  # nor a run row, deleted or not, before training (tracking.md)
        client = MlflowClient(f"sqlite:///{outcome.outputs / 'mlflow.db'}")
        experiments = [experiment.experiment_id for experiment in client.search_experiments(ViewType.ALL)]
        view = ViewType.ACTIVE_ONLY if case.trained else ViewType.ALL
        assert client.search_runs(experiments, run_view_type=view) == [], "a run was recorded"


@pytest.fixture
def full_disk(tmp_path):
    """A 16 MB tmpfs (a fit's store and its artifacts fit), filled to its last byte once `fill` is called; skipped
    where mounting is not allowed (it needs root, or CAP_SYS_ADMIN in a container)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill here: {mounted.stderr.decode().strip()}")

    def fill() -> None:
        with open(disk / "filler", "wb", buffering=0) as filler, pytest.raises(OSError):  # nothing left to flush
            while True:
                filler.write(bytes(1 << 16))
                filler.flush()

    yield disk, fill
    subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(full_disk, tmp_path):
    disk, fill = full_disk
    fit = ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "2", "--test_after_fit", "false"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return warm_launcher.run("scripts.train", [*fit, *args], REPO)

    # The MLflow store's disk fills between a fit and its resume.
    store, checkpoints = disk / "outputs", tmp_path / "checkpoints"
    first = run("--trainer.default_root_dir", str(store), "--checkpoint_dir", str(checkpoints))
    assert first.returncode == 0, first.stderr[-3000:]
    fill()
    before = checksums(checkpoints)
    resumed = run("--trainer.default_root_dir", str(store), "--checkpoint_dir", str(checkpoints),
                  "--trainer.max_epochs", "4")  # fmt: skip
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert resumed.stderr.strip().splitlines()[-1] == (
        f"error: {store}/mlflow.db: the MLflow store's disk is full; free space there, or give "
        "--trainer.default_root_dir (or MLFLOW_TRACKING_URI) a store on another disk"
    )
    assert len(resumed.stderr.strip().splitlines()) < 10
    assert checksums(checkpoints) == before

    # A new fit whose --checkpoint_dir is on the full disk: no empty mlflow_run_id, no cut-short checkpoint.
    result = run("--trainer.default_root_dir", str(tmp_path / "outputs"), "--checkpoint_dir", str(disk / "new"))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {disk / 'new'}/") and line.endswith(
        ": no space left on the device; free space there, or write to a folder on another disk"
    )
    new = disk / "new"  # removed when the fit that made it wrote nothing there but its lock
    written = (
        {path.name: path.read_bytes() for path in new.iterdir() if path.name != "fit.lock"} if new.exists() else {}
    )
    assert set(written) <= {"mlflow_run_id"} and all(written.values()), written


def test_a_file_size_limit_is_one_line_naming_the_file_and_the_limit(tmp_path):
    """Under `ulimit -f` (RLIMIT_FSIZE) a write past it fails with EFBIG (Python ignores SIGXFSZ): a checkpoint's, or
    the MLflow store's (sqlite says "disk I/O error"). 20 KiB: below a penguin checkpoint and a new store."""
    fit = [sys.executable, "-m", "scripts.train", "fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs",
           "1", "--test_after_fit", "false"]  # fmt: skip
    limit = 20480
    cases = {  # the file that goes past the limit: the checkpoint (no store), else the store, made first
        tmp_path / "a" / "checkpoints" / "best.ckpt": ["--trainer.logger", "false"],
        tmp_path / "b" / "outputs" / "mlflow.db": [],
    }
    processes = {
        written: subprocess.Popen(
            [
                *fit,
                *args,
                "--trainer.default_root_dir",
                str(written.parents[1] / "outputs"),
                "--checkpoint_dir",
                str(written.parents[1] / "checkpoints"),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
        )  # fmt: skip
        for written, args in cases.items()
    }
    for written, process in processes.items():
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
        assert stderr.strip().splitlines()[-1] == (
            f"error: {written}: file too large: this shell limits files to {limit} bytes (`ulimit -f`); raise the "
            "limit (`ulimit -f unlimited`), or write where it does not apply"
        )


def test_predict_into_a_closed_pipe_ends_quietly(trained):
    """`predict ... | head -1`: the reader has gone before the CSV is written."""
    command = [sys.executable, "-m", "scripts.train", "predict", "--config", "configs/penguins.yaml",
               "--ckpt_path", str(trained["penguins_ckpt"]),
               "--data.init_args.predict_path", "configs/examples/penguins.csv"]  # fmt: skip
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=600) == 141, stderr[-3000:]  # 128 + SIGPIPE, as a Unix tool killed by it
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr


def test_make_predict_takes_paths_holding_spaces(trained, tmp_path):
    folder = tmp_path / "my penguins"
    folder.mkdir()
    shutil.copy(REPO / "configs" / "examples" / "penguins.csv", folder / "new birds.csv")
    checkpoint = tmp_path / "a run" / "best.ckpt"
    checkpoint.parent.mkdir()
    shutil.copy(trained["penguins_ckpt"], checkpoint)
    venv = Path(sys.executable).parent.parent
    make = ["make", "--no-print-directory", f"--old-file={venv}/installed", "predict", f"VENV={venv}",
            f"INPUT={folder / 'new birds.csv'}",
            f"CKPT={checkpoint}"]  # fmt: skip
    # A user's ARGS stays out, exported or given to the make that runs the tests (MAKEFLAGS hands it down).
    environment = {key: value for key, value in os.environ.items() if key not in ("ARGS", "MAKEFLAGS", "MFLAGS")}
    result = subprocess.run(make, cwd=REPO, capture_output=True, text=True, timeout=600, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-4] == "input,class,probability"
