"""A fake HTTP transport that answers as Azure ML's REST API and a workspace's blob storage would, for MLClient in the
tests (no Azure is reachable here): jobs, pipeline jobs, components, environments, data assets, datastores, blobs, run
history, registered models' versions and online endpoints.

    from tests.azure.fake_azure import FakeAzureML, fake_client
"""

from __future__ import annotations

import base64
import io
import json
import re
import urllib.parse

import requests
import urllib3

WORKSPACE = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg"
    "/providers/Microsoft.MachineLearningServices/workspaces/ws"
)
STUDIO = "https://ml.azure.com/runs/fake"
BLOB_STORE = "https://account.blob.core.windows.net/container"  # the workspace's default datastore, in the fake
DISCOVERY = "https://westeurope.api.azureml.ms/discovery"
RUN_HISTORY = "https://westeurope.api.azureml.ms"


def http_response(method: str, url: str, status: int, body: bytes = b"", headers: dict | None = None):
    raw = urllib3.HTTPResponse(body=io.BytesIO(body), status=status, headers=headers or {}, preload_content=False)
    return requests.adapters.HTTPAdapter().build_response(requests.Request(method, url).prepare(), raw)


class FakeAzureML(requests.Session):
    """Answers the requests MLClient.jobs.create_or_update makes, as Azure ML's REST API and the workspace's blob
    storage would, and keeps them. The code snapshot is one the workspace already has (nothing of the repository
    goes to storage); files that are uploaded (an environment's build context) are kept in `blobs`."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str, dict | None]] = []
        self.blobs: dict[str, bytes] = {}  # path in the blob container -> content
        self.logs = {"logs/std_log.txt": b"Epoch 0: val_loss 0.9\ntest_acc: 0.9804\n"}  # a job's log, as a blob
        self.jobs: dict[str, dict] = {}  # name -> the job as PUT
        self.final_status = "Completed"  # what a followed job ends as
        self.details_asked = 0
        self.code_hashes: list[str] = []  # the content hashes the workspace was asked for a code snapshot by
        self.computes = {"cpu-cluster", "gpu-cluster", "cpu", "gpu"}  # the workspace's clusters (a pipeline checks)
        self.models = {"penguins-classifier": {"1", "2", "3"}, "birds-classifier": {"2"}}  # NAME -> its versions

    def request(self, method, url, data=None, **kwargs):
        if url.startswith(BLOB_STORE):
            return self.blob_request(method, url, data)
        path = url.split("?")[0].removeprefix("https://management.azure.com")
        sent = json.loads(data) if data else None
        self.requests.append((method, path, sent))
        code = {"properties": {"codeUri": f"{BLOB_STORE}/snapshot", "isAnonymous": True}}
        status, answer = 404, {"error": {"code": "NotFound", "message": "not in this fake"}}
        if method == "GET" and re.search(r"/codes/[^/]+/versions$", path):  # listed by the snapshot's hash
            self.code_hashes += urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("hash", [])
            status, answer = 200, {"value": [{"id": f"{path}/1", "name": "1", **code}]}
        elif method == "GET" and re.search(r"/codes/[^/]+/versions/1$", path):
            status, answer = 200, {"id": path, "name": "1", **code}
        elif method == "GET" and re.search(r"/computes/[^/]+$", path) and path.rsplit("/", 1)[1] in self.computes:
            cluster = {"computeType": "AmlCompute", "provisioningState": "Succeeded",
                       "properties": {"vmSize": "STANDARD_DS3_V2", "scaleSettings": {"maxNodeCount": 4}}}  # fmt: skip
            status, answer = 200, {"id": path, "name": path.rsplit("/", 1)[1], "location": "westeurope",
                                   "properties": cluster}  # fmt: skip
        elif method == "GET" and (found := re.search(r"/models/([^/]+)/versions/([^/]+)$", path)):
            name, version = found.groups()
            if version in self.models.get(name, ()):
                uri = f"azureml:/{WORKSPACE}/models/{name}/versions/{version}"
                model = {"modelType": "mlflow_model", "modelUri": uri}
                model["flavors"] = {"python_function": {"data": {"loader_module": "mlflow.pyfunc.model"}}}
                status, answer = 200, {"id": path, "name": version, "properties": model}
            else:  # Azure ML's answer for a version the workspace lacks
                message = f"Could not find asset with ID: azureml:{name}:{version}"
                status, answer = 404, {"error": {"code": "UserError", "message": message}}
        elif method == "GET" and path.endswith("/datastores/workspaceblobstore"):
            store = {"datastoreType": "AzureBlob", "accountName": "account", "containerName": "container"}
            store |= {
                "endpoint": "core.windows.net",
                "protocol": "https",
                "credentials": {"credentialsType": "AccountKey"},
            }
            status, answer = 200, {"id": path, "name": "workspaceblobstore", "properties": store}
        elif method == "POST" and path.endswith("/datastores/workspaceblobstore/listSecrets"):
            status, answer = 200, {"secretsType": "AccountKey", "key": base64.b64encode(bytes(64)).decode()}
        elif method == "PUT" and re.search(r"/(environments|data|components)/[^/]+/versions/[^/]+$", path):
            status, answer = 201, {"id": path, "name": path.rsplit("/", 1)[1], **sent}
        elif method == "PUT" and re.search(r"/jobs/[^/]+$", path):
            status, answer = 201, {"id": path, "name": path.rsplit("/", 1)[1], **sent}
            answer["properties"] |= {"status": "Starting", "services": {"Studio": {"endpoint": STUDIO}}}
            self.jobs[answer["name"]] = answer
        elif method == "GET" and re.search(r"/jobs/[^/]+$", path) and path.rsplit("/", 1)[1] in self.jobs:
            status, answer = 200, json.loads(json.dumps(self.jobs[path.rsplit("/", 1)[1]]))
            answer["properties"]["status"] = self.final_status if self.details_asked else "Running"
        elif method == "GET" and path.endswith("/workspaces/ws"):
            status, answer = 200, {"id": path, "name": "ws", "location": "westeurope", "properties": {
                "discoveryUrl": DISCOVERY, "workspaceId": "00000000-0000-0000-0000-00000000000a",
                "mlFlowTrackingUri": f"azureml://westeurope.api.azureml.ms/mlflow/v1.0{WORKSPACE}"}}  # fmt: skip
        elif method == "GET" and url == DISCOVERY:
            status, answer = 200, {"api": RUN_HISTORY, "catalog": RUN_HISTORY, "experimentation": RUN_HISTORY}
        elif method == "GET" and url.startswith(RUN_HISTORY) and path.endswith("/details"):
            self.details_asked += 1  # first Running with its log so far, then the job's end
            running = self.details_asked == 1
            status, answer = 200, {
                "runId": path.split("/runs/")[1].split("/")[0], "status": "Running" if running else self.final_status,
                "logFiles": {"user_logs/std_log.txt": f"{BLOB_STORE}/logs/std_log.txt?sas"},
            }  # fmt: skip
        return http_response(method, url, status, json.dumps(answer).encode(), {"Content-Type": "application/json"})

    def blob_request(self, method, url, data):
        name = url.split("?")[0].removeprefix(f"{BLOB_STORE}/")
        written = {"ETag": '"0x1"', "Last-Modified": "Mon, 23 Nov 2026 19:00:00 GMT"}
        if method == "PUT" and "comp=metadata" in url:  # marks an upload complete
            return http_response(method, url, 200, headers=written)
        if method == "PUT":
            self.blobs[name] = data.read() if hasattr(data, "read") else data
            return http_response(method, url, 201, headers=written)
        if method == "GET" and name in self.logs:
            return http_response(method, url, 200, self.logs[name], {"Content-Type": "text/plain"})
        return http_response(method, url, 404, headers={"x-ms-error-code": "BlobNotFound"})  # nothing uploaded before


AML_SCOPE = "https://ml.azure.com/.default"  # a pipeline's submission reads the audience of its token for this scope


def token_for(scopes) -> str:
    """An unsigned JWT for Azure ML's own scope (the SDK decodes it, unverified, for its audience), else a plain one."""
    if AML_SCOPE not in scopes:
        return "token"
    part = lambda data: base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")  # noqa: E731
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({'aud': 'https://ml.azure.com', 'tid': 'tenant'})}."


