"""Writes tests/checkpoints/<task>.ckpt, one tiny checkpoint of each task in configs/, by a real `scripts.train fit`
of the task's config on tiny data that this script makes (penguins: the packaged table), and README.md beside them:
the commit and date they were made with. tests/test_old_checkpoints.py loads them as predict, test and export do:
a network whose layers are renumbered or renamed, an argument renamed, or a datamodule's saved state read otherwise
fails it, as it would fail every checkpoint users trained before the change.

    .venv/bin/python -m tests.checkpoints.make            # every task, ~2 min on 2 cores
    .venv/bin/python -m tests.checkpoints.make mnist      # one task

Run it only when a change is meant to leave older checkpoints behind (they will no longer load: say so in the commit
and in the release notes), or for a task that has none yet. Making them anew to turn that test green is the very
mistake it is there to catch.

Each fit is as small as the task allows: one epoch of a few batches (MNIST: synthetic idx files of 64 digits; birds and
digits: 32-pixel pictures made here; the table: 60 rows, 16 hidden units), the logger and the test after the fit as
configured; MNIST's with SGD without momentum, whose state holds no tensor (Adam's or momentum's would double or
triple MNISTNet's 87 KB). What is committed is the fit's best.ckpt as Lightning wrote it: its hyper_parameters, the
datamodule's state, the callbacks' and the optimizer's state, every key and shape of the state dict.

Birds and digits (TransferNet, efficientnet_lite0, 3.4M weights: 13 MB as trained) are made small without a weight
of theirs being other than the fit left it. The fit starts from a backbone state dict (`weights_path`, the public
option) in which each tensor holds one value throughout (a convolution's weights 1/fan-in: each output the mean of its
inputs; BatchNorm the identity), with `freeze_backbone: true` (digits_folder's own config trains the whole network),
so the backbone stays exactly so and the head trains on its features. The checkpoint is then written again with each
backbone tensor, checked to be one value throughout, as a stride-0 expanded view of a one-element tensor (one per
value and dtype): torch.save stores one element for each, and torch.load gives the same values back (this script
checks every tensor and entry against the fit's file). Such a backbone classifies nothing well; the checkpoints are
there to be loaded, not to be accurate.
"""

from __future__ import annotations

import datetime
import gzip
import io
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
IMAGE_SIZE = 32
CLASSES = ("chickens", "turkeys")


def mnist_files(folder: Path) -> list[str]:
    """The four idx files of a few synthetic digits: a bar whose place says the class."""
    folder.mkdir(parents=True)
    for prefix, count in (("train", 64), ("t10k", 20)):
        labels = np.arange(count, dtype=np.uint8) % 10
        images = np.zeros((count, 28, 28), dtype=np.uint8)
        for image, label in zip(images, labels):
            image[4:24, 2 + 2 * label : 5 + 2 * label] = 255
        for name, magic, data in (("images-idx3-ubyte", 2051, images), ("labels-idx1-ubyte", 2049, labels)):
            header = struct.pack(">I", magic) + b"".join(struct.pack(">I", side) for side in data.shape)
            (folder / f"{prefix}-{name}.gz").write_bytes(gzip.compress(header + data.tobytes(), mtime=0))
    # SGD without momentum: an optimizer state without tensors (the docstring says why).
    return ["--data.init_args.data_dir", str(folder), "--data.init_args.val_size", "16", "--data.init_args.batch_size",
            "16", "--model.optimizer", "torch.optim.SGD", "--model.optimizer.init_args.lr", "0.01",
            "--model.optimizer.init_args.momentum", "0"]  # fmt: skip


def image_folders(folder: Path, grey: bool) -> list[str]:
    """train/ and val/ of two classes, 6 and 2 pictures each, told apart by their brightness."""
    from torchvision.io import write_png

    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", 6), ("val", 2)):
        for index, name in enumerate(CLASSES):
            (folder / split / name).mkdir(parents=True)
            for i in range(count):
                image = torch.randint(0, 128, (1 if grey else 3, IMAGE_SIZE, IMAGE_SIZE), generator=generator)
                write_png((image + 127 * index).to(torch.uint8), str(folder / split / name / f"{i}.png"))
    return ["--data.init_args.data_dir", str(folder), "--data.init_args.image_size", str(IMAGE_SIZE),
            "--data.init_args.batch_size", "4", "--data.init_args.num_workers", "0"]  # fmt: skip


def table(folder: Path) -> list[str]:
    """60 rows of two numeric columns and a categorical one; the label follows the first column."""
    rng = np.random.default_rng(0)
    length = rng.normal(40, 5, 60).round(1)
    rows = [f"{x},{w},{c},{'long' if x > 40 else 'short'}" for x, w, c in zip(
        length, rng.normal(4, 1, 60).round(2), rng.choice(["red", "blue"], 60))]  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "table.csv").write_text("length,weight,colour,kind\n" + "\n".join(rows) + "\n")
    return ["--data.init_args.csv_path", str(folder / "table.csv"), "--data.init_args.label", "kind",
            "--model.network.init_args.hidden", "16"]  # fmt: skip


def constant(key: str, tensor: torch.Tensor) -> float:
    """The one value of a tensor of the constant backbone."""
    if tensor.dim() > 1:  # a convolution's or the classifier's weights: each output the mean of its inputs
        return 1.0 / tensor[0].numel()
    return 1.0 if key.endswith((".weight", ".running_var")) else 0.0  # BatchNorm as the identity


