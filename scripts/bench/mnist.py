"""MNIST training throughput (samples/s over one epoch, batch 128, SGD 0.03 momentum 0.5), side by side:

    python -m scripts.bench.mnist [--data-dir ../shared/data/mnist] [--batches 150] [--repeats 3]
    python -m scripts.bench.mnist --accelerator gpu --repeats 3    # configs/trainer/gpu.yaml's recipe on one GPU

- plain:    a bare PyTorch loop as one writes it by hand: per batch, index the in-memory uint8 tensors, scale and
            normalise (`(x.float() / 255 - MEAN) / STD`), step;
- plain, channels-first: the same loop in torch's default memory order (what channels-last buys on this CPU);
- plain, datamodule's batches: the loop on batches made as MNISTDataModule makes them (below), so that the
            template against it is Lightning's loop alone;
- classic:  the torchvision.datasets.MNIST way: a Dataset that turns each sample into a PIL image
            and applies ToTensor() + Normalize, batched by a DataLoader (built from the same tensors:
            nothing is downloaded), channels-first as such a loop is;
- bare:     Lightning's own floor: a LightningModule that only returns the loss of MNISTNet, on the same
            MNISTDataModule batches (Lightning's loop and hooks, the datamodule's scaling);
- template: a Lightning Trainer fitting MNISTDataModule + ClassificationModule + MNISTNet (no
            logger, checkpoints, progress bar or validation),
            timed by EpochThroughput (scripts/bench/throughput.py).
The datamodule gathers the epoch's permutation once (index_select) and scales each batch in place: ~0.1 ms a step
less data work than the plain loop's, which offsets part of Lightning's loop.
Plain, bare and template train channels-last, as configs/mnist.yaml does (`model.channels_last`).
Both Lightning variants are timed by EpochThroughput (from the epoch's start to its last batch's end).
`--batches N` trains on the first N batches of the epoch only, for a quicker answer. The six
take turns `--repeats` times, every other round in reverse order, each run in a process forked for it from this one
(which imports the libraries and trains nothing) after a 5-batch warm-up run of its own, its rate printed as it
comes (`round 1, plain tensor loop: 24225 samples/s`); then each prints its median rate with the spread over the
rounds (min..max), and the ratios are of the medians, so that one lucky round cannot decide
them. Template / plain and template / bare Lightning are also given round by round (median and spread of the rounds'
ratios): within a round the two run seconds apart (bare and template side by side), so the machine's slow drift
in speed mostly cancels out of their ratio.

`--accelerator gpu` runs every variant on the first GPU with configs/trainer/gpu.yaml's precision (bf16-mixed:
the plain loops autocast to bfloat16 as Lightning does): the training set lives on the GPU (as MNISTDataModule
keeps it there), the classic pipeline's batches are copied there from pinned memory, and every timed run waits
for the GPU to finish before its clock stops. The parent process never touches CUDA (a forked child could not
use it after that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
import warnings
from functools import partial

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.profilers import Profiler
from torch.utils.data import DataLoader, Dataset

from datamodules.mnist import MEAN, STD, MNISTDataModule
from lightning_modules.classifier import ClassificationModule
from lightning_modules.mnist_net import MNISTNet
from scripts.bench.report import BenchError, Report
from scripts.bench.throughput import BenchParser, EpochThroughput, count

BATCH = 128
CPU = torch.device("cpu")
OPTIMIZER = partial(torch.optim.SGD, lr=0.03, momentum=0.5)


def train_steps(
    net: torch.nn.Module, batches, limit: int, channels_last: bool = False, device: torch.device = CPU
) -> int:  # fmt: skip
    """Trains on up to `limit` (normalised images, labels) batches; returns the number of samples once `device` has
    finished. On a GPU: batches not yet there are copied there, and the forward pass runs in bf16 autocast."""
    layout = torch.channels_last if channels_last else torch.contiguous_format
    net.to(device=device, memory_format=layout)
    optimizer = OPTIMIZER(net.parameters())
    on_gpu = device.type == "cuda"
    precision = partial(torch.autocast, "cuda", dtype=torch.bfloat16) if on_gpu else contextlib.nullcontext
    net.train()
    samples = 0
    for i, (images, labels) in enumerate(batches):
        if i == limit:
            break
        if on_gpu:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with precision():
            loss = F.cross_entropy(net(images.contiguous(memory_format=layout)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        samples += len(labels)
    if on_gpu:
        torch.cuda.synchronize(device)
    return samples


def plain(
    images: torch.Tensor, labels: torch.Tensor, limit: int, channels_last: bool = True,
    datamodule: MNISTDataModule | None = None,
) -> float:  # fmt: skip
    """With `datamodule`, its training batches (InMemoryBatches, then its on_after_batch_transfer) instead of the
    hand-written ones."""

    def batches():
        order = torch.randperm(len(images), device=images.device)
        for start in range(0, len(images), BATCH):
            rows = order[start : start + BATCH]
            yield (images[rows].float() / 255 - MEAN) / STD, labels[rows]

    def datamodule_batches():
        for batch in datamodule.train_dataloader():
            yield datamodule.on_after_batch_transfer(batch, 0)

    torch.manual_seed(0)
    started = time.perf_counter()
    data = datamodule_batches() if datamodule else batches()
    samples = train_steps(MNISTNet(10), data, limit, channels_last, images.device)
    return samples / (time.perf_counter() - started)


class ClassicMNIST(Dataset):
    """What torchvision.datasets.MNIST.__getitem__ does per sample: PIL image, then the transforms."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        from torchvision import transforms

        self.images, self.labels = images[:, 0], labels
        self.transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        image = Image.fromarray(self.images[index].numpy(), mode="L")
        return self.transform(image), int(self.labels[index])


