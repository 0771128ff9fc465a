"""Mistakes in options, checkpoints, devices, outputs and tracking: each one line on stderr naming the culprit and the
fix, exit status 1, no traceback, no run recorded and nothing of the user's written over."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.conftest import free_port, run_module

BROKEN_YAML = "trainer:\n  max_epochs: 3\n   devices: [1\n"


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
    ("torchrun-devices", ["fit", "--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu",
                          "--trainer.devices", "1"], {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "RANK": "0",
                                                     "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "{port}"},
     "error: the launcher started 2 processes (WORLD_SIZE), but the Trainer has devices 1 x num_nodes 1: give "
     "--trainer.devices 2 --trainer.num_nodes 1 (devices: processes per node)"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "env", "line"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_mistake_is_one_line_exit_1_and_nothing_recorded_or_overwritten(tmp_path, args, env, line):
    user = tmp_path / "user"  # what the user owns: must be byte-identical afterwards
    user.mkdir()
    (user / "notes.txt").write_text("my notes\n")
    (user / "broken.yaml").write_text(BROKEN_YAML)
    before = checksums(user)
    values = {"user": user, "port": free_port()}
    environ = {**os.environ, **{key: value.format(**values) for key, value in env.items()}}
    given = [arg.format(**values) for arg in args]
    if "--trainer.default_root_dir" not in given:
        given += ["--trainer.default_root_dir", str(tmp_path / "outputs")]
    result = run_module("scripts.train", given[0], "--config", "configs/penguins.yaml", *given[1:], env=environ)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == line.format(**values)
    assert checksums(user) == before
    assert not list((tmp_path / "outputs").glob("*/*/")), "a run folder was left"
