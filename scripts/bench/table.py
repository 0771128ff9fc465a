"""A table bigger than its memory budget, streamed: peak memory and speed of one epoch against the rows' count.

    python -m scripts.bench.table [--rows 1000000,4000000] [--repeats 3] [--budget-mb 64] [--threads 1]

For each size, a Parquet folder of that many generated rows x 30 columns (26 numbers, 3 text columns of a few
categories, a label of 4 classes; row groups of 65,536 rows, as Spark writes them) made in a temporary folder. Then
in rounds, the sizes in turn: `python -m scripts.train fit` of configs/table.yaml for one epoch with a budget that
forces streaming (`--budget-mb`), batch BATCH, no test: its peak RSS (the process's own VmHWM) and its training
rows a second (the fit's train_samples_per_sec); and a plain PyTorch loop (the same TableNet and AdamW, the same
batch size, a seeded permutation an epoch) over the same training rows already in memory as tensors (the streamed
datamodule's own, read once before the rounds), in this process; and bare Lightning: the same net, optimizer and
batches in Lightning's loop with nothing of the template's (no metric, logger, checkpoint or validation), the floor
under the template's step. `--threads` sets torch's threads in all three. Printed: each run as measured and each
round's epoch against its plain loop (speed follows the machine's load), then the medians of the rounds: each size's
peak RSS (the goal: the largest within 300 MB of the smallest), the whole fit's seconds (the one pass that splits and
describes the table included), the epoch's rows/s against the plain loop's (goal 0.8x), and bare Lightning's against
both.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F

from scripts.bench.report import BenchError, Report, error_line
from scripts.bench.throughput import BenchParser, EpochThroughput, count

BATCH = 1024
NUMBERS, TEXTS, CHUNK = 26, 3, 250_000  # 26 + 3 + the label: 30 columns; rows generated a chunk at a time (4 a file)
ROW_GROUP = 65_536
REPO = Path(__file__).resolve().parents[2]


def write_table(folder: Path, rows: int, seed: int = 0) -> Path:
    """`rows` generated rows in part files of a million rows at most (row groups of ROW_GROUP), in bounded memory: the
    class depends on a few numbers and a category, so that the network has something to learn."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    colours = np.array(["red", "green", "blue", "amber", "violet"])
    writer, written = None, 0
    while written < rows:
        size = min(CHUNK, rows - written)
        if written % 1_000_000 == 0:
            if writer is not None:
                writer.close()
            writer = None
        numbers = rng.normal(size=(size, NUMBERS)).round(4)
        texts = [colours[rng.integers(0, 2 + i, size)] for i in range(TEXTS)]
        score = numbers[:, 0] + numbers[:, 1] * numbers[:, 2] + (texts[0] == "red")
        label = np.digitize(score, [-1.0, 0.0, 1.0]).astype(np.int64)
        columns = {f"x{i}": numbers[:, i] for i in range(NUMBERS)} | {f"c{i}": texts[i] for i in range(TEXTS)}
        table = pa.table(columns | {"label": label})
        if writer is None:
            writer = pq.ParquetWriter(folder / f"part-{written // 1_000_000:05d}.parquet", table.schema)
        writer.write_table(table, row_group_size=ROW_GROUP)
        written += size
    writer.close()
    return folder


def streamed_fit(folder: Path, outputs: Path, budget_mb: float, threads: int | None = None) -> dict:
    """One epoch of the template's fit of `folder`, streamed: peak RSS (MB), the epoch's rows/s, the whole seconds;
    `threads`: torch's (OMP_NUM_THREADS), else its default."""
    metrics = outputs / "metrics.json"
    command = [sys.executable, "-m", "scripts.train", "fit", "--config", "configs/table.yaml",
               "--data.init_args.csv_path", str(folder), "--data.init_args.label", "label",
               "--data.init_args.memory_budget_mb", str(budget_mb), "--data.init_args.batch_size", str(BATCH),
               "--trainer.max_epochs", "1", "--test_after_fit", "false", "--trainer.default_root_dir", str(outputs),
               "--metrics_file", str(metrics)]  # fmt: skip
    started, peak_kb = time.perf_counter(), 0
    with tempfile.TemporaryFile("w+") as log:
        environment = os.environ | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=environment)
        while process.poll() is None:
            peak_kb = max(peak_kb, own_peak_kb(process.pid))
            time.sleep(0.05)
        if process.returncode != 0:
            log.seek(0)
            raise BenchError(f"exit status {process.returncode}: {error_line(log.read())}")
    seconds = time.perf_counter() - started
    rows_per_second = json.loads(metrics.read_text())["train_samples_per_sec"]
    return {"rss_mb": peak_kb / 1024, "rows_per_s": rows_per_second, "seconds": seconds}