def constant_backbone(path: Path) -> list[str]:
    """efficientnet_lite0's state dict with one value a tensor (see the docstring), as `weights_path`."""
    from lightning_modules.transfer_net import build

    state = {
        key: torch.full_like(tensor, constant(key, tensor))
        for key, tensor in build("efficientnet_lite0").state_dict().items()
    }
    torch.save(state, path)
    return ["--model.network.init_args.weights_path", str(path), "--model.network.init_args.freeze_backbone", "true"]


# configs/<task>.yaml: a function that makes the task's tiny data in a temporary folder and returns the fit's options.
TASKS = {
    "penguins": lambda folder: [],
    "mnist": lambda folder: mnist_files(folder / "mnist"),
    "mnist_tutorial": lambda folder: mnist_files(folder / "mnist"),
    "birds": lambda folder: image_folders(folder / "birds", grey=False) + constant_backbone(folder / "lite0.pth"),
    "digits_folder": lambda folder: (
        image_folders(folder / "digits", grey=True) + constant_backbone(folder / "lite0.pth")
    ),
    "table": lambda folder: table(folder / "table"),
}
SHORT = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.enable_progress_bar", "false"]


def shared_storages(checkpoint: dict, prefix: str) -> dict:
    """`checkpoint` whose state-dict tensors under `prefix`, each one value throughout, are stride-0 views of a
    one-element tensor per value and dtype."""
    bases: dict[tuple, torch.Tensor] = {}
    state = checkpoint["state_dict"]
    for key, tensor in state.items():
        if not key.startswith(prefix):
            continue
        value = tensor.flatten()[0].item()
        if not torch.all(tensor == value):
            raise SystemExit(f"{key}: not one value throughout after the fit; was the backbone frozen?")
        base = bases.setdefault((tensor.dtype, value), torch.tensor([value], dtype=tensor.dtype))
        state[key] = base.reshape((1,) * tensor.dim()).expand(tensor.shape)
    return checkpoint


def same(a, b) -> bool:
    """Whether two loaded checkpoints (nested dicts, lists, tensors, values) hold the same values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b or (a != a and b != b)  # NaN equals NaN here


def make(task: str, folder: Path) -> Path:
    """Fits `task` in `folder` and writes tests/checkpoints/<task>.ckpt; returns it."""
    outputs = folder / "outputs"
    args = ["fit", "--config", f"configs/{task}.yaml", *SHORT, *TASKS[task](folder),
            "--trainer.default_root_dir", str(outputs), "--checkpoint_dir", str(folder / "checkpoints")]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    result = subprocess.run([sys.executable, "-m", "scripts.train", *args], cwd=REPO, env=env, text=True,
                            capture_output=True)  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{task}: the fit failed:\n{result.stderr[-3000:]}")
    best, target = folder / "checkpoints" / "best.ckpt", HERE / f"{task}.ckpt"
    if task in ("birds", "digits_folder"):
        written = torch.load(best, map_location="cpu", weights_only=False)
        buffer = io.BytesIO()  # as Lightning writes one (scripts/training/checkpoints.py WholeCheckpointIO)
        torch.save(shared_storages(written, "network.backbone."), buffer)
        target.write_bytes(buffer.getvalue())
        if not same(torch.load(target, weights_only=False), torch.load(best, weights_only=False)):
            raise SystemExit(f"{target}: holds other values than the fit's {best}")
    else:
        target.write_bytes(best.read_bytes())
    return target


def provenance() -> str:
    """The commit the checkpoints were made with, and whether the product's code differed from it."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", "lightning_modules", "datamodules", "scripts", "configs"],
        cwd=REPO, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    return f"{commit}{' with uncommitted changes' if changed else ''}"


def write_readme(made: dict[str, str]) -> None:
    rows = []
    for task, line in sorted(made.items()):
        path = HERE / f"{task}.ckpt"
        rows.append(f"| `{path.name}` | configs/{task}.yaml | {path.stat().st_size:,} | {line} |")
    (HERE / "README.md").write_text(
        "# Checkpoints of older code\n\n"
        "One tiny checkpoint of each task, written by a real fit; tests/test_old_checkpoints.py loads them as\n"
        "today's code does. Made by `.venv/bin/python -m tests.checkpoints.make` (its docstring says how, and when\n"
        "to run it); it rewrites this file.\n\n"
        "| file | config | bytes | made with (commit, UTC date, torch, Lightning) |\n|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )


def main(tasks: list[str]) -> None:
    import lightning

    unknown = [task for task in tasks if task not in TASKS]
    if unknown:
        raise SystemExit(f"error: no such task {unknown[0]!r}; give some of {', '.join(TASKS)}")
    made = {}
    readme = HERE / "README.md"
    if readme.is_file():  # the rows of tasks not made now stay
        for line in readme.read_text().splitlines():
            cells = [cell.strip() for cell in line.split("|")]
            if len(cells) == 6 and cells[1].startswith("`") and cells[1].endswith(".ckpt`"):
                made[cells[1].strip("`").removesuffix(".ckpt")] = cells[4]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    line = f"{provenance()}, {when}, torch {torch.__version__}, Lightning {lightning.__version__}"
    for task in tasks or list(TASKS):
        with tempfile.TemporaryDirectory(prefix=f"checkpoint-{task}-") as folder:
            target = make(task, Path(folder))
        made[task] = line
        print(f"{target.relative_to(REPO)}: {target.stat().st_size:,} bytes")
    write_readme(made)


if __name__ == "__main__":
    main(sys.argv[1:])