def classic(images: torch.Tensor, labels: torch.Tensor, limit: int, device: torch.device = CPU) -> float:
    torch.manual_seed(0)
    on_gpu = device.type == "cuda"
    loader = DataLoader(ClassicMNIST(images, labels), batch_size=BATCH, shuffle=True, pin_memory=on_gpu)
    started = time.perf_counter()
    samples = train_steps(MNISTNet(10), loader, limit, device=device)
    return samples / (time.perf_counter() - started)


class BareLightning(L.LightningModule):
    """The net, its loss and the optimizer in Lightning's loop: nothing computed, collected or logged."""

    def __init__(self) -> None:
        super().__init__()
        self.net = MNISTNet(10).to(memory_format=torch.channels_last)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0].contiguous(memory_format=torch.channels_last)), batch[1])

    def configure_optimizers(self):
        return OPTIMIZER(self.parameters())


def bench_trainer(
    limit: int, *callbacks: L.Callback, accelerator: str = "cpu", profiler: Profiler | None = None
) -> L.Trainer:  # fmt: skip
    """One epoch (its first `limit` batches when > 0) in a Trainer without logger, checkpoints, validation or
    progress bar (unless `callbacks` has one), timed by one of `callbacks`; on a GPU, at gpu.yaml's precision."""
    return L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision="bf16-mixed" if accelerator == "gpu" else "32-true",
        max_epochs=1,
        limit_train_batches=limit if limit > 0 else 1.0,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=any(isinstance(callback, ProgressBar) for callback in callbacks),
        enable_model_summary=False,
        callbacks=list(callbacks),
        profiler=profiler,
    )


def lightning_rate(
    model: L.LightningModule, data_dir: str, limit: int, accelerator: str, profiler: Profiler | None = None
) -> float:  # fmt: skip
    """Training samples/s of one epoch of `model` on MNISTDataModule in a bench_trainer."""
    trainer = bench_trainer(limit, EpochThroughput(), accelerator=accelerator, profiler=profiler)
    trainer.fit(model, datamodule=MNISTDataModule(data_dir=data_dir, batch_size=BATCH))
    return float(trainer.callback_metrics["bench_samples_per_sec"])


def bare(data_dir: str, limit: int, accelerator: str = "cpu") -> float:
    torch.manual_seed(0)
    return lightning_rate(BareLightning(), data_dir, limit, accelerator)


def template(data_dir: str, limit: int, accelerator: str = "cpu") -> float:
    torch.manual_seed(0)
    model = ClassificationModule(MNISTNet, MNISTDataModule.class_names, optimizer=OPTIMIZER, channels_last=True)
    return lightning_rate(model, data_dir, limit, accelerator)  # as the template's Trainer


VARIANTS = (
    "plain tensor loop", "plain, channels-first", "plain, datamodule's batches", "classic per-sample pipeline",
    "bare Lightning", "template (Lightning)",
)  # fmt: skip


def measure(variant: str, data_dir: str, limit: int, accelerator: str = "cpu") -> dict:
    """One variant's samples/s (after a 5-batch warm-up run of the same variant), and what it trained on."""
    device = torch.device("cuda", 0) if accelerator == "gpu" else CPU
    data = MNISTDataModule(data_dir=data_dir, batch_size=BATCH)
    data.prepare_data()
    data.setup("fit")
    cpu_images, cpu_labels = data.splits["train"]  # what the classic pipeline's Dataset reads, as torchvision's does
    data.splits = {name: tuple(t.to(device) for t in split) for name, split in data.splits.items()}
    images, labels = data.splits["train"]
    runs = {
        "plain tensor loop": lambda limit: plain(images, labels, limit),
        "plain, channels-first": lambda limit: plain(images, labels, limit, channels_last=False),
        "plain, datamodule's batches": lambda limit: plain(images, labels, limit, datamodule=data),
        "classic per-sample pipeline": lambda limit: classic(cpu_images, cpu_labels, limit, device),
        "bare Lightning": lambda limit: bare(data_dir, limit, accelerator),
        "template (Lightning)": lambda limit: template(data_dir, limit, accelerator),
    }
    runs[variant](5)
    rate = runs[variant](limit)
    samples = len(images) if limit < 0 else min(limit * BATCH, len(images))
    where = torch.cuda.get_device_name(device) + ", bf16-mixed" if device.type == "cuda" else "cpu"
    return {"rate": rate, "samples": samples, "threads": torch.get_num_threads(), "device": where}