def own_peak_kb(pid: int) -> int:
    """The process's own peak RSS so far (VmHWM), 0 once it is gone. Not wait4's ru_maxrss: Linux carries a forked
    child's high-water mark across its exec, so a fit started from this process (holding the tables' tensors) was
    measured at this process's size."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def training_tensors(folder: Path, budget_mb: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The training rows of `folder` as the network sees them, in memory: the streamed datamodule's, read once."""
    from datamodules.table import TableDataModule

    data = TableDataModule(str(folder), "label", memory_budget_mb=budget_mb, batch_size=65_536)
    with contextlib.redirect_stderr(io.StringIO()):  # its columns' kinds: the fits say them
        data.setup("fit")
    inputs, labels = zip(*data.train_dataloader())
    return torch.cat(inputs), torch.cat(labels)


class Batches:
    """One epoch's batches of BATCH rows in a seeded permutation (drawn as the iteration starts), made with
    `index_select`: what the plain loop and bare Lightning both train on."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / BATCH)

    def __iter__(self):
        order = torch.randperm(len(self.labels))
        for start in range(0, len(self.labels), BATCH):
            rows = order[start : start + BATCH]
            yield self.inputs.index_select(0, rows), self.labels.index_select(0, rows)


def table_net(inputs: torch.Tensor, labels: torch.Tensor) -> torch.nn.Module:
    """TableNet as configs/table.yaml makes it, its lazy first layer given the inputs' width."""
    from lightning_modules.table_net import TableNet

    net = TableNet(int(labels.max()) + 1, hidden=64, layers=2, dropout=0.1)
    net(inputs[:2])
    return net


def adamw(parameters) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=0.003, weight_decay=0.0001)  # configs/table.yaml's


def plain_loop(inputs: torch.Tensor, labels: torch.Tensor, seed: int) -> float:
    """Rows a second of one epoch of a hand-written loop: TableNet, AdamW, BATCH."""
    torch.manual_seed(seed)
    net = table_net(inputs, labels)
    optimizer = adamw(net.parameters())
    started = time.perf_counter()
    for batch_inputs, batch_labels in Batches(inputs, labels):
        loss = F.cross_entropy(net(batch_inputs), batch_labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return len(labels) / (time.perf_counter() - started)


class BareLightning(L.LightningModule):
    """The plain loop's net, loss and optimizer in Lightning's loop: nothing computed, collected or logged."""

    def __init__(self, network: torch.nn.Module) -> None:
        super().__init__()
        self.network = network

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.network(batch[0]), batch[1])

    def configure_optimizers(self):
        return adamw(self.parameters())


def bare_lightning(inputs: torch.Tensor, labels: torch.Tensor, seed: int) -> float:
    """Rows a second of one epoch of BareLightning over the plain loop's batches, timed as the benches time Lightning
    (scripts/bench/throughput.py): a Trainer without logger, checkpoints, validation or progress bar."""
    torch.manual_seed(seed)
    model = BareLightning(table_net(inputs, labels))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[EpochThroughput()])  # fmt: skip
    trainer.fit(model, train_dataloaders=Batches(inputs, labels))
    return float(trainer.callback_metrics["bench_samples_per_sec"])


