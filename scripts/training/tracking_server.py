"""What a run tracked to a server needs and a run tracked to the local sqlite store does not: the URI's checks before
the run starts (a plain-file store, a server that does not answer, Databricks without credentials, credentials inside
the URI), the HTTP limits MLflow gets, and the thread that sends the logger's calls to the server (`Sender`); and, for
any store, the line for a full disk (`full_store`) and the experiment that runs made outside a fit go to
(`experiment_id`).
scripts.train loads it when a tracking URI is given (MLFLOW_TRACKING_URI, Azure ML's jobs, or
`--trainer.logger.init_args.tracking_uri`):

    MLFLOW_TRACKING_URI=http://127.0.0.1:5000 python -m scripts.train fit --config configs/penguins.yaml
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from urllib.parse import unquote, urlsplit, urlunsplit


class TrackingError(Exception):
    """A tracking store that cannot work (a file store, a server that does not answer, a full disk); the message says
    what to do."""


RETRY_EVERY_S = 5.0  # between a Sender's attempts while the server does not answer
# MLflow's own defaults retry a request for ~4 min (7 retries, backoff factor 2) of up to 120 s each. A run tracked to a
# server gets these unless the environment sets them: one request then takes at most 3 x 10 s plus ~6 s of backoff.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def full_store(error: BaseException, store: str | None) -> TrackingError | None:
    """One line naming the store, for `error` of a store on a full disk; None for another error."""
    from scripts.training.cli_errors import full_disk_line

    if (line := full_disk_line(error)) is None:
        return None
    path = (store or "").removeprefix("sqlite:///")
    if "file too large" in line:  # the file-size limit, not the disk: named with the store, not a file of sqlite's
        return TrackingError(f"{path}: file too large{line.split('file too large', 1)[1]}")
    return TrackingError(
        f"{path}: the MLflow store's disk is full; free space there, or give "
        "--trainer.default_root_dir (or MLFLOW_TRACKING_URI) a store on another disk"
    )


def experiment_id(client, name: str, artifact_location: str | None) -> str:
    """The id of the experiment `name` in `client`'s store (an MlflowClient), created if missing, with
    `artifact_location` (None: the store's default)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:  # created meanwhile by another process
        return client.get_experiment_by_name(name).experiment_id


def use_given_store(args, source: str) -> None:
    """The logger's arguments `args` for the store a user or Azure ML gave (named by `source`): checked, its credentials
    out of the URI and, for a server, MLflow's HTTP limits and sending by a thread of the logger's own."""
    args.tracking_uri = credentials_out_of_uri(args.tracking_uri)
    if "MLFLOW_TRACKING_URI" in os.environ:  # what MLflow itself and processes started from this one read
        os.environ["MLFLOW_TRACKING_URI"] = credentials_out_of_uri(os.environ["MLFLOW_TRACKING_URI"])
    check_tracking_uri(args.tracking_uri, source)
    if urlsplit(args.tracking_uri).scheme == "sqlite":
        return
    for name, value in HTTP_LIMITS.items():  # also in the processes started from this one
        os.environ.setdefault(name, value)
    if args.synchronous is None:
        # A server (or Azure ML's tracking) costs a network round trip per logged batch of metrics: queue them
        # instead; ending the run drains the queue. Local sqlite stays synchronous: there the queue's threads only
        # add GIL contention.
        args.synchronous = False


def check_tracking_uri(uri: str, source: str, timeout_s: float = 5.0) -> None:
    """Raises TrackingError when `uri` (named by `source`, e.g. MLFLOW_TRACKING_URI) cannot track this run: a plain-file
    store, or a server that does not answer within `timeout_s` (MLflow itself would retry for minutes)."""
    import urllib.error
    import urllib.request

    scheme = urlsplit(uri).scheme
    if uri == "databricks" or scheme == "databricks":  # Databricks' own tracking: a name, not a path
        check_databricks_credentials(uri, source)
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
    except urllib.error.HTTPError as error:
        if error.code >= 500:  # it answers, but fails: every call of the run would, in MLflow's chained tracebacks
            raise TrackingError(
                f"{source} {uri}: the tracking server answers HTTP {error.code} ({error.reason}); check the server "
                "(its log says why), or unset MLFLOW_TRACKING_URI to track to outputs/mlflow.db"
            ) from None
        return  # it answered (401, 404...): the server is there; MLflow reports what it says
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise TrackingError(
            f"{source} {uri}: the tracking server does not answer ({reason}); start it, correct the URI, or unset "
            "MLFLOW_TRACKING_URI to track to outputs/mlflow.db"
        ) from None


def check_databricks_credentials(uri: str, source: str) -> None:
    """Raises TrackingError when no Databricks host and token can be found for `uri` (MLflow would say so in 69
    lines, at the run's first call)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.databricks_utils import get_databricks_host_creds

    quiet = logging.getLogger("mlflow.utils.databricks_utils")  # it warns of its fallback before failing
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        get_databricks_host_creds(uri)
    except MlflowException:
        raise TrackingError(
            f"{source} {uri}: no Databricks credentials found; set DATABRICKS_HOST and DATABRICKS_TOKEN (or run "
            "`databricks auth login`), or unset MLFLOW_TRACKING_URI to track to outputs/mlflow.db"
        ) from None
    finally:
        quiet.setLevel(level)


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


def sender_for(logger) -> Sender:
    """A Sender for BufferedMLFlowLogger `logger`, which says at exit what the server never took."""
    import atexit

    sender = Sender()
    atexit.register(lambda: sender.report_unsent(logger.store, logger.run_id))
    return sender


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

    def report_unsent(self, store: str | None, run_id: str | None) -> None:
        """One line on stderr, when the process ends, for what the tracking server never took."""
        if not (unsent := self.unsent()):
            return
        failing_since, reason = self.failing_since, self.reason
        if failing_since is None:  # no request failed yet: the first one is still unanswered
            failing_since = time.time() - (time.monotonic() - self.call_started)
            reason = "a request still unanswered"
        since = time.strftime("%H:%M:%S", time.localtime(failing_since))
        print(
            f"warning: the tracking server {store} has not answered since {since} ({reason}): "
            f"{', '.join(unsent)} of run {run_id} were not recorded there and are lost; the checkpoints are on "
            "disk",
            file=sys.stderr,
        )
