"""The penguin recipe (100 epochs, batch 20, Adam 1e-3) timed side by side, per epoch:

    python -m scripts.bench.penguins [--epochs 100] [--rounds 3]

- plain:    a bare PyTorch loop over the tensors, computing the same epoch metrics (the floor);
- course:   the Microsoft Learn course's loop, DataLoader(num_workers=1), training and testing each epoch;
- bare Lightning: the penguin net in a LightningModule that computes and logs nothing (Lightning's floor);
- naive Lightning: a first port of the course to Lightning (DataLoaders, `self.log` per step), no tracking;
- template: PenguinDataModule + ClassificationModule in a plain Trainer (no logger, checkpoints, callbacks);
- make train: the CLI on configs/penguins.yaml, exactly what `make train` runs (MLflow sqlite store,
            best and last checkpoints, throughput, early stopping).
Every variant trains on the same split and evaluates the validation rows once per epoch. Lightning
variants are timed from the first epoch's start to the last one's (what an epoch costs once running);
make train's one-time work around them (MLflow run and config, final checkpoints, their upload) is
printed beside it. Each run's figure is printed as it is measured (`round 1, plain tensor loop: 150.8 ms/epoch`),
then each variant's best and its ratio to the plain loop's (scripts/bench/report.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from unittest.mock import patch

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from datamodules.penguins import PenguinDataModule
from lightning_modules.classifier import ClassificationModule
from lightning_modules.penguin_net import PenguinNet
from scripts.bench.report import Report
from scripts.bench.throughput import BenchParser, count
from scripts.train import cli_main
from scripts.training.cli import TemplateCLI

BATCH = 20


def plain(train, val, epochs: int) -> float:
    """The floor: the same four epoch metrics the template logs (train/val loss and accuracy), nothing else."""
    torch.manual_seed(0)
    net = PenguinNet(3)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    (x, y), (vx, vy) = train, val
    started = time.perf_counter()
    for _ in range(epochs):
        net.train()
        order = torch.randperm(len(x))
        loss_sum, correct = torch.zeros(()), torch.zeros((), dtype=torch.long)
        for i in range(0, len(x), BATCH):
            rows = order[i : i + BATCH]
            logits = net(x[rows])
            loss = F.cross_entropy(logits, y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * len(rows)
            correct += (logits.detach().argmax(1) == y[rows]).sum()
        metrics = {"train_loss": loss_sum / len(x), "train_acc": correct / len(x)}
        net.eval()
        with torch.no_grad():
            logits = net(vx)
            metrics |= {"val_loss": F.cross_entropy(logits, vy), "val_acc": (logits.argmax(1) == vy).float().mean()}
        {name: value.item() for name, value in metrics.items()}
    return (time.perf_counter() - started) / epochs


def course(train, val, epochs: int) -> float:
    """The course's train() and test() functions, as published."""
    torch.manual_seed(0)
    net = PenguinNet(3)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_criteria = torch.nn.CrossEntropyLoss()
    train_loader = DataLoader(TensorDataset(*train), batch_size=BATCH, shuffle=False, num_workers=1)
    test_loader = DataLoader(TensorDataset(*val), batch_size=BATCH, shuffle=False, num_workers=1)
    started = time.perf_counter()
    for _ in range(epochs):
        net.train()
        train_loss = 0.0
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = loss_criteria(net(data), target)
            train_loss += loss.item()
            loss.backward()
            optimizer.step()
        net.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for data, target in test_loader:
                out = net(data)
                test_loss += loss_criteria(out, target).item()
                correct += torch.sum(target == torch.max(out.data, 1)[1]).item()
    return (time.perf_counter() - started) / epochs


