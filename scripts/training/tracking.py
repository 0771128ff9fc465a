"""The MLflow logger the configs name: Lightning's, sending metrics in batches instead of per call, epoch
metrics at step = epoch, and keeping the store to runs that measured something; the checks of a tracking URI
before a run starts.

Lightning's MLFlowLogger makes one `log_batch` call per `log_metrics`: a few of them per epoch.
Each costs ~7 ms of SQLAlchemy on the local sqlite store and a network round trip on a tracking
server or inside Azure ML. This one keeps the metrics and sends them at most every `flush_every_s`
seconds, before every last.ckpt (checkpoints.py) and when the run ends (also when it fails or is
interrupted: Lightning calls `finalize` then), 1,000 per request, MLflow's limit.

    python -m scripts.train fit --config configs/penguins.yaml --trainer.logger.init_args.flush_every_s 0
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

MAX_METRICS_PER_REQUEST = 1000  # MLflow's log_batch limit
HOST_TAG, PID_TAG = "template.host", "template.pid"  # the process a run of ours belongs to, for finding killed ones


class TrackingError(Exception):
    """A tracking URI that cannot work (a file store, a server that does not answer); the message says what to do."""


class BufferedMLFlowLogger(MLFlowLogger):
    """
    Args:
        flush_every_s: most seconds between sends; 0 sends every call, as Lightning's logger does. Everything is
            also sent before last.ckpt is written (checkpoints.py), so a fit resumed from it loses no metric.
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
        kwargs["tags"] = {**(kwargs.get("tags") or {}), HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
        self.metric_prefix = kwargs.get("prefix", "")
        synchronous = kwargs.get("synchronous")
        self._log_batch_options = {} if synchronous is None else {"synchronous": synchronous}
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

    @rank_zero_only
    def flush(self, wait: bool = False) -> None:
        """Sends every pending metric now; `wait`: also waits until the store has every metric sent so far (sending
        to a server is asynchronous)."""
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), MAX_METRICS_PER_REQUEST):
            chunk = pending[start : start + MAX_METRICS_PER_REQUEST]
            self.experiment.log_batch(run_id=self.run_id, metrics=chunk, **self._log_batch_options)
        self._last_flush = time.monotonic()
        if wait and self._log_batch_options.get("synchronous") is False:
            import mlflow

            mlflow.flush_async_logging()

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
        self.upload_newest_checkpoints()
        super().finalize("KILLED" if status == "failed" and self.interrupted else status)
        if status == "failed" and not self.measured and not self.handed_over:
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

            artifact_uri = self.experiment.get_run(self.run_id).info.artifact_uri
            get_artifact_repository(artifact_uri).delete_artifacts()
            if artifact_uri.startswith("file:"):  # the run's own folder in a local artifact store
                with contextlib.suppress(OSError):
                    Path(urlsplit(artifact_uri).path).parent.rmdir()
            self.experiment.delete_run(self.run_id)
            purge_run(self.experiment, self.run_id)


def purge_run(client, run_id: str) -> None:
    """Removes a deleted run from the store for good, parameters and tags with it, where the store can: SQL stores
    (sqlite) by their `_hard_delete_run`, which `mlflow gc` calls (a canary test watches the name). A server keeps
    it deleted until its own `mlflow gc`."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    hard_delete = getattr(store, "_hard_delete_run", None)
    if hard_delete is not None:
        hard_delete(run_id)


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


def check_tracking_uri(uri: str, source: str, timeout_s: float = 5.0) -> None:
    """Raises TrackingError when `uri` (named by `source`, e.g. MLFLOW_TRACKING_URI) cannot track this run: a plain-file
    store, or a server that does not answer within `timeout_s` (MLflow itself would retry for minutes)."""
    import urllib.error
    import urllib.request

    scheme = urlsplit(uri).scheme
    if uri == "databricks":  # Databricks' own tracking: a name, not a path
        return
    if scheme in ("file", "") or (len(scheme) == 1 and uri[1:3] in (":\\", ":/")):  # file:, a path, C:\...
        raise TrackingError(
            f"{source} {uri}: a plain-file MLflow store (in maintenance mode in MLflow 3, and it cannot hold this "
            "config's parameters); use sqlite:///path/to/mlflow.db, a server's http:// URL, or unset it for "
            "outputs/mlflow.db"
        )
    if scheme not in ("http", "https"):
        return  # sqlite, azureml (Azure ML's own plugin), databricks: their clients say what is wrong
    request = urllib.request.Request(f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/get-by-name?experiment_name=_")
    try:
        urllib.request.urlopen(request, timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered (401, 404...): the server is there; MLflow reports what it says
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise TrackingError(
            f"{source} {uri}: the tracking server does not answer ({reason}); start it, correct the URI, or unset "
            "MLFLOW_TRACKING_URI to track to outputs/mlflow.db"
        ) from None


def credentials_out_of_uri(uri: str, environ: MutableMapping[str, str] = os.environ) -> str:
    """`uri` without the user and password it may hold (`http://user:pass@host`); they move to
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, MLflow's own way to send them, so that the server still gets
    them and no parameter, config.yaml, artifact or log line does (MLflow prints a run's URL when it ends)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return uri
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    environ["MLFLOW_TRACKING_USERNAME"] = unquote(user)
    if password:
        environ["MLFLOW_TRACKING_PASSWORD"] = unquote(password)
    return urlunsplit(parts._replace(netloc=host))


def open_sqlite_store(tracking_uri: str) -> None:
    """Opens (and, if new, creates) the sqlite MLflow store before anything else does, one process at a time.

    Processes started together (torchrun, mpirun, horovodrun) each build the logger, whose MLflow client creates the
    tables of a new store; two at once collide ("duplicate column name"). MLflow keeps the store open per URI,
    so the logger's client then finds it ready.
    """
    from filelock import FileLock
    from mlflow import MlflowClient

    with FileLock(f"{tracking_uri.removeprefix('sqlite:///')}.lock"):
        MlflowClient(tracking_uri)
