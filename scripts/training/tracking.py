"""The MLflow logger the configs name: Lightning's, sending metrics in batches instead of per call, epoch
metrics at step = epoch, and keeping the store to runs that measured something; the checks of a tracking URI
before a run starts.

Lightning's MLFlowLogger makes one `log_batch` call per `log_metrics`: a few of them per epoch.
Each costs milliseconds of SQLAlchemy on the local sqlite store and a network round trip on a tracking
server or inside Azure ML. This one keeps the metrics and sends them at most every `flush_every_s`
seconds and when the run ends (also when it fails or is interrupted: Lightning calls `finalize`
then), 1,000 per request, MLflow's limit. Those still unsent when a checkpoint is written travel in
it (to a local store; a server is sent them first) and a fit resumed from it sends them: a fit
killed outright (SIGKILL, a lost node) loses no metric of the epochs its last.ckpt holds.

To a tracking server (`synchronous: false`, what scripts.train sets for one) a thread of its own sends them, in order,
and keeps what the server does not take to send it again when the server is back: an outage costs training no more
than the wait of a checkpoint for the first failed request (at most CHECKPOINT_WAIT_S), and SIGTERM ends a fit within
seconds. What is still unsent when the process ends is said lost in one line on stderr.

    python -m scripts.train fit --config configs/penguins.yaml --trainer.logger.init_args.flush_every_s 0
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

MAX_METRICS_PER_REQUEST = 1000  # MLflow's log_batch limit
CHECKPOINT_WAIT_S = 10.0  # most a checkpoint waits for the server to have the metrics so far
FINAL_WAIT_S = 30.0  # most the end of a run waits for the server to take the rest (2 s when it failed, or SIGTERM)
RETRY_EVERY_S = 5.0  # between attempts while the server does not answer
HOST_TAG, PID_TAG = "template.host", "template.pid"  # the process a run of ours belongs to, for finding killed ones


class TrackingError(Exception):
    """A tracking URI that cannot work (a file store, a server that does not answer); the message says what to do."""


class Sender:
    """Runs calls to a tracking server in a thread of its own, in order. A call that fails (the server is down or does
    not answer) stays first in line and is tried again every RETRY_EVERY_S, so nothing is lost while the process
    lives; `wait` bounds how long anyone waits for it."""

    def __init__(self) -> None:
        self.calls: deque[tuple[Callable[[], object], str, int]] = deque()  # (call, what it sends, metrics in it)
        self.changed = threading.Condition()
        self.failures = 0
        self.failing_since: float | None = None
        self.call_started = 0.0  # time.monotonic() when the call in flight began
        self.reason = ""
        self.retry_now = threading.Event()  # set by a wait through an outage: the next attempt need not wait its turn
        threading.Thread(target=self.run, name="mlflow-sender", daemon=True).start()

    def put(self, call: Callable[[], object], what: str, metrics: int = 0) -> None:
        with self.changed:
            if not self.calls:  # it starts next: a wait must not time it from the last call (an epoch ago, maybe)
                self.call_started = time.monotonic()
            self.calls.append((call, what, metrics))
            self.changed.notify_all()

    def run(self) -> None:
        while True:
            with self.changed:
                while not self.calls:
                    self.changed.wait()
                call = self.calls[0][0]
                self.call_started = time.monotonic()
            try:
                call()
            except Exception as error:
                with self.changed:
                    self.failures += 1
                    self.failing_since = self.failing_since or time.time()
                    self.reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else repr(error)
                    self.changed.notify_all()
                self.retry_now.wait(RETRY_EVERY_S)
                self.retry_now.clear()
                continue
            with self.changed:
                self.calls.popleft()
                self.failing_since = None
                self.changed.notify_all()

    def wait(self, timeout_s: float, stop: Callable[[], bool] = lambda: False, through_outage: bool = False) -> bool:
        """Until every call is done, a call fails, `stop()` or `timeout_s`; True when every call is done. During an
        outage (a call failed, or has not returned for `timeout_s`) it returns at once, the calls waiting for the
        server and not training; `through_outage` (the run's end) waits the whole `timeout_s` for the server to come
        back, trying again every second."""
        deadline, failures = time.monotonic() + timeout_s, self.failures
        with self.changed:
            while self.calls and not stop():
                if not through_outage and (self.failing_since is not None or self.failures != failures):
                    break
                now = time.monotonic()
                if now >= deadline or (not through_outage and now - self.call_started > timeout_s):
                    break
                if through_outage and self.failing_since is not None:
                    self.retry_now.set()
                self.changed.wait(min(deadline - now, 0.2 if not through_outage else 1.0))
            return not self.calls

    def unsent(self) -> list[str]:
        """What is still waiting: "<n> metrics" and the other calls' descriptions."""
        with self.changed:
            calls = list(self.calls)
        metrics = sum(count for _, _, count in calls)
        others = list(dict.fromkeys(what for _, what, count in calls if not count))
        return ([f"{metrics} metrics"] if metrics else []) + others


class BufferedMLFlowLogger(MLFlowLogger):
    """
    Args:
        flush_every_s: most seconds between sends; 0 sends every call, as Lightning's logger does. What is unsent
            when a checkpoint is written travels in it (scripts/training/cli.py TrackConfig), so a fit resumed from
            it loses no metric.
        epoch_as_step: metrics whose step Lightning picks (it adds their `epoch` then: every
            `self.log` flush) are logged at step = epoch, so curves of runs with other batch sizes or
            process counts line up; a metric sent with its own step (ClassificationModule's
            `train_loss_step`) keeps it. False: Lightning's optimizer step, and `epoch` as a metric.
            A step-level `self.log(..., on_step=True)` would share its epoch's step: send those directly.
        *args, **kwargs: Lightning's `MLFlowLogger` (experiment_name, tracking_uri, run_id, ...); `log_model`
            true uploads the newest best.ckpt and last.ckpt as the run's artifacts `best/` and `last/` when the
            run ends or fails (Lightning's logger would upload those of one checkpoint callback only).

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
        if kwargs.get("synchronous") is False:
            self.sender = Sender()
            atexit.register(self.report_unsent)
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

    def report_unsent(self) -> None:
        """One line on stderr, when the process ends, for what the tracking server never took."""
        if self.sender is None or not (unsent := self.sender.unsent()):
            return
        failing_since, reason = self.sender.failing_since, self.sender.reason
        if failing_since is None:  # no request failed yet: the first one is still unanswered
            failing_since = time.time() - (time.monotonic() - self.sender.call_started)
            reason = "a request still unanswered"
        since = time.strftime("%H:%M:%S", time.localtime(failing_since))
        print(
            f"warning: the tracking server {self.store} has not answered since {since} ({reason}): "
            f"{', '.join(unsent)} of run {self.run_id} were not recorded there and are lost; the checkpoints are on "
            "disk",
            file=sys.stderr,
        )

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
