"""Which MLflow store and run a command logs to (Azure ML's run handover, MLFLOW_TRACKING_URI, a checked server, or the
sqlite store outputs/mlflow.db, made safely by processes started together: `set_up_tracking`), and the MLflow logger
the configs name: Lightning's, sending metrics in batches instead of per call, epoch metrics at step = epoch, and
keeping the store to runs that measured something.

Lightning's MLFlowLogger makes one `log_batch` call per `log_metrics`, a few per epoch, each milliseconds of
SQLAlchemy on the local store and a network round trip on a server or in Azure ML. This one sends them at most every
`flush_every_s` seconds and when the run ends (also when it fails or is interrupted: Lightning calls `finalize` then),
1,000 per request, MLflow's limit. Those still unsent when a checkpoint is written travel in it (to a local store; a
server is sent them first) and a fit resumed from it sends them: a fit killed outright (SIGKILL, a lost node) loses no
metric of the epochs its last.ckpt holds. To a tracking server (`synchronous: false`, what scripts.train sets for one)
a thread of its own (tracking_server.py's Sender) sends them, in order, and keeps what the server does not take to send
it again when the server is back: an outage costs training no more than the wait of a checkpoint for the first failed
request (at most CHECKPOINT_WAIT_S), and SIGTERM ends a fit within seconds. What is still unsent when the process ends
is said lost in one line on stderr.

    python -m scripts.train fit --config configs/penguins.yaml --trainer.logger.init_args.flush_every_s 0
"""

from __future__ import annotations

import atexit
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
from urllib.parse import urlparse, urlsplit

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

MAX_METRICS_PER_REQUEST = 1000  # MLflow's log_batch limit
CHECKPOINT_WAIT_S = 10.0  # most a checkpoint waits for the server to have the metrics so far
FINAL_WAIT_S = 30.0  # most the end of a run waits for the server to take the rest (2 s when it failed, or SIGTERM)
HOST_TAG, PID_TAG = "template.host", "template.pid"  # the process a run of ours belongs to, for finding killed ones


