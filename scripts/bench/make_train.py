"""What a whole `make train` costs, as a user waits for it: the fresh process of `python -m scripts.train fit --config
configs/penguins.yaml` (imports, a new MLflow store, the fit, the test of its best checkpoint, the exit), timed from
outside, with each speed measure the fit still takes turned off in turn: the reference for each is measured in the
same run, alternating with it round by round, so the machine's drift cancels out of their ratio.

    python -m scripts.bench.make_train [--epochs 100] [--rounds 5]

- template:        the fit as `make train` runs it;
- metrics per call: MLflow metrics sent at every log call (`--trainer.logger.init_args.flush_every_s 0`, what
                   Lightning's MLFlowLogger does), not in batches at most every 5 s (scripts/training/tracking.py);
- eval in batches: the validation and test rows in batches of the training batch size, not in one slice
                   (datamodules/penguins.py evaluate_in_one_batch);
- collections at exit: Python's last garbage collections when the process ends, not skipped (scripts/train.py
                   run).
A measure stays in the fit only where it saves 5% or more of this wait (docs/architecture.md lists them with their
figures); each variant prints its median over the rounds and that median against the template's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.report import Report, run_command
from scripts.bench.throughput import BenchParser, count

ROOT = Path(__file__).resolve().parents[2]
# Each variant: the options added to `make train`'s command, and the Python run before scripts.train's run().
VARIANTS = {
    "template": ([], ""),
    "metrics per call": (["--trainer.logger.init_args.flush_every_s", "0"], ""),
    "eval in batches": (
        [],
        "from datamodules.penguins import PenguinDataModule\nPenguinDataModule.evaluate_in_one_batch = False",
    ),
    "collections at exit": ([], "import gc\ngc.freeze = lambda: None"),
}
PROGRAM = """
import sys
from scripts import train
{patch}
sys.argv = ["scripts/train.py", *sys.argv[1:]]
train.run()
"""


def make_train(folder: Path, epochs: int, options: list[str], patch: str) -> float:
    """Seconds of one fresh `make train` process (in its own outputs folder, so each makes its MLflow store anew)."""
    args = ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", str(epochs),
            "--trainer.default_root_dir", str(folder), *options]  # fmt: skip
    started = time.perf_counter()
    run_command([sys.executable, "-c", PROGRAM.format(patch=patch), *args], cwd=ROOT)
    return time.perf_counter() - started


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = BenchParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=count(1, 10_000), default=100, help="epochs of each fit (make train: 100)")
    parser.add_argument("--rounds", type=count(1, 100), default=5, help="rounds of every variant; medians are printed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    options = parse_options(argv)
    report = Report("make train")
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as temp:
        for round_ in range(1, options.rounds + 1):
            order = list(VARIANTS) if round_ % 2 else list(reversed(VARIANTS))  # every other round reversed
            for name in order:
                folder = Path(temp) / f"{round_}-{len(seconds[name])}-{name.replace(' ', '-')}"
                seconds[name].append(
                    report.measured(
                        f"round {round_}, {name}",
                        lambda s: f"{s:.2f} s",
                        make_train,
                        folder,
                        options.epochs,
                        *VARIANTS[name],
                    )  # fmt: skip
                )
    reference = statistics.median(seconds["template"])
    print(f"make train of {options.epochs} epochs, a fresh process each, median of {options.rounds} rounds "
          f"({os.cpu_count()} cores):")  # fmt: skip
    width = max(map(len, seconds))
    for name, values in seconds.items():
        median = statistics.median(values)
        print(
            f"  {name:{width}} {median:7.2f} s  ({min(values):.2f}..{max(values):.2f})  {median / reference:.2f}x "
            "template"
        )


if __name__ == "__main__":
    main()
