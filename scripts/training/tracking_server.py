"""What a run tracked to a server needs and a run tracked to the local sqlite store does not: the URI's checks before
the run starts (a plain-file store, a server that does not answer, Databricks without credentials, credentials inside
the URI) and the HTTP limits MLflow gets. scripts.train loads it when a tracking URI is given (MLFLOW_TRACKING_URI,
Azure ML's jobs, or `--trainer.logger.init_args.tracking_uri`):

    MLFLOW_TRACKING_URI=http://127.0.0.1:5000 python -m scripts.train fit --config configs/penguins.yaml
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from urllib.parse import unquote, urlsplit, urlunsplit

from scripts.training.tracking import TrackingError

# MLflow's own defaults retry a request for ~4 min (7 retries, backoff factor 2) of up to 120 s each. A run tracked to a
# server gets these unless the environment sets them: one request then takes at most 3 x 10 s plus ~6 s of backoff.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


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
