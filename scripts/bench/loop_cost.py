"""What Lightning's training loop and a progress bar cost each step, apart from the work of the step:

    python -m scripts.bench.loop_cost [--data-dir ../shared/data/mnist] [--steps 400] [--repeats 3]

On MNISTDataModule's batches, a net that costs next to nothing (a linear layer on four pixels) is trained by a
plain loop (fetch, the datamodule's scaling, forward, zero_grad, backward, SGD step) and by Lightning's loop. The
medians of the steps' times, less the plain loop's, are Lightning's fixed cost a step: its hooks, its closure and
optimizer chain, its progress and logging bookkeeping. The same plain loop on MNISTNet gives a real step's time here,
and so the ceiling that fixed cost puts on scripts.bench.mnist's template / plain: step / (step + cost).
The template's module (its metrics updated and logged at every step) around the same net in the same Trainer gives
what the template's loop costs. Then the same Lightning loop with a progress bar drawing into a file (as in an
Azure ML job's log): Lightning's TQDM bar as it is by default, drawing at every batch, and as scripts.train sets it
(`PROGRESS_BAR_REFRESH`).
The variants take turns `--repeats` times, each run's median printed as it is measured (`round 1, plain loop: 310 µs
a step`); then each variant's median over the rounds with their spread (min..max).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import TQDMProgressBar

from datamodules.mnist import MNISTDataModule
from lightning_modules.classifier import ClassificationModule
from lightning_modules.mnist_net import MNISTNet
from scripts.bench.mnist import BATCH, OPTIMIZER, bench_trainer
from scripts.bench.report import Report
from scripts.bench.throughput import BenchParser, count
from scripts.training.cli import PROGRESS_BAR_REFRESH

SKIPPED = 10  # the first steps warm up allocations and caches


class NearFreeNet(torch.nn.Module):
    """A step with next to no arithmetic: what is left of its time is the loop around it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.linear(images[:, 0, 0, :4])


class NearFreeModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = NearFreeNet()

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return OPTIMIZER(self.parameters())


def median_step_us(ends: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(ends[SKIPPED:], ends[SKIPPED + 1 :])) * 1e6


def plain(data: MNISTDataModule, net: torch.nn.Module, steps: int) -> float:
    """Median µs a step of a hand-written loop on the datamodule's batches."""
    torch.manual_seed(0)
    channels_last = isinstance(net, MNISTNet)  # as configs/mnist.yaml trains it
    net = net.to(memory_format=torch.channels_last) if channels_last else net
    optimizer = OPTIMIZER(net.parameters())
    ends = []
    for i, batch in enumerate(data.train_dataloader()):
        if i == steps:
            break
        images, labels = data.on_after_batch_transfer(batch, 0)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        loss = F.cross_entropy(net(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ends.append(time.perf_counter())
    return median_step_us(ends)


class StepEnds(L.Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.ends.append(time.perf_counter())


def lightning(data_dir: str, steps: int, bar: TQDMProgressBar | None = None, template: bool = False) -> float:
    """Median µs a step of NearFreeModule in scripts.bench.mnist's Trainer; `bar` draws into a temporary file. With
    `template`, the template's module (ClassificationModule, its metrics updated and logged) around the near-free
    net."""
    torch.manual_seed(0)
    ends = StepEnds()
    trainer = bench_trainer(steps, ends, *([bar] if bar else []))
    names = MNISTDataModule.class_names
    module = ClassificationModule(lambda _: NearFreeNet(), names, optimizer=OPTIMIZER) if template else NearFreeModule()
    with tempfile.TemporaryFile("w") as log, contextlib.redirect_stdout(log):  # Lightning's bars write to stdout
        trainer.fit(module, datamodule=MNISTDataModule(data_dir=data_dir, batch_size=BATCH))
    return median_step_us(ends.ends)


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = BenchParser(description="Lightning's fixed cost a training step, against a plain loop")
    parser.add_argument("--data-dir", default="data/mnist", help="folder of the four MNIST idx files")
    parser.add_argument(
        "--steps", type=count(SKIPPED + 2, 430), default=400, help="training steps a round (an epoch: 430)"
    )
    parser.add_argument("--repeats", type=count(1), default=3, help="rounds of every variant")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_options(argv)
    warnings.filterwarnings("ignore")
    report = Report("loop_cost")
    data = MNISTDataModule(data_dir=args.data_dir, batch_size=BATCH)
    report.step("reading MNIST", data.prepare_data)
    report.step("reading MNIST", data.setup, "fit")
    runs = {
        "plain loop": lambda: plain(data, NearFreeNet(), args.steps),
        "stock Lightning": lambda: lightning(args.data_dir, args.steps),
        "template's module, Trainer": lambda: lightning(args.data_dir, args.steps, template=True),
        "+ Lightning's bar, to a file": lambda: lightning(args.data_dir, args.steps, bar=TQDMProgressBar()),
        "+ template's bar, to a file": lambda: lightning(
            args.data_dir, args.steps, bar=TQDMProgressBar(refresh_rate=PROGRESS_BAR_REFRESH)
        ),
        "plain loop, MNISTNet": lambda: plain(data, MNISTNet(10), args.steps),
    }
    results: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(1, args.repeats + 1):
        for name, run in runs.items():
            results[name].append(report.measured(f"round {round_}, {name}", lambda us: f"{us:.0f} µs a step", run))
    medians = {name: statistics.median(times) for name, times in results.items()}
    print(f"loop cost: {args.steps} steps of batch {BATCH}, {torch.get_num_threads()} threads, {args.repeats} rounds")
    print(f"  {'µs a step':28s} {'median':>8s}  (min..max)")
    for name, times in results.items():
        print(f"  {name:28s} {medians[name]:8.0f}  ({min(times):.0f}..{max(times):.0f})")
    step = medians["plain loop, MNISTNet"]
    for name in ["stock Lightning", "template's module, Trainer"]:
        cost = medians[name] - medians["plain loop"]
        ceiling = step / (step + cost)
        print(f"  {name}: {cost:+.0f} µs a step, {cost / step:.1%} of an MNIST step; ceiling {ceiling:.2f}x")
    for name in ("+ Lightning's bar, to a file", "+ template's bar, to a file"):
        cost = medians[name] - medians["stock Lightning"]
        print(f"  {name.removeprefix('+ ')}: {cost:+.0f} µs a step, {cost / step:.1%} of an MNIST step")


if __name__ == "__main__":
    main()
