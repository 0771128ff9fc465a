"""Train, validate, test or predict any task from its YAML: the one entry point, locally or in Azure ML. Runs are
tracked in MLflow (docs/tracking.md), their files in outputs/<experiment id>/<run id>/ (scripts/training/cli.py).

    python -m scripts.train fit --config configs/penguins.yaml
    python -m scripts.train test --config configs/penguins.yaml --ckpt_path outputs/<exp>/<run>/checkpoints/best.ckpt
    python -m scripts.train predict --config configs/penguins.yaml --ckpt_path ... --data.predict_path new.csv
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import warnings

import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from scripts.training.cli import TemplateCLI, make_cli
from scripts.training.run_record import launched


def main(args: list[str] | None = None) -> TemplateCLI:
    """Mistakes in the user's config, data, weights files or launch end in one line on stderr and exit status 1
    (scripts/training/cli_errors.py). Returns the CLI that ran (scripts.spark reads the trainer's results from it)."""
    interrupted: list[int] = []

    def on_sigint(signum: int, frame) -> None:
        interrupted.append(signum)
        signal.default_int_handler(signum, frame)  # KeyboardInterrupt, which Lightning turns into exit 1

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if in_main_thread else None
    try:
        cli = cli_main(args)
        end_process_group()
        return cli
    except SIGTERMException:
        # Every process stops here together (sigterm.py). Lightning's status, 0, would tell a scheduler the run ended
        # well: 143 is dying of the signal's. Another SIGTERM now (torchrun's, mpirun's, as one ended) would be -15.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        end_process_group()
        sys.exit(128 + signal.SIGTERM)
    except (KeyboardInterrupt, SystemExit, Exception) as error:
        from scripts.training.cli_errors import exit_for

        several = launched() or (torch.distributed.is_available() and torch.distributed.is_initialized())
        exit_for(error, bool(interrupted), sys.argv[1:] if args is None else args, several)
        raise  # a crash keeps its traceback
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def end_process_group() -> None:
    """Before the interpreter's teardown, which destroys gloo's group while its threads live: now and then a finished
    fit aborted there, exit 134 (pytorch/pytorch#190489). Not after an error: another process may be in a collective."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def cli_main(args: list[str] | None = None, cli_class: type[TemplateCLI] = TemplateCLI) -> TemplateCLI:
    # Lightning's tips to install its cloud services (litlogger, litmodels), printed on every run.
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not rank_zero_logger.filters:
        rank_zero_logger.addFilter(lambda record: not str(record.msg).startswith("💡 Tip:"))
    warnings.filterwarnings("ignore", r"Found \d+ module\(s\) in eval mode")  # TransferNet's frozen BatchNorm
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")  # inside Lightning 2.6.6
    # MLflow logs each failed write to its sqlite store with a traceback, then raises it: the CLI reports it once. (A
    # filter: MLflow resets its loggers' levels when first imported.)
    store_log = logging.getLogger("mlflow.store.db.utils")
    if not store_log.filters:
        store_log.addFilter(lambda record: record.levelno > logging.ERROR)
    # The module's epoch metrics are reduced over the processes (torchmetrics' compute); best.ckpt's callback comes
    # first, which `ckpt_path="best"` takes; train_loss_step is logged every log_every_n_steps across epochs too.
    warnings.filterwarnings("ignore", r"It is recommended to use `self.log\('\w+', ..., sync_dist=True\)`")
    warnings.filterwarnings("ignore", r".*configured with multiple `ModelCheckpoint`")
    warnings.filterwarnings("ignore", r"The number of training batches .* is smaller than the logging interval")
    # A streamed table's workers each read their own row groups (datamodules/table_stream_batches.py): its length holds.
    warnings.filterwarnings("ignore", r"Your `IterableDataset` has `__len__` defined")
    return make_cli(args, cli_class)


def run() -> None:
    """`python -m scripts.train`: main(), then the process ends without Python's last collections, which walk every
    object torch, Lightning and MLflow made (~2.5 s of CPU after a penguin fit; a whole `make train` 1.20-1.23x
    without this: docs/architecture.md). Frozen objects are never collected; their memory goes with the process."""
    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    run()
