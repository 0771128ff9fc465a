"""Which MLflow store and run a command logs to (`set_up_tracking`), and the logger the configs name: Lightning's
MLFlowLogger sending metrics in batches (Lightning's makes a request, of a store or a server, per `log_metrics`), epoch
metrics at step = epoch, the store kept to runs that measured something (docs/tracking.md).

    python -m scripts.train fit --config configs/penguins.yaml --trainer.logger.init_args.flush_every_s 0
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from urllib.parse import urlparse

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

MAX_METRICS_PER_REQUEST = 1000  # MLflow's log_batch limit
CHECKPOINT_WAIT_S = 10.0  # most a checkpoint waits for the server to have the metrics so far
FINAL_WAIT_S = 30.0  # most the end of a run waits for the server to take the rest (2 s when it failed, or SIGTERM)
HOST_TAG, PID_TAG = "template.host", "template.pid"  # the process a run of ours belongs to, for finding killed ones


class BufferedMLFlowLogger(MLFlowLogger):
    """Runs left RUNNING by a process of this host that is gone (SIGKILL) are ended KILLED (its runs carry the host and
    process id). One it created that fails before measuring anything is deleted; one handed over (`run_id`) never is.

    Args:
        flush_every_s: most seconds between sends; 0 sends every call, as Lightning's logger. What is unsent when a
            checkpoint is written travels in it (run_record.py), so a fit resumed from it loses no metric.
        epoch_as_step: metrics whose step Lightning picks (every `self.log`: it adds their `epoch`) at step = epoch,
            so that curves of other batch sizes or process counts line up. False: Lightning's optimizer step.
        *args, **kwargs: Lightning's `MLFlowLogger`'s; `log_model` uploads the newest best.ckpt and last.ckpt as the
            artifacts `best/` and `last/` at the run's end (Lightning's, those of one checkpoint callback only).
    """

    def __init__(self, *args, flush_every_s: float = 5.0, epoch_as_step: bool = True, **kwargs) -> None:
        self._given_run_id = kwargs.get("run_id")
        self.store = kwargs.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
        kwargs["tags"] = {**(kwargs.get("tags") or {}), HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
        self.metric_prefix = kwargs.get("prefix", "")
        self.sender = None  # not MLflow's asynchronous logging: it drops what the server does not take, waits unbounded
        if kwargs.get("synchronous") is False:  # to a server: a thread of its own (tracking_server.py)
            self.sender = importlib.import_module("scripts.training.tracking_server").sender_for(self)
        self.upload_checkpoints = bool(kwargs.pop("log_model", False))
        super().__init__(*args, **kwargs)
        self._checkpoint_callbacks: list = []
        self._uploaded: set[tuple[str, float]] = set()  # (path, mtime) of checkpoints already uploaded
        self.measured = False  # any metric logged: a run worth keeping
        self.started = False  # its run exists: created here or handed over
        self.held = False  # no run created while held: until the first batch (the CLI's TrackConfig.start_record)
        self.interrupted = False  # stopped by Ctrl-C (TrackConfig.on_exception): the run ends KILLED, not FAILED
        self.flush_every_s, self.epoch_as_step = flush_every_s, epoch_as_step
        self._pending: list = []
        self._last_flush = time.monotonic()
        self._recorded: dict[str, int] = {}  # a continued run's last step of each metric it already has

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        if self.epoch_as_step and "epoch" in metrics:
            metrics = dict(metrics)
            step = int(metrics.pop("epoch"))
        timestamp_ms = int(time.time() * 1000)
        for key, value in metrics.items():
            if self.metric_prefix:
                key = f"{self.metric_prefix}{self.LOGGER_JOIN_CHAR}{key}"
            if isinstance(value, str):  # Lightning's logger drops these too; MLflow metrics are numbers
                continue
            key = re.sub("[^a-zA-Z0-9_/. -]+", "", key)  # the characters MLflow accepts, as Lightning does
            if (step or 0) <= self._recorded.get(key, -1):  # trained again after a resume: the run has it already
                continue
            self._pending.append(Metric(key=key, value=float(value), timestamp=timestamp_ms, step=step or 0))
            self.measured = True
        if len(self._pending) >= MAX_METRICS_PER_REQUEST or time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    @contextlib.contextmanager
    def store_errors(self):
        """A store on a full disk as one TrackingError naming it (MLflow logs each failed write at length)."""
        try:
            yield
        except Exception as error:
            from scripts.training.tracking_server import full_store

            if (full := full_store(error, self.store)) is None:
                raise
            raise full from None

    def send(self, call: Callable[[], object], what: str, metrics: int = 0) -> None:
        """`call` to the store: at once to a local one; to a server, in line behind what the Sender holds."""
        if self.sender is not None:
            self.sender.put(call, what, metrics)
            return
        with self.store_errors():
            call()

    @rank_zero_only
    def flush(self, wait: bool = False, stop: Callable[[], bool] = lambda: False) -> None:
        """`wait`: to a server, until it has every metric sent so far, at most CHECKPOINT_WAIT_S, not during an outage,
        not once `stop()` (SIGTERM)."""
        pending, self._pending = self._pending, []
        with self.store_errors():
            client = self.experiment
        for start in range(0, len(pending), MAX_METRICS_PER_REQUEST):
            chunk = pending[start : start + MAX_METRICS_PER_REQUEST]
            self.send(partial(client.log_batch, run_id=self.run_id, metrics=chunk), "metrics", len(chunk))
        self._last_flush = time.monotonic()
        if wait and self.sender is not None:
            self.sender.wait(CHECKPOINT_WAIT_S, stop)

    def unsent(self) -> dict:
        """The metrics not sent yet, for a checkpoint to carry (`resend` takes them back). One JSON string: torch.save
        pickles a list object by object (a 100-epoch penguin fit's last checkpoint: ~2,600 objects)."""
        metrics = json.dumps([[m.key, m.value, m.timestamp, m.step] for m in self._pending])
        return {"run_id": self.run_id if self.started else None, "metrics": metrics}

    def log_hyperparams(self, params) -> None:
        """Nothing: the run's parameters are its resolved config (run_record.py), not the module's again."""

    @property
    @rank_zero_experiment
    def experiment(self):
        if self.held:  # Lightning asks before the data's setup: a client without a run (name, version None)
            return importlib.import_module("mlflow").MlflowClient(self.store)
        client = super().experiment
        if not self.started:
            self.started = True
            if self._given_run_id is None:
                self.end_killed_runs(client)
            else:  # a continued run: what a resumed fit trains again is not logged twice
                self._recorded = importlib.import_module("scripts.training.resume").recorded_steps(client, self.run_id)
        return client

    def end_killed_runs(self, client) -> None:
        host = socket.gethostname().replace("'", "")
        running = client.search_runs(
            [self.experiment_id], f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'", max_results=100
        )
        for run in running:
            pid = run.data.tags.get(PID_TAG, "")
            if run.info.run_id != self.run_id and pid.isdigit() and not process_alive(int(pid)):
                client.set_terminated(run.info.run_id, "KILLED")

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        if self.upload_checkpoints and checkpoint_callback not in self._checkpoint_callbacks:
            self._checkpoint_callbacks.append(checkpoint_callback)

    def upload_newest_checkpoints(self) -> None:
        for callback in self._checkpoint_callbacks:
            for path in {callback.best_model_path, callback.last_model_path} - {""}:
                if not Path(path).is_file() or (path, Path(path).stat().st_mtime) in self._uploaded:
                    continue
                self.experiment.log_artifact(self.run_id, path, Path(path).stem)
                self._uploaded.add((path, Path(path).stat().st_mtime))

    @property
    def handed_over(self) -> bool:  # its run existed before this process (`run_id`: a resumed fit's, Azure ML's)
        return self._given_run_id is not None

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if not self.started:
            return
        self.flush()
        if status == "failed" and not self.measured and self.handed_over:
            return  # a resume that failed before measuring anything leaves the run's record as it was
        end = "KILLED" if status == "failed" and self.interrupted else status
        calls = [
            (self.upload_newest_checkpoints, "the checkpoints' upload"),
            (partial(MLFlowLogger.finalize, self, end), f"the run's end ({end})"),
        ]
        if status == "failed" and not self.measured:
            from scripts.training.failed_runs import delete_record

            calls.append((partial(delete_record, self), "the deletion of a run that measured nothing"))
        for call, what in calls:  # after the metrics, in order; to a server, not waited for during an outage
            self.send(call, what)
        if self.sender is not None:
            self.sender.wait(FINAL_WAIT_S if status == "success" else 2.0, through_outage=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def set_up_tracking(args, outputs: Path, subcommand: str, first_process: bool) -> None:
    """The logger's store, run and name, checked before the run starts; `first_process` says what it chose."""
    from_environment = os.environ.get("MLFLOW_TRACKING_URI")
    if args.tracking_uri is None:  # Lightning's logger defaults to MLFLOW_TRACKING_URI as it was at import
        args.tracking_uri = from_environment
    given = args.tracking_uri == from_environment
    source = "MLFLOW_TRACKING_URI" if given else "--trainer.logger.init_args.tracking_uri"
    if args.tracking_uri is not None:
        from scripts.training.tracking_server import use_given_store

        use_given_store(args, source)
    else:
        args.tracking_uri = f"sqlite:///{outputs / 'mlflow.db'}"
        if args.artifact_location is None:  # else MLflow puts artifacts in ./mlruns
            args.artifact_location = (outputs / "mlartifacts").resolve().as_uri()
    if args.run_id is None:
        args.run_id = os.environ.get("MLFLOW_RUN_ID")
    named = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if named and named != args.experiment_name:
        # MLflow's own variable, set for this command: it wins over the experiment a shared YAML names.
        if first_process:
            print(f"experiment {named!r} (MLFLOW_EXPERIMENT_NAME), not the config's {args.experiment_name!r}",
                  file=sys.stderr)  # fmt: skip
        args.experiment_name = named
    if args.run_id is None and args.run_name is None:
        # MLflow draws names from `random`, which the seed fixes: every run of a config would be named alike.
        args.run_name = f"{subcommand}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
    if urlparse(args.tracking_uri).scheme == "sqlite":
        open_sqlite_store(args.tracking_uri)


def is_mlflow_logger(logger) -> bool:
    """Whether the config's logger is Lightning's MLFlowLogger or a subclass: those get the tracking set-up."""
    class_path = getattr(logger, "class_path", None)
    if not class_path:
        return False
    module, _, name = class_path.rpartition(".")
    logger_class = getattr(importlib.import_module(module), name, None)
    return isinstance(logger_class, type) and issubclass(logger_class, MLFlowLogger)


def open_sqlite_store(tracking_uri: str) -> None:
    """Opens (and, if new, creates) the sqlite store one process at a time: processes started together would make a
    new store's tables at once, and collide. MLflow keeps it open per URI: the logger's client finds it ready."""
    from filelock import FileLock
    from mlflow import MlflowClient

    path = Path(tracking_uri.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        try:
            MlflowClient(tracking_uri).search_experiments(max_results=1)  # MLflow makes a new store's tables here
        except Exception as error:  # a full disk, a file-size limit: one line naming the store
            full = importlib.import_module("scripts.training.tracking_server").full_store(error, tracking_uri)
            raise full or error from None
