"""A built job, sweep or pipeline submitted to the workspace with this folder's code snapshot, and followed to its end
with --stream.

    python -m scripts.submit configs/penguins.yaml --compute cpu-cluster --stream true
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from scripts.azure_ml.errors import SubmitError, service_line
from scripts.azure_ml.workspace import not_signed_in


def follow(client, name: str) -> None:
    """Prints the job's logs until it ends; raises SubmitError unless it completed."""
    from azure.ai.ml.exceptions import JobException

    with contextlib.suppress(JobException):  # the SDK's word for a job that ended Failed: its status says it below
        client.jobs.stream(name)
    status = client.jobs.get(name).status
    status = str(getattr(status, "value", status))  # the SDK's JobStatus enum, or a plain string
    if status != "Completed":
        raise SubmitError(f"job {name} ended {status}; its logs are above and in the studio")
    print(f"job {name} completed")


def submit_job(client, job, code_holders: list, stream: bool, uploads: list[str] | None = None) -> str:
    """Submits `job` with this folder's code snapshot as the code of each of `code_holders` (the job, a sweep's
    trial, a pipeline's components), prints where to see it, follows it with `stream`; returns its name. `uploads`:
    what of this machine's it takes, as the user gave it (`--inputs+ OPTION=PATH`), for which the workspace's storage
    is asked first whether this machine reaches it (scripts/azure_ml/storage.py)."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    from scripts.azure_ml.code_snapshot import code_snapshot
    from scripts.azure_ml.storage import check_storage, upload_failure

    try:
        check_storage(client, uploads or [])
        with code_snapshot(Path.cwd()) as code:  # the SDK's own walk of the folder reads .venv's every file
            for holder in code_holders:
                holder.code = str(code)
            try:
                submitted = client.jobs.create_or_update(job)
            except ClientAuthenticationError:  # an HttpResponseError too: the one line below says to sign in
                raise
            except Exception as error:
                if line := upload_failure(error):  # the storage, not Azure ML, out of this machine's reach
                    raise SubmitError(line) from None
                if not isinstance(error, HttpResponseError):
                    raise
                # e.g. a compute, environment or data asset the workspace lacks
                raise SubmitError(f"Azure ML refused the job: {service_line(error)}") from None
        print(f"submitted {submitted.name}: {submitted.studio_url}")
        if stream:
            follow(client, submitted.name)
    except ClientAuthenticationError:
        raise SubmitError(not_signed_in("submit")) from None
    return submitted.name
