"""Mistakes in options, data, checkpoints, devices, outputs and tracking, across the three tasks: each one line on
stderr naming the culprit and the fix, exit status 1, no traceback, no run recorded and nothing of the user's written
over. Also the answers that would be wrong without a word: evaluating or predicting with no checkpoint, a checkpoint
of other classes, penguins measured in other units, one species, a species that is no species."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.conftest import bird_folders, free_port, run_module, write_images

BROKEN_YAML = "trainer:\n  max_epochs: 3\n   devices: [1\n"
PENGUIN_CSV = "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\n"
# Flipper length and body mass in the course's scaled units, as the course printed its example.
COURSE_UNITS = "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nBiscoe,50.4,15.3,20,50\n"
ONE_SPECIES = PENGUIN_CSV + "".join(f"Torgersen,{39 + i / 10},18.{i},18{i},3{i}00,0\n" for i in range(9))
NOT_A_SPECIES = PENGUIN_CSV + "".join(f"Dream,{39 + i / 10},18.{i},18{i},3{i}00,{i % 3}\n" for i in range(9))
NOT_A_SPECIES = NOT_A_SPECIES.replace(",1\n", ",12\n", 1)  # line 3: 12, which holds the characters of 0/1/2
FIVE_ROWS = PENGUIN_CSV + "".join(f"Dream,{39 + i / 10},18.{i},18{i},3{i}00,{i % 3}\n" for i in range(5))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A penguin and a bird checkpoint, and bird folders of other classes, made once for the rows that need them."""
    root = tmp_path_factory.mktemp("trained")
    birds = bird_folders(root / "birds", count=2)
    for name, channel in (("ducks", 2), ("geese", 0), ("turkeys", 1)):
        for split in ("train", "val"):
            write_images(root / "other-birds" / split / name, 2, channel)
    found = {"birds_data": birds, "other_birds": root / "other-birds"}
    for task, extra in (("penguins", []), ("birds", ["--data.init_args.data_dir", str(birds), *BIRD_OPTIONS])):
        result = run_module(
            "scripts.train", "fit", "--config", f"configs/{task}.yaml", "--trainer.max_epochs", "1", *extra,
            "--test_after_fit", "false", "--trainer.default_root_dir", str(root / task),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        (found[f"{task}_ckpt"],) = (root / task).glob("*/*/checkpoints/best.ckpt")
    return found


BIRD_OPTIONS = ["--data.init_args.image_size", "32", "--data.init_args.num_workers", "0"]


def damaged_mnist(folder: Path) -> None:
    """The four MNIST files, gzipped, the training images' deflate stream damaged past its header."""
    import gzip

    from datamodules.mnist import FILES

    folder.mkdir()
    for name in FILES:
        data = gzip.compress(b"\x00" * 64, mtime=0)
        if name == "train-images-idx3-ubyte":
            data = data[:10] + b"\xff" + data[11:]  # the first deflate block's type: 3, which does not exist
        (folder / f"{name}.gz").write_bytes(data)


def checksums(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


CASES = [
    ("gpu-without-one", ["fit", "--trainer.accelerator", "gpu"], {},
     "error: --trainer.accelerator gpu: torch sees no GPU on this machine; give --trainer.accelerator cpu "
     "(or leave out configs/trainer/gpu.yaml)"),
    ("outputs-not-writable", ["fit", "--trainer.default_root_dir", "{user}/notes.txt/outputs"], {},
     "error: {user}/notes.txt/outputs: cannot write there (Not a directory); give --trainer.default_root_dir a "
     "folder you can write"),
    ("ckpt-missing", ["test", "--ckpt_path", "{user}/nope.ckpt"], {},
     "error: {user}/nope.ckpt: no such checkpoint; give --ckpt_path a .ckpt that fit wrote "
     "(outputs/<exp>/<run>/checkpoints/)"),
    ("ckpt-not-a-checkpoint", ["test", "--ckpt_path", "{user}/notes.txt"], {},
     "error: {user}/notes.txt: not a checkpoint this can read (not torch.save's zip format, or cut short); give a "
     ".ckpt written by scripts.train fit"),
    ("yaml-syntax", ["fit", "--config", "{user}/broken.yaml"], {},
     "error: {user}/broken.yaml, line 3, column 11: not valid YAML (mapping values are not allowed here); fix the "
     "file there"),
    ("wrong-type", ["fit", "--trainer.max_epochs", "abc"], {},
     "error: trainer.max_epochs: 'abc' is not a valid value; give int"),
    ("wrong-type-in-a-class", ["fit", "--model.optimizer.init_args.lr", "fast"], {},
     "error: model.optimizer.init_args.lr: 'fast' is not a valid value; give float"),
    ("wrong-type-in-the-datamodule", ["fit", "--data.init_args.batch_size", "0.5"], {},
     "error: data.init_args.batch_size: '0.5' is not a valid value; give int"),
    ("unknown-option", ["fit", "--model.optimiser", "SGD"], {},
     "error: unrecognized arguments: --model.optimiser SGD (check the name against --print_config)"),
    ("negative-lr", ["fit", "--model.optimizer.init_args.lr", "-0.1"], {},
     "error: model.optimizer: Invalid learning rate: -0.1; correct its init_args (see --print_config)"),
    ("file-store", ["fit"], {"MLFLOW_TRACKING_URI": "file://{user}/mlruns"},
     "error: MLFLOW_TRACKING_URI file://{user}/mlruns: a plain-file MLflow store (in maintenance mode in MLflow 3, "
     "and it cannot hold this config's parameters); use sqlite:///path/to/mlflow.db, a server's http:// URL, or "
     "unset it for outputs/mlflow.db"),
    ("server-down", ["fit"], {"MLFLOW_TRACKING_URI": "http://127.0.0.1:{port}"},
     "error: MLFLOW_TRACKING_URI http://127.0.0.1:{port}: the tracking server does not answer ([Errno 111] "
     "Connection refused); start it, correct the URI, or unset MLFLOW_TRACKING_URI to track to outputs/mlflow.db"),
    ("predict-without-checkpoint", ["predict", "--data.init_args.predict_path", "configs/examples/penguins.csv"], {},
     "error: predict needs --ckpt_path: the .ckpt a fit wrote (outputs/<exp>/<run>/checkpoints/best.ckpt; `make "
     "evaluate` and `make predict` find the newest); without it the network is untrained"),
    ("test-without-checkpoint", ["test"], {},
     "error: test needs --ckpt_path: the .ckpt a fit wrote (outputs/<exp>/<run>/checkpoints/best.ckpt; `make "
     "evaluate` and `make predict` find the newest); without it the network is untrained"),
    ("validate-without-checkpoint", ["validate"], {},
     "error: validate needs --ckpt_path: the .ckpt a fit wrote (outputs/<exp>/<run>/checkpoints/best.ckpt; `make "
     "evaluate` and `make predict` find the newest); without it the network is untrained"),
    ("course-units", ["predict", "--ckpt_path", "{penguins_ckpt}", "--data.init_args.predict_path",
                      "{user}/course_units.csv"], {},
     "error: {user}/course_units.csv: line 2: FlipperLength 20 is far outside what the model was trained on (172 to "
     "231); give millimetres and grams, as in the training data"),
    ("one-species", ["fit", "--data.init_args.csv_path", "{user}/one_species.csv"], {},
     "error: {user}/one_species.csv: every complete row is Adelie; a classifier needs rows of at least two species "
     "(Adelie, Gentoo, Chinstrap)"),
    ("not-a-species", ["fit", "--data.init_args.csv_path", "{user}/not_a_species.csv"], {},
     "error: {user}/not_a_species.csv: line 3: Species '12' is none of Adelie, Gentoo, Chinstrap or 0/1/2; fix or "
     "remove that row"),
    ("too-few-rows", ["fit", "--data.init_args.csv_path", "{user}/five_rows.csv"], {},
     "error: {user}/five_rows.csv: 5 complete rows leave no Adelie, Chinstrap, Gentoo in the validation split; give "
     "more rows of each species (or change data.init_args.val_fraction / test_fraction)"),
    ("birds-checkpoint-on-penguins", ["test", "--ckpt_path", "{birds_ckpt}"], {},
     "error: --ckpt_path {birds_ckpt}: trained on classes ['chickens', 'turkeys'], but the data has ['Adelie', "
     "'Gentoo', 'Chinstrap']; give the checkpoint of this task, or data of its classes"),
    ("birds-test-other-classes", ["test", "--config", "configs/birds.yaml", "--ckpt_path", "{birds_ckpt}",
                                  "--data.init_args.data_dir", "{other_birds}", *BIRD_OPTIONS], {},
     "error: data.init_args.classes (the checkpoint's, at validate, test and predict) and {other_birds}/train have "
     "different classes: ['chickens'] only in data.init_args.classes (the checkpoint's, at validate, test and "
     "predict); ['ducks', 'geese'] only in {other_birds}/train; give both the same"),
    ("batch-size-0", ["fit", "--data.init_args.batch_size", "0"], {},
     "error: data.init_args.batch_size 0: give 1 or more (samples per step and process)"),
    ("batch-size-negative-birds", ["fit", "--config", "configs/birds.yaml", "--data.init_args.batch_size", "-4"], {},
     "error: data.init_args.batch_size -4: give 1 or more (samples per step and process)"),
    ("mnist-gz-damaged", ["fit", "--config", "configs/mnist.yaml", "--data.init_args.data_dir", "{user}/mnist"], {},
     "error: {user}/mnist/train-images-idx3-ubyte.gz: broken gzip data (Error -3 while decompressing data: invalid "
     "block type); delete it and download it again"),
    ("torchrun-devices", ["fit", "--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu",
                          "--trainer.devices", "1"], {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "RANK": "0",
                                                     "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "{port}"},
     "error: the launcher started 2 processes (WORLD_SIZE), but the Trainer has devices 1 x num_nodes 1: give "
     "--trainer.devices 2 --trainer.num_nodes 1 (devices: processes per node)"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "env", "line"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_mistake_is_one_line_exit_1_and_nothing_recorded_or_overwritten(request, tmp_path, args, env, line):
    user = tmp_path / "user"  # what the user owns: must be byte-identical afterwards
    user.mkdir()
    for name, text in (("notes.txt", "my notes\n"), ("broken.yaml", BROKEN_YAML), ("course_units.csv", COURSE_UNITS),
                       ("one_species.csv", ONE_SPECIES), ("not_a_species.csv", NOT_A_SPECIES),
                       ("five_rows.csv", FIVE_ROWS)):  # fmt: skip
        (user / name).write_text(text)
    damaged_mnist(user / "mnist")
    values = {"user": user, "port": free_port()}
    if any("_ckpt}" in arg or "birds}" in arg for arg in args):
        values |= request.getfixturevalue("trained")
    theirs = [user, *(values[key].parent for key in ("penguins_ckpt", "birds_ckpt") if key in values)]
    before = {path: digest for folder in theirs for path, digest in checksums(folder).items()}
    environ = {**os.environ, **{key: value.format(**values) for key, value in env.items()}}
    given = [arg.format(**values) for arg in args]
    if "--trainer.default_root_dir" not in given:
        given += ["--trainer.default_root_dir", str(tmp_path / "outputs")]
    task_given = any(arg in given for arg in ("configs/birds.yaml", "configs/mnist.yaml"))
    config = [] if task_given else ["--config", "configs/penguins.yaml"]
    result = run_module("scripts.train", given[0], *config, *given[1:], env=environ)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == line.format(**values)
    assert {path: digest for folder in theirs for path, digest in checksums(folder).items()} == before
    assert not list((tmp_path / "outputs").glob("*/*/")), "a run folder was left"
