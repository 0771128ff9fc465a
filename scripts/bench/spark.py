"""What the fit costs on Spark against torchrun, for the same 2 DDP processes on this machine, side by side:

    python -m scripts.bench.spark [--epochs 30] [--rounds 2] [--master "local-cluster[2,1,1024]"]

Each runs the penguin recipe (batch 20 per process) as a user would, in rounds that alternate them:
- torchrun: `torchrun --standalone --nproc_per_node 2 -m scripts.train fit ... --trainer.devices 2`;
- spark:    `python -m scripts.spark fit ... --num_processes 2 --master MASTER` (a local-cluster master by default:
            each task in an executor process of its own, as on a cluster; the Spark start is part of its wall time);
- spark, session running: `fit_on_spark` on a session started before the clock starts, as in a Databricks or
            Synapse notebook whose cluster is up (the first fit of the session: its Python workers start cold);
            then, on the same session, TorchDistributor running a function that returns at once: Spark's floor.
Each run's wall time and epoch are printed as they are measured (`round 1, torchrun --standalone: wall 41.2 s, epoch
94.8 ms`); then per launcher, best of the rounds: the command's wall time, the time of an epoch once training (from the
timestamps of the MLflow run's per-epoch val_loss) and the rest (start-up, the final test, shutdown), with Spark's
ratios to torchrun's measured in the same run.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.report import Report, run_command
from scripts.bench.throughput import BenchParser, count

REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout: scripts.train runs from there


def fit_args(outputs: Path, epochs: int) -> list[str]:
    return [
        "fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", str(epochs),
        "--trainer.default_root_dir", str(outputs), "--trainer.callbacks", "[]",  # no early stop: every epoch runs
    ]  # fmt: skip


def torchrun(outputs: Path, epochs: int, master: str) -> list[str]:
    ddp = ["--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "scripts.train"]
    return [sys.executable, *launcher, *fit_args(outputs, epochs), *ddp]


def spark(outputs: Path, epochs: int, master: str) -> list[str]:
    (fit, *args) = fit_args(outputs, epochs)
    return [sys.executable, "-m", "scripts.spark", fit, "--num_processes", "2", "--master", master, *args]


def spark_session_running(outputs: Path, epochs: int, master: str) -> list[str]:
    (fit, *args) = fit_args(outputs, epochs)
    program = (
        "import sys, time\n"
        "from scripts.spark import fit_on_spark\nfrom scripts.spark.session import LocalSpark\n"
        f"local = LocalSpark({master!r})\n"
        "started = time.perf_counter()\n"
        f"fit_on_spark({[fit, '--num_processes', '2', *args]!r}, spark=local.session)\n"
        "print(f'fit seconds: {time.perf_counter() - started}')\n"
        "from pyspark.ml.torch.distributor import TorchDistributor\n"
        "started = time.perf_counter()\n"
        "TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(lambda: None)\n"
        "print(f'floor seconds: {time.perf_counter() - started}')\n"
        "local.stop()\n"
    )
    return [sys.executable, "-c", program]


def epoch_seconds(outputs: Path) -> float:
    """Seconds per epoch of the run in `outputs`: from the first epoch's val_loss to the last one's."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = sorted(client.get_metric_history(run.info.run_id, "val_loss"), key=lambda m: m.step)
    return (history[-1].timestamp - history[0].timestamp) / 1000 / (len(history) - 1)


FLOOR: list[float] = []  # TorchDistributor running a function that returns at once, on the running session


def measure(command, epochs: int, master: str) -> tuple[float, float]:
    """(wall s, s per epoch) of one run of `command` in a fresh outputs folder."""
    with tempfile.TemporaryDirectory() as folder:
        outputs = Path(folder) / "outputs"
        started = time.perf_counter()
        result = run_command(command(outputs, epochs, master), cwd=REPOSITORY)
        wall = time.perf_counter() - started
        if timed := re.search(r"^fit seconds: (\S+)$", result.stdout, re.M):  # the part after the session's start
            wall = float(timed[1])
            FLOOR.extend(float(found) for found in re.findall(r"^floor seconds: (\S+)$", result.stdout, re.M))
        return wall, epoch_seconds(outputs)


LABELS = {"torchrun": "torchrun --standalone", "spark": "scripts.spark", "spark_session_running":
          "scripts.spark, session already running"}  # fmt: skip


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = BenchParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=count(2), default=30, help="epochs a fit (2 or more: an epoch is timed "
                        "from the first epoch's val_loss to the last one's)")  # fmt: skip
    parser.add_argument("--rounds", type=count(1), default=2)
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    options = parse_options(argv)
    report = Report("spark")
    best: dict[str, tuple[float, float]] = {}
    for round_ in range(1, options.rounds + 1):
        for command in (torchrun, spark, spark_session_running):
            wall, epoch = report.measured(
                f"round {round_}, {LABELS[command.__name__]}",
                lambda measured: f"wall {measured[0]:.1f} s, epoch {measured[1] * 1000:.1f} ms",
                measure, command, options.epochs, options.master,
            )  # fmt: skip
            old = best.get(command.__name__, (float("inf"), float("inf")))
            best[command.__name__] = (min(old[0], wall), min(old[1], epoch))
    print(f"penguins fit, 2 DDP processes (gloo), {options.epochs} epochs, best of {options.rounds} rounds")
    reference_wall, reference_epoch = best["torchrun"]
    for name, (wall, epoch) in best.items():
        rest = wall - epoch * options.epochs
        label = f"{LABELS[name]} ({options.master})" if name == "spark" else LABELS[name]
        print(
            f"  {label:42s} wall {wall:6.1f} s {wall / reference_wall:5.2f}x   epoch {epoch * 1000:6.1f} ms "
            f"{epoch / reference_epoch:5.2f}x   start-up, test and shutdown {rest:5.1f} s"
        )
    if FLOOR:
        print(f"  TorchDistributor.run of a function that returns at once, session running: {min(FLOOR):.1f} s")


if __name__ == "__main__":
    main()