def parse_options(argv: list[str] | None = None):
    parser = BenchParser(description="A streamed table's peak memory and speed, against its rows")
    parser.add_argument("--rows", default="1000000,4000000", help="the sizes, comma-separated (from 2,000)")
    parser.add_argument("--repeats", type=count(1), default=3, help="rounds of every size")
    parser.add_argument("--budget-mb", type=float, default=64, help="the budget the fits stream past")
    parser.add_argument("--threads", type=count(1), default=None,
                        help="torch's threads in the fits and the plain loop alike (default: torch's own); on a "
                        "machine loaded past its cores, 1 keeps idle threads from spinning")  # fmt: skip
    args = parser.parse_args(argv)
    text = args.rows
    try:
        args.rows = [int(size) for size in text.split(",")]
    except ValueError:
        parser.error(f"argument --rows: {text}: give whole numbers, comma-separated (1000000,4000000)")
    if any(size < 2000 for size in args.rows):
        parser.error(f"argument --rows: {text}: give 2000 rows or more a size")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_options(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # bare Lightning's Trainer's notes and tips
    if args.threads:
        torch.set_num_threads(args.threads)
    report = Report("table")
    with tempfile.TemporaryDirectory(prefix="table-bench-") as temporary:
        folders = {rows: report.step(f"writing {rows} rows", write_table, Path(temporary) / f"rows-{rows}", rows)
                   for rows in args.rows}  # fmt: skip
        tensors = {rows: report.step(f"reading {rows} rows", training_tensors, folder, args.budget_mb)
                   for rows, folder in folders.items()}  # fmt: skip
        fits: dict[int, list[dict]] = {rows: [] for rows in args.rows}
        plain: dict[int, list[float]] = {rows: [] for rows in args.rows}
        bare: dict[int, list[float]] = {rows: [] for rows in args.rows}
        for round_ in range(1, args.repeats + 1):
            for rows, folder in folders.items():
                outputs = Path(temporary) / f"fit-{rows}-{round_}"
                fit = report.measured(f"round {round_}, streamed fit of {rows} rows",
                                      lambda fit: f"{fit['rss_mb']:.0f} MB peak", streamed_fit, folder, outputs,
                                      args.budget_mb, args.threads)  # fmt: skip
                print(f"round {round_}, streamed epoch of {rows} rows: {fit['rows_per_s']:.0f} rows/s", flush=True)
                fits[rows].append(fit)
                plain[rows].append(report.measured(f"round {round_}, plain loop of {rows} rows",
                                                   lambda speed: f"{speed:.0f} rows/s", plain_loop, *tensors[rows],
                                                   round_))  # fmt: skip
                print(f"round {round_}, streamed epoch against the plain loop of {rows} rows: "
                      f"{fit['rows_per_s'] / plain[rows][-1]:.3f} times", flush=True)  # fmt: skip
                bare[rows].append(report.measured(f"round {round_}, bare Lightning of {rows} rows",
                                                  lambda speed: f"{speed:.0f} rows/s", bare_lightning, *tensors[rows],
                                                  round_))  # fmt: skip
    print(f"table: {', '.join(map(str, args.rows))} rows x 30 columns, batch {BATCH}, budget {args.budget_mb:g} MB, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats} rounds")  # fmt: skip
    rss = {rows: statistics.median(fit["rss_mb"] for fit in runs) for rows, runs in fits.items()}
    for rows, runs in fits.items():
        speed, loop = statistics.median(fit["rows_per_s"] for fit in runs), statistics.median(plain[rows])
        print(f"  {rows} rows: peak RSS {rss[rows]:.0f} MB, fit {statistics.median(f['seconds'] for f in runs):.1f} s;"
              f" epoch {speed:.0f} rows/s, plain loop {loop:.0f} rows/s: {speed / loop:.2f}x")  # fmt: skip
        lightning = statistics.median(bare[rows])
        print(f"  {rows} rows: bare Lightning {lightning:.0f} rows/s: {lightning / loop:.2f}x of the plain loop; the "
              f"epoch {speed / lightning:.2f}x of bare Lightning")  # fmt: skip
    smallest, largest = min(args.rows), max(args.rows)
    print(f"  peak RSS, {largest} rows against {smallest}: {rss[largest] - rss[smallest]:+.0f} MB (goal: within 300)")


if __name__ == "__main__":
    main()
