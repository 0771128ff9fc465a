"""Train, validate, test or predict any task from its YAML: the one entry point, locally or in Azure ML.

    python -m scripts.train fit --config configs/penguins.yaml
    python -m scripts.train fit --config configs/penguins.yaml --trainer.max_epochs 5 --print_config
    python -m scripts.train test --config configs/penguins.yaml --ckpt_path outputs/<exp>/<run>/checkpoints/best.ckpt
    python -m scripts.train predict --config configs/penguins.yaml --ckpt_path ... --data.predict_path new.csv

`fit` ends by testing the best checkpoint and printing `test_acc`. Runs are tracked in MLflow:
`MLFLOW_TRACKING_URI` / `MLFLOW_RUN_ID` when set (Azure ML sets both), else the sqlite store
`outputs/mlflow.db`; files of a run go to `outputs/<experiment id>/<run id>/`.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import warnings
from typing import NoReturn

import torch
from jsonargparse import ArgumentError
from lightning.pytorch.utilities.exceptions import SIGTERMException

from scripts.training.cli import TemplateCLI, make_cli
from scripts.training.run_record import launched


def main(args: list[str] | None = None) -> TemplateCLI:
    """Mistakes in the user's config, data, weights files or launch end in one line on stderr and exit status 1.
    Returns the CLI that ran (scripts.spark reads the trainer's results from it)."""
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
        # Every process stops with this SystemExit at the same point (scripts/training/sigterm.py), none inside a
        # collective. Its status is 0: a killed run would look finished to a shell or a scheduler. 143 (128 +
        # SIGTERM) is what dying of the signal reports. Another SIGTERM now would make it -15: torchrun and mpirun send
        # one to every process once one of them has ended.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        end_process_group()
        sys.exit(128 + signal.SIGTERM)
    except (KeyboardInterrupt, SystemExit) as stop:
        if interrupted or isinstance(stop, KeyboardInterrupt):
            sys.exit(128 + signal.SIGINT)  # Ctrl-C: 130, what a shell reports for it, not Lightning's 1
        if isinstance(stop.code, str) and stop.code.startswith("error: "):  # the CLI's own
            tell_others(stop.code.removeprefix("error: "), met=False)
        raise
    except ArgumentError as error:
        from scripts.training.cli_errors import config_error_line

        stop_with(config_error_line(error, sys.argv[1:] if args is None else args))
    except BrokenPipeError:
        # `predict ... | head -1`: the reader has gone. End quietly, as Unix tools do: no traceback, nor Python's
        # "Exception ignored" when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except Exception as error:
        # jsonargparse wraps what a class raises while it is built: look for ours in the chain.
        from scripts.training.cli_errors import user_errors

        cause: BaseException | None = error
        ours = user_errors()
        while cause is not None and not isinstance(cause, ours):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            from scripts.training.cli_errors import full_disk_line

            if line := full_disk_line(error):
                stop_with(line)
            if several_processes():
                from scripts.training.peer_errors import peer_line

                if line := peer_line(error):
                    sys.exit(f"error: {line}")
            tell_others(crash_line(error), met=False)  # a crash keeps its traceback; those waiting for it get a line
            raise
        message = str(cause).strip()
        if "\n" in message:  # raised in a DataLoader worker: PyTorch re-raises it with the worker's traceback
            message = message.splitlines()[-1].split(": ", 1)[-1]  # "datamodules.errors.DataError: <message>"
        stop_with(message)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def stop_with(line: str) -> NoReturn:
    """Ends this process with `error: line` (SystemExit's message: scripts.spark and the sweeps read it) and the
    other processes of its job with it."""
    tell_others(line, met=True)
    sys.exit(f"error: {line}")


def several_processes() -> bool:
    return launched() or (torch.distributed.is_available() and torch.distributed.is_initialized())


def tell_others(line: str, met: bool) -> None:
    """Gives the other processes of a job this process's last line: after they met (`met`), those in a collective
    would end in gloo's traceback (peer_errors.py); before, they would wait for this one until torch.distributed's
    timeout (early_stops.py). Nothing to do for a process alone."""
    if not several_processes():
        return
    from scripts.training.early_stops import tell_unmet

    if met:
        from scripts.training.peer_errors import leave_line

        leave_line(line)
    tell_unmet(line)


def crash_line(error: BaseException) -> str:
    """`Type: first line` of what `error` was raised from (jsonargparse wraps what a class's __init__ raised)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


def end_process_group() -> None:
    """Before the interpreter's teardown, which otherwise destroys gloo's group while its worker threads are alive:
    now and then a process aborts then (SIGABRT, "terminate called without an active exception",
    pytorch/pytorch#190489) and a finished fit exits 134. Not after an error: another process may still be inside a
    collective."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class NoAdvertisements(logging.Filter):
    """Drops Lightning's tips to install its cloud services (litlogger, litmodels), printed on every run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def no_gpu_lookups_without_gpus() -> None:
    """Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 when imported, so that asking torch for a GPU cannot start CUDA
    before a process forks. Torch's Adam asks at every step: with the variable set, on a host without NVIDIA's
    driver (CPU machines, CI, CPU clusters), each ask looks for libnvidia-ml.so.1 again and fails, a share of a small
    network's step. Where no GPU is visible there is no CUDA to start: it is unset then."""
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1" and torch.cuda.device_count() == 0:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]


def cli_main(args: list[str] | None = None, cli_class: type[TemplateCLI] = TemplateCLI) -> TemplateCLI:
    no_gpu_lookups_without_gpus()
    # Lightning's rank-zero messages go to this logger (lightning/pytorch/utilities/rank_zero.py).
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, NoAdvertisements) for f in rank_zero_logger.filters):
        rank_zero_logger.addFilter(NoAdvertisements())
    # TransferNet keeps a frozen backbone's BatchNorm in eval mode on purpose; Lightning warns of it.
    warnings.filterwarnings("ignore", r"Found \d+ module\(s\) in eval mode")
    # Lightning 2.6.6 on torch 2.14: a deprecation inside Lightning, printed on every run; nothing to do for users.
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # MLflow logs each failed write to its sqlite store with a traceback, then raises it: the CLI reports it, once. (A
    # filter: MLflow resets its loggers' levels when it is first imported.)
    store_log = logging.getLogger("mlflow.store.db.utils")
    if not store_log.filters:
        store_log.addFilter(lambda record: record.levelno > logging.ERROR)
    # ClassificationModule's epoch metrics are already reduced over all processes (torchmetrics' compute).
    warnings.filterwarnings("ignore", r"It is recommended to use `self.log\('\w+', ..., sync_dist=True\)`")
    # best.ckpt's callback comes first: `ckpt_path="best"` takes it, as Lightning says at length.
    warnings.filterwarnings("ignore", r".*configured with multiple `ModelCheckpoint`")
    # ClassificationModule logs train_loss_step every log_every_n_steps global steps, across epochs too.
    warnings.filterwarnings("ignore", r"The number of training batches .* is smaller than the logging interval")
    return make_cli(args, cli_class)


if __name__ == "__main__":
    main()