def in_child(variant: str, data_dir: str, limit: int, accelerator: str = "cpu") -> dict:
    """`measure` in a process forked for it: every variant starts from the same state (this process's imports, no
    memory allocated or freed by another variant, no torch thread pool started), as it would run alone. In one process
    the variant before moved the next one's rate by up to 5% (the plain loop after a Lightning fit)."""
    read, write = os.pipe()
    sys.stdout.flush()  # or the child's output could carry this process's unwritten lines again
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        status = 1
        try:
            with os.fdopen(write, "w") as answer:
                answer.write(json.dumps(measure(variant, data_dir, limit, accelerator)))
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:  # the child ends here, whatever happened: it never returns into the parent's loop
            sys.stderr.flush()
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status != 0 or not text:
        raise BenchError(f"exit status {status} (its error is above)")
    return json.loads(text)


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = BenchParser(
        description="MNIST training samples/s: plain loops, classic pipeline, bare Lightning, template"
    )
    parser.add_argument("--data-dir", default="data/mnist", help="folder of the four MNIST idx files")
    parser.add_argument("--batches", type=count(0), default=0, help="train on this many batches (0: the whole epoch)")
    parser.add_argument(
        "--repeats", type=count(1), default=1, help="rounds of every variant; each prints its median and spread"
    )
    parser.add_argument(
        "--accelerator", choices=["cpu", "gpu"], default="cpu", help="gpu: every variant on the first GPU, in bf16"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_options(argv)
    warnings.filterwarnings("ignore")
    report = Report("mnist")
    limit = args.batches if args.batches > 0 else -1
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(args.repeats):
        # Every other round runs the variants in reverse: the machine's speed drifts over minutes (a shared VM's
        # neighbours), and a fixed order would hand that drift to the variants at one end of the round.
        for name in VARIANTS[:: -1 if round_ % 2 else 1]:
            measured = report.measured(
                f"round {round_ + 1}, {name}", lambda measured: f"{measured['rate']:.0f} samples/s",
                in_child, name, args.data_dir, limit, args.accelerator,
            )  # fmt: skip
            results[name].append(measured["rate"])
    rounds = f"{args.repeats} round{'s' * (args.repeats != 1)}"
    where = f"{measured['threads']} threads" + (f", {measured['device']}" if args.accelerator == "gpu" else "")
    print(f"mnist: {measured['samples']} training samples, batch {BATCH}, {where}, {rounds}")
    print(f"  {'':28s} {'median':>8s}  (min..max samples/s)")
    for name, rates in results.items():
        print(f"  {name:28s} {statistics.median(rates):8.0f}  ({min(rates):.0f}..{max(rates):.0f})")
    medians = {name: statistics.median(rates) for name, rates in results.items()}
    rate = medians["template (Lightning)"]
    print(f"  template / plain   {rate / medians['plain tensor loop']:.2f}x (medians)")
    paired = [t / p for t, p in zip(results["template (Lightning)"], results["plain tensor loop"], strict=True)]
    spread = f"{min(paired):.2f}..{max(paired):.2f}"
    print(f"  template / plain   {statistics.median(paired):.2f}x (round by round: {spread})")
    print(f"  template / classic {rate / medians['classic per-sample pipeline']:.2f}x (medians)")
    channels = medians["plain tensor loop"] / medians["plain, channels-first"]
    print(f"  plain channels-last / channels-first {channels:.2f}x (medians)")
    print(
        f"  bare Lightning / plain {medians['bare Lightning'] / medians['plain tensor loop']:.2f}x, "
        f"template / bare Lightning {rate / medians['bare Lightning']:.2f}x (medians)"
    )
    paired = [t / b for t, b in zip(results["template (Lightning)"], results["bare Lightning"], strict=True)]
    spread = f"{min(paired):.2f}..{max(paired):.2f}"
    print(f"  template / bare Lightning {statistics.median(paired):.2f}x (round by round: {spread})")
    same_data = medians["plain, datamodule's batches"]
    print(f"  template / plain with the datamodule's data path {rate / same_data:.2f}x: Lightning's loop (medians)")


if __name__ == "__main__":
    main()
