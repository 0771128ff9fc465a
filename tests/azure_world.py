"""A test world as strict as Azure ML's, for the tests that run jobs as Azure ML would.

- Nodes share no disk: each node is its own copy of the job's code (what `.amlignore` lets Azure ML upload), run
  from that folder with its relative `outputs/`, so nothing a rank writes is seen by a rank of another node.
- Processes are started with exactly the variables Azure ML sets and no launcher such as torchrun or mpirun: each is
  forked from the tests' warm launcher (tests/warm_launcher.py), as `python -m` starts it, for the `pytorch`
  distribution MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK (per node), RANK, LOCAL_RANK (per process); for `mpi`,
  Open MPI's OMPI_COMM_WORLD_* and Azure ML's AZ_BATCH_MASTER_NODE / AZ_BATCHAI_MPI_MASTER_NODE.
- Tracking is a real `mlflow server` behind a proxy that answers as Azure ML's tracking does: the routes Azure ML's
  MLflow does not serve (MLflow 3's logged models, traces) are 404, and the job's run exists before the job starts
  (MLFLOW_TRACKING_URI and MLFLOW_RUN_ID in every process).
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from tests import warm_launcher
from tests.conftest import REPO, free_port

# What Azure ML's MLflow answers 404 to (MLflow 3's logged-model and trace routes; Azure SDK for Python issue 44896).
AZURE_LACKS = re.compile(r"^/(ajax-api|api)/[0-9.]+/mlflow/(logged-models|traces)")
# Variables a launcher of the test's own machine could leave behind: none of them reaches an Azure ML process.
LAUNCH_VARIABLES = re.compile(r"^(MASTER_|WORLD_SIZE|NODE_RANK|RANK|LOCAL_|GROUP_|TORCHELASTIC|OMPI_|PMIX|AZ_|MLFLOW_)")


def node_checkouts(root: Path, nodes: int) -> list[Path]:
    """One copy of the job's code per node, as Azure ML gives each node its own: the repository less `.amlignore`."""
    patterns = [line.strip().rstrip("/") for line in (REPO / ".amlignore").read_text().splitlines()]
    ignore = shutil.ignore_patterns(*(p for p in patterns if p and not p.startswith("#")))
    folders = []
    for node in range(nodes):
        folder = root / f"node{node}"
        shutil.copytree(REPO, folder, ignore=ignore)
        folders.append(folder)
    return folders


def azure_variables(distribution: str, node: int, local_rank: int, nodes: int, per_node: int, port: int) -> dict:
    """What Azure ML sets in one process of a job with `nodes` x `per_node` processes (the first node at loopback)."""
    rank, size = node * per_node + local_rank, nodes * per_node
    if distribution == "pytorch":
        return {
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(size), "NODE_RANK": str(node),
            "RANK": str(rank), "LOCAL_RANK": str(local_rank),
        }  # fmt: skip
    if distribution == "mpi":
        variables = {
            "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(per_node),
            "OMPI_COMM_WORLD_NODE_RANK": str(node), "AZ_BATCHAI_MPI_MASTER_NODE": "127.0.0.1",
        }  # fmt: skip
        if nodes > 1:
            variables["AZ_BATCH_MASTER_NODE"] = f"127.0.0.1:{port}"
        return variables
    raise ValueError(distribution)


@dataclass
class Process:
    node: int
    local_rank: int
    returncode: int
    stdout: str
    stderr: str


def start_job(
    folders: list[Path], distribution: str, per_node: int, args: list[str], tracking: dict | None = None
) -> list[tuple[int, int, warm_launcher.Command]]:
    """Starts `python -m scripts.train ARGS` in every process of a job over these node folders, as Azure ML does: each
    process is forked from the tests' warm launcher (tests/warm_launcher.py), whose children import the project's
    code from their own working directory, the node's copy."""
    port = free_port()
    base = {key: value for key, value in os.environ.items() if not LAUNCH_VARIABLES.match(key)}
    started = []
    for node, folder in enumerate(folders):
        for local_rank in range(per_node):
            env = {**base, **azure_variables(distribution, node, local_rank, len(folders), per_node, port)}
            env |= tracking or {}
            started.append((node, local_rank, warm_launcher.start("scripts.train", args, folder, env)))
    return started


def wait_job(started: list[tuple[int, int, warm_launcher.Command]], timeout_s: int = 600) -> list[Process]:
    finished = []
    for node, local_rank, process in started:
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for _, _, other in started:
                other.kill()
            raise
        finished.append(Process(node, local_rank, process.returncode, out, err))
    return finished


def run_job(
    folders: list[Path], distribution: str, per_node: int, args: list[str], tracking: dict | None = None
) -> list[Process]:
    """`python -m scripts.train ARGS` in every process of a job over these node folders, to its end."""
    return wait_job(start_job(folders, distribution, per_node, args, tracking))


class AzureTrackingProxy(http.server.ThreadingHTTPServer):
    """Forwards every request to a real MLflow server, except the routes Azure ML's tracking lacks: 404 there."""

    daemon_threads = True

    def __init__(self, backend: str) -> None:
        self.backend = backend.removeprefix("http://")
        self.refused: list[str] = []  # the paths answered 404, for the tests to see what the code asked for
        self.authorizations: set[str] = set()  # Authorization headers received, for the tests of credentials
        super().__init__(("127.0.0.1", 0), ProxyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: AzureTrackingProxy
    protocol_version = "HTTP/1.1"

    def forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "Authorization" in self.headers:
            self.server.authorizations.add(self.headers["Authorization"])
        if AZURE_LACKS.match(self.path):
            self.server.refused.append(self.path)
            answer = json.dumps({"error_code": "ENDPOINT_NOT_FOUND", "message": "Not Found"}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            return
        connection = http.client.HTTPConnection(self.server.backend, timeout=120)
        headers = {key: value for key, value in self.headers.items() if key.lower() not in ("host", "connection")}
        connection.request(self.command, self.path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        connection.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = forward

    def log_message(self, *args) -> None:
        pass