class BufferedMLFlowLogger(MLFlowLogger):
    """
    Args:
        flush_every_s: most seconds between sends; 0 sends every call, as Lightning's logger does. What is unsent
            when a checkpoint is written travels in it (scripts/training/cli.py TrackConfig), so a fit resumed from
            it loses no metric.
        epoch_as_step: metrics whose step Lightning picks (it adds their `epoch` then: every `self.log` flush) are
            logged at step = epoch, so curves of runs with other batch sizes or process counts line up; a metric sent
            with its own step (ClassificationModule's `train_loss_step`) keeps it. False: Lightning's optimizer step,
            and `epoch` as a metric. A step-level `self.log(..., on_step=True)` would share its epoch's step: send
            those directly.
        *args, **kwargs: Lightning's `MLFlowLogger` (experiment_name, tracking_uri, run_id, ...); `log_model` true
            uploads the newest best.ckpt and last.ckpt as the run's artifacts `best/` and `last/` when the run ends
            or fails (Lightning's logger would upload those of one checkpoint callback only).

    Runs it creates carry the host and process id as tags. When it creates a run, runs of this experiment still
    RUNNING whose process on this host is gone (killed with SIGKILL, a lost machine) are ended as KILLED. A run it
    created that fails before any metric was measured (a bad option met at set-up, a crash in the first step) is
    deleted: the store keeps runs that trained or evaluated. A run handed over (`run_id`, Azure ML's job run) is never
    deleted.
    """

    def __init__(self, *args, flush_every_s: float = 5.0, epoch_as_step: bool = True, **kwargs) -> None:
        self._given_run_id = kwargs.get("run_id")
        self.store = kwargs.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
        kwargs["tags"] = {**(kwargs.get("tags") or {}), HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
        self.metric_prefix = kwargs.get("prefix", "")
        # Not MLflow's asynchronous logging: its queue drops a batch the server does not take, and has no bounded wait.
        self.sender = None
        if kwargs.get("synchronous") is False:  # to a server (set_up_tracking)
            from scripts.training.tracking_server import Sender

            self.sender = Sender()
            atexit.register(lambda: self.sender.report_unsent(self.store, self.run_id))
        self.upload_checkpoints = bool(kwargs.pop("log_model", False))
        super().__init__(*args, **kwargs)
        self._checkpoint_callbacks: list = []
        self._uploaded: set[tuple[str, float]] = set()  # (path, mtime) of checkpoints already uploaded
        self.measured = False  # any metric logged: a run worth keeping
        self.started = False  # its run exists: created here or handed over
        self.interrupted = False  # stopped by Ctrl-C (TrackConfig.on_exception): the run ends KILLED, not FAILED
        self.flush_every_s = flush_every_s
        self.epoch_as_step = epoch_as_step
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
            from scripts.training.cli_errors import full_disk_line
            from scripts.training.tracking_server import TrackingError

            if full_disk_line(error) is None:
                raise
            raise TrackingError(
                f"{(self.store or '').removeprefix('sqlite:///')}: the MLflow store's disk is full; free space there, "
                "or give --trainer.default_root_dir (or MLFLOW_TRACKING_URI) a store on another disk"
            ) from None

    @rank_zero_only
    def flush(self, wait: bool = False, stop: Callable[[], bool] = lambda: False) -> None:
        """Sends every pending metric now; `wait`: to a server, also waits until it has every metric sent so far, at
        most CHECKPOINT_WAIT_S, not during an outage, and not once `stop()` (SIGTERM)."""
        pending, self._pending = self._pending, []
        client = self.experiment
        with self.store_errors():
            for start in range(0, len(pending), MAX_METRICS_PER_REQUEST):
                chunk = pending[start : start + MAX_METRICS_PER_REQUEST]
                if self.sender is None:
                    client.log_batch(run_id=self.run_id, metrics=chunk)
                else:
                    self.sender.put(partial(client.log_batch, run_id=self.run_id, metrics=chunk), "metrics", len(chunk))
        self._last_flush = time.monotonic()
        if wait and self.sender is not None:
            self.sender.wait(CHECKPOINT_WAIT_S, stop)

    def unsent(self) -> dict:
        """The metrics not sent yet, for a checkpoint to carry (`resend` takes them back). One JSON string: a checkpoint
        written every epoch of a short fit carries all its epochs' metrics so far, and torch.save pickles a list of
        them object by object (a 100-epoch penguin fit: ~2,600 objects in its last checkpoint)."""
        metrics = json.dumps([[m.key, m.value, m.timestamp, m.step] for m in self._pending])
        return {"run_id": self.run_id if self.started else None, "metrics": metrics}

    @rank_zero_only
    def resend(self, carried: dict) -> None:
        """Queues the metrics a checkpoint carried (`unsent`) that its run does not have yet, before any new one; a
        checkpoint of another run (a fit started from someone else's last.ckpt) brings none."""
        from mlflow.entities import Metric

        # self.run_id starts the run: a continued one then knows which steps of each metric it has (_recorded).
        if not carried.get("metrics") or carried.get("run_id") != self.run_id:
            return
        metrics = carried["metrics"]
        if isinstance(metrics, str):  # else a list, as checkpoints of earlier versions of this logger carry them
            metrics = json.loads(metrics)
        back = [Metric(key, value, timestamp, step) for key, value, timestamp, step in metrics]
        self._pending[:0] = [m for m in back if m.step > self._recorded.get(m.key, -1)]
        self.measured = self.measured or bool(self._pending)

    def log_hyperparams(self, params) -> None:
        """Nothing: the run's parameters are its resolved config, once, under its dotted names
        (scripts/training/run_record.py); Lightning's would log the module's and datamodule's again under others."""

    @property
    @rank_zero_experiment
    def experiment(self):
        client = super().experiment
        if not self.started:
            self.started = True
            if self._given_run_id is None:
                self.end_killed_runs(client)
            else:
                self._recorded = recorded_steps(client, self.run_id)
        return client

    def end_killed_runs(self, client) -> None:
        """Ends as KILLED the runs of this experiment left RUNNING by a process of this host that is gone."""
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
    def handed_over(self) -> bool:
        """Whether its run existed before this process (`run_id`: a resumed fit's, Azure ML's job run)."""
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
            calls.append((self.delete_record, "the deletion of a run that measured nothing"))
        if self.sender is None:
            with self.store_errors():
                for call, _ in calls:
                    call()
            return
        for call, what in calls:  # after the metrics, in order; not waited for during an outage
            self.sender.put(call, what)
        self.sender.wait(FINAL_WAIT_S if status == "success" else 2.0, through_outage=True)

    def end_failed(self) -> None:
        """Ends the run FAILED after Lightning ended it FINISHED (a fit that trained no step), in line behind what
        the sender still holds, like every other call to a server."""
        call = partial(self.experiment.set_terminated, self.run_id, "FAILED")
        if self.sender is None:
            with self.store_errors():
                call()
            return
        self.sender.put(call, "the run's end (failed)")
        self.sender.wait(2.0, through_outage=True)

    def delete_record(self) -> None:
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        artifact_uri = self.experiment.get_run(self.run_id).info.artifact_uri
        get_artifact_repository(artifact_uri).delete_artifacts()
        if artifact_uri.startswith("file:"):  # the run's own folder in a local artifact store
            with contextlib.suppress(OSError):
                Path(urlsplit(artifact_uri).path).parent.rmdir()
        self.experiment.delete_run(self.run_id)  # out of every view; `mlflow gc` removes it from the store


def recorded_steps(client, run_id: str) -> dict[str, int]:
    """The last step of each metric `run_id` has. A fit resumed from last.ckpt (a restarted Azure ML job) trains
    again what came after that checkpoint, and may have sent some of it before it stopped: no step is logged twice."""
    metrics = client.get_run(run_id).data.metrics
    return {key: max(m.step for m in client.get_metric_history(run_id, key)) for key in metrics}


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# ---- which store and run: set up before the logger is built ----


def set_up_tracking(args, outputs: Path, subcommand: str, first_process: bool) -> None:
    """The MLflow logger's store, run and name: what Azure ML hands over (MLFLOW_TRACKING_URI, MLFLOW_RUN_ID), the
    user's server, or outputs/mlflow.db; checked before the run starts. `first_process`: this process alone, or global
    rank 0, says what it chose."""
    from_environment = os.environ.get("MLFLOW_TRACKING_URI")
    if args.tracking_uri is None:  # Lightning's logger defaults to MLFLOW_TRACKING_URI as it was at import
        args.tracking_uri = from_environment
    given = args.tracking_uri == from_environment
    source = "MLFLOW_TRACKING_URI" if given else "--trainer.logger.init_args.tracking_uri"
    if args.tracking_uri is not None:
        from scripts.training.tracking_server import check_tracking_uri, credentials_out_of_uri

        args.tracking_uri = credentials_out_of_uri(args.tracking_uri)
        if "MLFLOW_TRACKING_URI" in os.environ:  # what MLflow itself and processes started from this one read
            os.environ["MLFLOW_TRACKING_URI"] = credentials_out_of_uri(os.environ["MLFLOW_TRACKING_URI"])
        check_tracking_uri(args.tracking_uri, source)
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
        return
    from scripts.training.tracking_server import HTTP_LIMITS

    for name, value in HTTP_LIMITS.items():  # also in the processes started from this one
        os.environ.setdefault(name, value)
    if args.synchronous is None:
        # A server (or Azure ML's tracking) costs a network round trip per logged batch of metrics: queue them
        # instead; ending the run drains the queue. Local sqlite stays synchronous: there the queue's threads only
        # add GIL contention.
        args.synchronous = False


def existing_run(tracking_uri: str, run_id: str | None) -> str | None:
    """`run_id` if that run is in the store at `tracking_uri` (a --checkpoint_dir may have come from another store)."""
    if run_id is None:
        return None
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return run_id if MlflowClient(tracking_uri).get_run(run_id).info.lifecycle_stage == "active" else None
    except MlflowException:
        return None


def is_mlflow_logger(logger) -> bool:
    """Whether the config's logger is Lightning's MLFlowLogger or a subclass (ours, a user's): those get the tracking
    set-up, Azure ML's run handover included."""
    class_path = getattr(logger, "class_path", None)
    if not class_path:
        return False
    module, _, name = class_path.rpartition(".")
    logger_class = getattr(importlib.import_module(module), name, None)
    return isinstance(logger_class, type) and issubclass(logger_class, MLFlowLogger)


def open_sqlite_store(tracking_uri: str) -> None:
    """Opens (and, if new, creates) the sqlite MLflow store before anything else does, one process at a time: processes
    started together (torchrun, mpirun, horovodrun) each build the logger, whose MLflow client makes the tables of a
    new store, and two at once collide. MLflow keeps the store open per URI: the logger's client finds it ready."""
    from filelock import FileLock
    from mlflow import MlflowClient

    path = Path(tracking_uri.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        MlflowClient(tracking_uri).search_experiments(max_results=1)  # MLflow makes a new store's tables here