class FakeCredential:
    def get_token(self, *scopes, **options):
        from azure.core.credentials import AccessToken

        return AccessToken(token_for(scopes), 4102444800)

    def get_token_info(self, *scopes, options=None):
        from azure.core.credentials import AccessTokenInfo

        return AccessTokenInfo(token_for(scopes), 4102444800)


def fake_client(azure: FakeAzureML, credential=None):
    from azure.ai.ml import MLClient
    from azure.core.pipeline.transport import RequestsTransport

    return MLClient(credential or FakeCredential(), "00000000-0000-0000-0000-000000000000", "rg", "ws",
                    transport=RequestsTransport(session=azure))  # fmt: skip


STORAGE_HOST = "account.blob.core.windows.net"


def storage_failure(kind: str, url: str) -> Exception:
    """What requests raises for a request to the workspace's storage that this machine cannot make, built as urllib3
    and requests build it: `dns` (the name does not resolve), `firewall` (the connection times out)."""
    import socket

    from urllib3.connection import HTTPSConnection
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, NameResolutionError

    connection = HTTPSConnection(STORAGE_HOST, 443, timeout=10)
    if kind == "dns":
        reason = NameResolutionError(STORAGE_HOST, connection, socket.gaierror(-2, "Name or service not known"))
        return requests.exceptions.ConnectionError(MaxRetryError(None, url, reason))
    reason = ConnectTimeoutError(connection, f"Connection to {STORAGE_HOST} timed out. (connect timeout=10)")
    return requests.exceptions.ConnectTimeout(MaxRetryError(None, url, reason))


