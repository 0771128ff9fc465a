"""The penguin recipe (100 epochs, batch 20, Adam 1e-3) timed side by side, per epoch:

    python -m scripts.bench_penguins [--epochs 100]

- plain:    a bare PyTorch loop over the tensors (the floor);
- course:   the Microsoft Learn course's loop, DataLoader(num_workers=1), training and testing each epoch;
- bare Lightning: the penguin net in a LightningModule that computes and logs nothing (Lightning's floor);
- naive Lightning: a first port of the course to Lightning (DataLoaders, `self.log` per step), no tracking;
- template: Lightning with PenguinDataModule + ClassificationModule, without and with tracking
            (MLflow sqlite store and checkpoints, as `make train` runs it).
Every variant trains on the same split and evaluates the validation rows once per epoch.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from datamodules.penguins import PenguinDataModule
from lightning_modules.classifier import ClassificationModule
from lightning_modules.penguin_net import PenguinNet

BATCH = 20


def plain(train, val, epochs: int) -> float:
    torch.manual_seed(0)
    net = PenguinNet(3)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    (x, y), (vx, vy) = train, val
    started = time.perf_counter()
    for _ in range(epochs):
        net.train()
        order = torch.randperm(len(x))
        for i in range(0, len(x), BATCH):
            rows = order[i : i + BATCH]
            loss = F.cross_entropy(net(x[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        net.eval()
        with torch.no_grad():
            (net(vx).argmax(1) == vy).float().mean().item()
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


def seconds_per_epoch(module: L.LightningModule, epochs: int, data: dict, **trainer_options) -> float:
    """Fits `module` on `data` (Trainer.fit's data arguments); no logger or checkpoints unless given."""
    options = {"logger": False, "enable_checkpointing": False, **trainer_options}
    trainer = L.Trainer(
        max_epochs=epochs, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **options
    )
    started = time.perf_counter()
    trainer.fit(module, **data)
    return (time.perf_counter() - started) / epochs


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


def template(epochs: int, tracked: bool) -> float:
    torch.manual_seed(0)
    model = ClassificationModule(PenguinNet, PenguinDataModule.class_names)
    data = {"datamodule": PenguinDataModule()}
    if not tracked:
        return seconds_per_epoch(model, epochs, data)
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import MLFlowLogger

    with tempfile.TemporaryDirectory() as folder:  # as `make train`: sqlite store, best and last checkpoints
        return seconds_per_epoch(
            model,
            epochs,
            data,
            logger=MLFlowLogger("bench", tracking_uri=f"sqlite:///{folder}/mlflow.db", log_model=True),
            enable_checkpointing=True,
            callbacks=[ModelCheckpoint(monitor="val_loss", filename="best", save_last=True)],
            default_root_dir=folder,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="penguin recipe: seconds per epoch, side by side")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="each variant runs this often, interleaved; best kept")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    data = PenguinDataModule()
    data.setup("fit")
    train, val = data.splits["train"], data.splits["val"]
    variants = {
        "plain tensor loop": lambda: plain(train, val, args.epochs),
        "course loop (DataLoader, 1 worker)": lambda: course(train, val, args.epochs),
        "naive Lightning (DataLoader, self.log)": lambda: naive_lightning(train, val, args.epochs),
        "bare Lightning (tensor batches, no metrics)": lambda: bare_lightning(args.epochs),
        "template, no tracking": lambda: template(args.epochs, tracked=False),
        "template, MLflow + checkpoints": lambda: template(args.epochs, tracked=True),
    }
    # Interleaved rounds and the best of each: these shared 2-core machines jitter by 30% and more.
    results = {name: float("inf") for name in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            results[name] = min(results[name], run())
    floor = results["plain tensor loop"]
    print(f"penguins: {args.epochs} epochs, batch {BATCH}, {len(train[0])} training rows, best of {args.rounds} rounds")
    for name, seconds in results.items():
        print(f"  {name:44s} {seconds * 1000:7.1f} ms/epoch  {seconds / floor:5.2f}x plain")


if __name__ == "__main__":
    main()
