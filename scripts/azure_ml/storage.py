"""The workspace's storage, where a submission uploads what it takes from this machine (a local --inputs+, a pipeline's
local --data, the code): asked once, before the SDK uploads anything, whether this machine reaches it, and a failed
upload named as what it is, this machine not reaching the storage, not as Azure ML's refusal.

    python -m scripts.submit configs/table.yaml --compute cpu-cluster --inputs+ data.init_args.csv_path=my.csv

azure-ai-ml uploads through an azure-storage-blob client it makes itself, with that library's default retry policy
(three connection retries, 15 s and more apart, for each of its requests) and no public way to change it: where the
storage cannot be reached (DNS, a firewall, a private endpoint this machine is outside of) a submission of a local
file ended after ~100 s in 152 lines and three tracebacks, and a pipeline's in `Azure ML refused the pipeline: ` and
an ANSI colour code. One HEAD request, with no retry, tells first (`check_storage`).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from scripts.azure_ml.errors import SubmitError, without_ansi

WORKSPACE_STORE = "workspaceblobstore"  # the datastore azure-ai-ml uploads local inputs and code to
PROBE_TIMEOUT_S = (10, 10)  # connect, read: a firewall that drops the connection is told within seconds
NETWORK = "check this machine's network: DNS, a firewall, or a private endpoint it is outside of"
FAILED = "the upload to the workspace's storage failed"
IN_AZURE = (
    "or give data already in Azure: a registered data asset azureml:NAME:VERSION (python -m scripts.assets data NAME "
    "PATH --version N, where the storage can be reached) or a datastore URI"
)


def storage_url(client) -> str:
    """https://ACCOUNT.blob.core.windows.net/CONTAINER of the workspace's default blob datastore."""
    store = client.datastores.get(WORKSPACE_STORE)
    return f"{store.protocol}://{store.account_name}.blob.{store.endpoint}/{store.container_name}"


def check_storage(client, uploads: list[str], advice: str = IN_AZURE) -> None:
    """SubmitError naming the storage, the reason and what to check when this machine cannot reach the workspace's
    storage and the submission has something of this machine's to upload (`uploads`: each as the user gave it, e.g.
    `--inputs+ data.init_args.csv_path=my.csv`). One request, without retries; any HTTP answer but a network rule's
    refusal (AuthorizationFailure: the storage's firewall or a private endpoint) is a storage that takes the upload.
    `advice`: the line's way around it."""
    if not uploads:
        return
    import requests

    url = storage_url(client)
    account = url.rsplit("/", 1)[0]
    try:
        answer = requests.head(url, params={"restype": "container"}, timeout=PROBE_TIMEOUT_S, allow_redirects=False)
    except requests.RequestException as error:
        raise SubmitError(unreachable(account, connection_reason(error), uploads[0], advice)) from None
    if answer.headers.get("x-ms-error-code") == "AuthorizationFailure":  # the storage account's network rules
        reason = "its network rules refuse this machine: AuthorizationFailure"
        raise SubmitError(unreachable(account, reason, uploads[0], advice)) from None


def unreachable(account: str, reason: str, upload: str, advice: str) -> str:
    return (
        f"this machine cannot reach the workspace's storage, {account} ({reason}), where {upload} would be uploaded; "
        f"{NETWORK}; {advice}"
    )


def connection_reason(error: BaseException) -> str:
    """Why a connection failed, in one short line: urllib3's reason (name resolution, refused, timed out) without the
    connection object's repr."""
    reason = error
    for _ in range(4):  # requests' ConnectionError holds urllib3's MaxRetryError, which holds the reason
        inner = getattr(reason, "reason", None) or next(iter(getattr(reason, "args", ())), None)
        if not isinstance(inner, BaseException):
            break
        reason = inner
    # urllib3's reasons are (the connection, the message): the message alone
    text = next((arg for arg in reversed(getattr(reason, "args", ())) if isinstance(arg, str)), str(reason))
    lines = without_ansi(text).strip().splitlines() or [type(reason).__name__]
    return re.sub(r"^<[^>]*>: |^HTTPS?Connection\([^)]*\): ", "", lines[0])


def upload_failure(error: BaseException) -> str | None:
    """The one line for a submission whose upload to the storage failed on the way there (azure-core's
    ServiceRequestError, anywhere in the SDK's chain of exceptions: it reports it inside a validation error), or was
    refused by the storage's network rules; None for any other error."""
    from azure.core.exceptions import HttpResponseError, ServiceRequestError

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ServiceRequestError):
            text = without_ansi(str(getattr(error, "message", None) or error))
            host = re.search(r"host='([^']+)'", text)
            where = f"https://{host.group(1)}" if host else "the workspace's storage"
            reason = connection_reason(getattr(error, "inner_exception", None) or error)
            return f"{FAILED}: this machine cannot reach {where} ({reason}); {NETWORK}"
        response = getattr(error, "response", None)
        if isinstance(error, HttpResponseError) and getattr(error, "error_code", None) == "AuthorizationFailure":
            where = urlsplit(str(getattr(getattr(response, "request", None), "url", "") or "")).netloc
            return (
                f"{FAILED}: {where or 'the storage'}'s network rules refuse this machine (AuthorizationFailure); "
                + NETWORK
            )
        error = error.__cause__ or error.__context__
    return None
