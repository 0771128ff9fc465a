"""The birds image pipeline timed side by side, on CUDA when there is one, else the CPU:

    python -m scripts.bench.birds [--backbone efficientnet_lite0] [--batch-size 16] [--batches 8] [--image-size 224]
        [--num-workers 2] [--precision 32-true|bf16-mixed] [--channels-last] [--images 64] [--repeats 1]

e.g. on a GPU (the target: pipeline >= 0.9x synthetic; docs/measured.md has what it reads):
    python -m scripts.bench.birds --backbone resnet50 --precision bf16-mixed --channels-last --batch-size 128 \\
        --batches 80 --images 5120 --num-workers 14 --repeats 2

Over a temporary folder of synthetic photo-like JPEGs (500x375, `train/` and `val/` of `chickens/` and
`turkeys/`, `--images` per class in train/):
- decoding, images/s in this process, one image at a time: torchvision.datasets.ImageFolder's default
  loader + PILToTensor (Pillow) against ImageFolderDataModule's ImageFiles (Pillow too, as the registered model decodes;
  no copy past Pillow's own);
- loader alone: ImageFolderDataModule's training batches (the same workers) copied to the device, with no model: the
  rate the pipeline can supply;
- template: a Lightning Trainer fitting ImageFolderDataModule + ClassificationModule(TransferNet, random weights)
  with EpochThroughput (no logger, checkpoints, progress bar or validation): JPEGs decoded and cropped
  in `--num-workers` DataLoader workers, normalised on the device;
- synthetic: the same network in a plain loop over one random batch kept on the device (the ceiling).
Both train with SGD at `--precision` (bf16-mixed: autocast to bfloat16). Each variant runs `--repeats`
times, interleaved, each run's rate printed as it is measured (`round 1, loader alone: ...: 210.4 images/s`), and
keeps its best rate: a busy machine only ever slows a run down. Every epoch's first
batches wait for the workers to decode a whole batch each, so a short `--batches` window reads the pipeline lower
than a long epoch would (docs/measured.md, "On a GPU").
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from datamodules.image_folder import WORKERS_PER_CORE, ImageFiles, ImageFolderDataModule
from datamodules.preprocessing.images import MAX_IMAGE_PIXELS
from lightning_modules.classifier import ClassificationModule
from lightning_modules.transfer_net import TransferNet
from scripts.bench.report import Report
from scripts.bench.throughput import BenchParser, EpochThroughput, count

CLASSES = ("chickens", "turkeys")
WIDTH, HEIGHT = 500, 375  # the size of the Azure ML tutorial's fowl photos
OPTIMIZER = partial(torch.optim.SGD, lr=0.001, momentum=0.9)  # configs/birds.yaml's
DECODED = 1024  # images timed by the one-process decoding lines: a rate, steady after a few hundred


def make_jpegs(root: Path, per_class: int, seed: int = 0, unique: int = 256) -> list[Path]:
    """Writes `per_class` training JPEGs per class (and 2 validation ones) under root; returns the training files.

    Smooth random colour fields (a coarse random grid upsampled) plus mild pixel noise, saved by Pillow at
    quality 90 with 4:2:0 chroma: about the file size and decoding work of a camera photo of that size.
    Past `unique` per class the files are hard links to the first ones: decoding them is the same work (and
    every file is in the page cache either way), and a long run does not spend minutes writing photos.
    """
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    files = []
    for split, images in (("train", per_class), ("val", 2)):
        for name in CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(images):
                path = folder / f"{i:05d}.jpg"
                if split == "train":
                    files.append(path)
                if i >= unique:
                    os.link(folder / f"{i % unique:05d}.jpg", path)
                    continue
                coarse = torch.rand(1, 3, 6, 8, generator=generator) * 255
                image = F.interpolate(coarse, size=(HEIGHT, WIDTH), mode="bicubic", align_corners=False)[0]
                image = image + torch.randn(image.shape, generator=generator) * 6
                pixels = image.clamp(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
                Image.fromarray(pixels).save(path, quality=90)
    return files


def decode_pil(root: Path) -> float:
    """torchvision.datasets.ImageFolder's default loader (Pillow, .convert("RGB")) + PILToTensor: uint8 CHW."""
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import PILToTensor

    dataset = ImageFolder(str(root / "train"), transform=PILToTensor())
    dataset[0]  # first-call imports and set-up, untimed
    count = min(len(dataset), DECODED)
    started = time.perf_counter()
    for i in range(count):
        dataset[i]
    return count / (time.perf_counter() - started)


def decode_datamodule(files: list[Path]) -> float:
    """ImageFolderDataModule's ImageFiles without its crops: uint8 (3, H, W) as the datamodule reads a photo."""
    files = files[:DECODED]
    dataset = ImageFiles(files, [0] * len(files), nn.Identity())
    dataset[0]  # first-call imports and set-up, untimed
    started = time.perf_counter()
    for i in range(len(dataset)):
        dataset[i]
    return len(dataset) / (time.perf_counter() - started)