class UnreachableStorage(FakeAzureML):
    """The workspace answers, its storage does not: every request to it fails as `failure` (storage_failure's dns or
    firewall), or is refused by the storage account's network rules (`network rules`: a private endpoint's or its
    firewall's 403 AuthorizationFailure). `storage_requests` counts them; `has_code` False: the workspace lacks the
    code snapshot, which the SDK then uploads."""

    def __init__(self, failure: str, has_code: bool = True) -> None:
        super().__init__()
        self.failure, self.has_code, self.storage_requests = failure, has_code, 0

    def request(self, method, url, data=None, **kwargs):
        path, answer = url.split("?")[0], None
        if not self.has_code and method == "GET" and re.search(r"/codes/[^/]+/versions$", path):
            answer = {"value": []}
        elif not self.has_code and method == "POST" and path.endswith("/startPendingUpload"):  # where to upload it
            blob = f"{BLOB_STORE}/LocalUpload/snapshot"
            answer = {"pendingUploadType": "TemporaryBlobReference", "blobReferenceForConsumption": {
                "blobUri": blob, "credential": {"credentialType": "SAS", "sasUri": f"{blob}?sig=s"}}}  # fmt: skip
        if answer is None:
            return super().request(method, url, data, **kwargs)
        return http_response(method, url, 200, json.dumps(answer).encode(), {"Content-Type": "application/json"})

    def blob_request(self, method, url, data):
        self.storage_requests += 1
        if self.failure == "network rules":
            body = b"<Error><Code>AuthorizationFailure</Code><Message>This request is not authorized.</Message></Error>"
            return http_response(method, url, 403, body, {"x-ms-error-code": "AuthorizationFailure"})
        raise storage_failure(self.failure, url)