class NaiveLightning(L.LightningModule):
    """What a first Lightning port of the course looks like: DataLoaders over datasets, `self.log` every step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = PenguinNet(3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("train_acc", (logits.argmax(1) == y).float().mean(), on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class BareLightning(L.LightningModule):
    """Lightning's own floor: the loop and its hooks around the net, nothing computed or logged."""

    def __init__(self) -> None:
        super().__init__()
        self.net = PenguinNet(3)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.net(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class EpochClock(L.Callback):
    """Seconds per epoch between the first epoch's start and the last one's: all of every epoch's work, no set-up."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.starts.append(time.perf_counter())

    @property
    def seconds_per_epoch(self) -> float:
        return (self.starts[-1] - self.starts[0]) / (len(self.starts) - 1)


def seconds_per_epoch(module: L.LightningModule, epochs: int, data: dict, **trainer_options) -> float:
    """Fits `module` on `data` (Trainer.fit's data arguments); no logger or checkpoints unless given."""
    clock = EpochClock()
    options = {"logger": False, "enable_checkpointing": False, **trainer_options}
    trainer = L.Trainer(
        max_epochs=epochs, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[clock], **options,
    )  # fmt: skip
    trainer.fit(module, **data)
    return clock.seconds_per_epoch


def bare_lightning(epochs: int) -> float:
    torch.manual_seed(0)
    return seconds_per_epoch(BareLightning(), epochs, {"datamodule": PenguinDataModule()})


def naive_lightning(train, val, epochs: int) -> float:
    torch.manual_seed(0)
    loaders = {
        "train_dataloaders": DataLoader(TensorDataset(*train), batch_size=BATCH, shuffle=True),
        "val_dataloaders": DataLoader(TensorDataset(*val), batch_size=BATCH),
    }
    return seconds_per_epoch(NaiveLightning(), epochs, loaders)


def template(epochs: int) -> float:
    """ClassificationModule on PenguinDataModule in a plain Trainer: no logger, checkpoints or callbacks."""
    torch.manual_seed(0)
    model = ClassificationModule(PenguinNet, PenguinDataModule.class_names)
    return seconds_per_epoch(model, epochs, {"datamodule": PenguinDataModule()})


class TimedFitCLI(TemplateCLI):
    """`make train`'s CLI and config, timing `fit` alone (no test after it)."""

    def before_fit(self) -> None:
        super().before_fit()
        self.clock = EpochClock()
        self.trainer.callbacks.append(self.clock)
        self.started = time.perf_counter()

    def after_fit(self) -> None:
        self.fit_seconds = time.perf_counter() - self.started


def make_train(epochs: int, one_time: list[float]) -> float:
    """configs/penguins.yaml through the CLI: MLflow (sqlite), best and last checkpoints, throughput, early stopping.
    Returns seconds per epoch; appends the seconds of fit's one-time work around the epochs to `one_time`."""
    # patch.dict restores os.environ: MLflow's set_tracking_uri exports MLFLOW_TRACKING_URI, which the next
    # round's CLI would take as Azure ML's and log to this round's deleted store.
    with tempfile.TemporaryDirectory() as folder, patch.dict(os.environ):
        args = ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", str(epochs)]
        cli = cli_main([*args, "--trainer.default_root_dir", folder], cli_class=TimedFitCLI)
        per_epoch = cli.clock.seconds_per_epoch
        one_time.append(cli.fit_seconds - per_epoch * cli.trainer.current_epoch)
        return per_epoch


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = BenchParser(description="penguin recipe: seconds per epoch, side by side")
    parser.add_argument("--epochs", type=count(2), default=100, help="epochs a fit (2 or more: an epoch is timed "
                        "from one epoch's start to the next one's)")  # fmt: skip
    parser.add_argument(
        "--rounds", type=count(1), default=3, help="each variant runs this often, interleaved; best kept"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_options(argv)
    warnings.filterwarnings("ignore")
    report = Report("penguins")
    data = PenguinDataModule()
    report.step("reading the penguins", data.setup, "fit")
    train, val = data.splits["train"], data.splits["val"]
    one_time: list[float] = []
    variants = {
        "plain tensor loop": lambda: plain(train, val, args.epochs),
        "course loop (DataLoader, 1 worker)": lambda: course(train, val, args.epochs),
        "naive Lightning (DataLoader, self.log)": lambda: naive_lightning(train, val, args.epochs),
        "bare Lightning (tensor batches, no metrics)": lambda: bare_lightning(args.epochs),
        "template module + datamodule, no tracking": lambda: template(args.epochs),
        "make train (MLflow, checkpoints, callbacks)": lambda: make_train(args.epochs, one_time),
    }
    # Interleaved rounds and the best of each: these shared 2-core machines jitter by 30% and more.
    results = {name: float("inf") for name in variants}
    for round_ in range(1, args.rounds + 1):
        for name, run in variants.items():
            seconds = report.measured(f"round {round_}, {name}", lambda s: f"{s * 1000:.1f} ms/epoch", run)
            results[name] = min(results[name], seconds)
    floor = results["plain tensor loop"]
    print(f"penguins: {args.epochs} epochs, batch {BATCH}, {len(train[0])} training rows, best of {args.rounds} rounds")
    for name, seconds in results.items():
        print(f"  {name:44s} {seconds * 1000:7.1f} ms/epoch  {seconds / floor:5.2f}x plain")
    once = min(one_time)
    print(f"  make train's one-time work around its epochs (MLflow run and config, final checkpoints): {once:.2f} s")


if __name__ == "__main__":
    main()