def template(root: Path, args: argparse.Namespace, device: torch.device) -> float:
    torch.manual_seed(0)
    data = ImageFolderDataModule(
        data_dir=str(root), batch_size=args.batch_size, image_size=args.image_size, num_workers=args.num_workers
    )
    network = partial(TransferNet, backbone=args.backbone, weights="none")
    model = ClassificationModule(network, data.class_names, optimizer=OPTIMIZER, channels_last=args.channels_last)
    # Two epochs of --batches each; EpochThroughput's rate of the last one counts. The first pays the
    # one-off costs (DataLoader workers starting, cuDNN/oneDNN choosing kernels, the allocator growing);
    # the persistent workers carry over, and the second starts with an empty prefetch queue, as every
    # epoch does. (A warm-up batch in the same epoch would instead leave the workers a head start of
    # num_workers x prefetch_factor batches, flattering a data-bound pipeline over a short window.)
    trainer = L.Trainer(
        accelerator=device.type,
        devices=1,
        precision=args.precision,
        max_epochs=2,
        limit_train_batches=args.batches,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[EpochThroughput()],
        default_root_dir=str(root),
    )
    trainer.fit(model, datamodule=data)
    return float(trainer.callback_metrics["bench_samples_per_sec"])


def loader_alone(root: Path, args: argparse.Namespace, device: torch.device) -> float:
    """ImageFolderDataModule's training batches with no model: the images/s its workers supply, each batch copied to the
    device. The second pass over `--batches` is timed, as the template's second epoch is."""
    data = ImageFolderDataModule(
        data_dir=str(root), batch_size=args.batch_size, image_size=args.image_size, num_workers=args.num_workers
    )
    data.setup("fit")
    loader = data.train_dataloader()
    if device.type == "cuda":
        loader.pin_memory = True  # as in a fit on a GPU (the datamodule asks its trainer)
    for _ in range(2):  # the first pass starts the workers; the second one's time counts
        started = time.perf_counter()
        for images, _ in itertools.islice(loader, args.batches):
            images.to(device, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return args.batches * args.batch_size / (time.perf_counter() - started)


def synthetic(args: argparse.Namespace, device: torch.device) -> float:
    """The template's network, optimizer and precision on one random batch that stays on the device."""
    torch.manual_seed(0)
    net = TransferNet(len(CLASSES), backbone=args.backbone, weights="none").to(device)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, len(CLASSES), (args.batch_size,), device=device)
    if args.channels_last:
        net.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    optimizer = OPTIMIZER(net.parameters())
    net.train()

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed"):
            loss = F.cross_entropy(net(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    # Two untimed steps: the first chooses kernels and grows the allocator, the second settles the
    # optimizer's momentum buffers; no data pipeline needs filling here.
    for _ in range(2):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(args.batches):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return args.batches * args.batch_size / (time.perf_counter() - started)


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = BenchParser(description="birds: JPEG decoding and training images/s, template vs ceiling")
    parser.add_argument(
        "--backbone",
        default="efficientnet_lite0",
        choices=["efficientnet_lite0", "resnet18", "resnet50", "densenet121"],
    )
    parser.add_argument("--batch-size", type=count(1), default=16)
    parser.add_argument("--batches", type=count(1), default=8, help="training batches timed (after as many untimed)")
    parser.add_argument("--image-size", type=count(1, math.isqrt(MAX_IMAGE_PIXELS)), default=224)  # as training
    parser.add_argument(
        "--num-workers", type=count(0, WORKERS_PER_CORE * (os.cpu_count() or 1)), default=2,
        help="DataLoader processes decoding JPEGs",
    )  # fmt: skip
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--channels-last", action="store_true", help="NHWC weights and batches")
    parser.add_argument("--images", type=count(1), default=64, help="training JPEGs to create per class")
    parser.add_argument("--repeats", type=count(1), default=1, help="rounds of all four; the best rate of each counts")
    args = parser.parse_args(argv)
    if args.images * len(CLASSES) < args.batches * args.batch_size:
        parser.error(f"--images {args.images} per class is too few for --batches {args.batches} of {args.batch_size}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_options(argv)
    warnings.filterwarnings("ignore")
    report = Report("birds")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        files = report.step("writing the photos", make_jpegs, root, args.images)
        kilobytes = sum(path.stat().st_size for path in files) / len(files) / 1024
        runs = {
            "decode: PIL (ImageFolder + PILToTensor)": lambda: decode_pil(root),
            "decode: Pillow, ImageFolderDataModule's ImageFiles": lambda: decode_datamodule(files),
            "loader alone: ImageFolderDataModule's batches": lambda: loader_alone(root, args, device),
            "template: JPEGs through ImageFolderDataModule": lambda: template(root, args, device),
            f"synthetic: tensors on {device.type}, plain loop": lambda: synthetic(args, device),
        }
        results = dict.fromkeys(runs, 0.0)
        for round_ in range(1, args.repeats + 1):
            for name, run in runs.items():
                rate = report.measured(f"round {round_}, {name}", lambda rate: f"{rate:.1f} images/s", run)
                results[name] = max(results[name], rate)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    layout = "channels-last" if args.channels_last else "channels-first"
    print(
        f"birds: {len(files)} JPEGs {WIDTH}x{HEIGHT} ({kilobytes:.0f} KB each), {args.backbone} {args.image_size} px, "
        f"batch {args.batch_size}, {args.batches} batches timed, {args.precision}, {layout}, {where}, "
        f"{args.num_workers} workers, best of {args.repeats}"
    )
    for name, rate in results.items():
        print(f"  {name:46s} {rate:8.1f} images/s")
    pil, ours, supply, pipeline, ceiling = results.values()
    print(f"  {'datamodule / ImageFolder decoding':34s} {ours / pil:.2f}x")
    print(f"  {'loader alone / synthetic':34s} {supply / ceiling:.2f}x")
    print(f"  {'pipeline / synthetic':34s} {pipeline / ceiling:.2f}x")


if __name__ == "__main__":
    main()
