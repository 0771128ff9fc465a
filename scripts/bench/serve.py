"""Requests per second and p50 / p99 latency of the local inference server (azmlinfsrv running scripts/score.py, as
`make serve` runs it), PyTorch's pt2 program against ONNX Runtime, side by side in one run.

    python -m scripts.bench.serve                       # make bench-serve
    python -m scripts.bench.serve --requests 400 --rounds 5 --workers 2

Three requests: one penguin row, a batch of 100 rows, one bird photo (a 500x375 JPEG, efficientnet_lite0 at 224 px).
The networks are untrained (time does not depend on the weights), saved as `--register_model` saves a model. Every
variant has its own server (1 worker unless --workers), all started first; then rounds of sequential requests from
one client over loopback, the variants interleaved round by round so that a busy machine slows them alike. Printed:
the median over rounds of each round's requests/s, p50 and p99, and each backend's requests/s as a ratio to
PyTorch's measured in the same run; then the network alone in this process (no HTTP, no preprocessing), both backends
interleaved, which a busy machine blurs less. Needs .venv-serve (`make serve-env`).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from scripts.score import BACKEND
from scripts.serve import SERVE_VENV, server_command
from scripts.serving.mlflow_model import save_model

# The scoring script runs ONNX Runtime only now (the registered model is a torch-free pyfunc); the torch rows below are
# to be replaced by the pyfunc's and mlflow models serve's (issue 21, bench-serve).
BACKENDS = (BACKEND,)

PENGUIN = {"island": "Biscoe", "bill_length_mm": 50.4, "bill_depth_mm": 15.3, "flipper_length_mm": 200}
PENGUIN["body_mass_g"] = 5000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def penguin_model(folder: Path) -> Path:
    from datamodules.penguins import PenguinDataModule
    from lightning_modules.penguin_net import PenguinNet
    from scripts.serving.mlflow_model import serving_inputs

    data = PenguinDataModule()
    data.setup("fit")
    network = PenguinNet(3)
    save_model(network, data.splits["train"][0][:8], data.class_names, folder / "model", serving_inputs(data))
    return folder


def birds_model(folder: Path) -> Path:
    from lightning_modules.transfer_net import TransferNet

    network = TransferNet(2, weights="none")
    example = torch.randn(2, 3, 224, 224)
    save_model(network, example, ["chickens", "turkeys"], folder / "model", {"kind": "images", "image_size": 224})
    return folder


def photo() -> bytes:
    from torchvision.io import encode_jpeg

    generator = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 375, 500), dtype=torch.uint8, generator=generator)
    image = torch.nn.functional.avg_pool2d(image[None].float(), 5, stride=1, padding=2)[0].to(torch.uint8)
    return bytes(encode_jpeg(image, quality=90).numpy())  # smoothed noise: about the size of a real photo's JPEG


class Server:
    def __init__(self, folder: Path, backend: str, workers: int, threads: int, log: Path) -> None:
        self.port = free_port()
        env = {**os.environ, "SCORE_BACKEND": backend, "SCORE_THREADS": str(threads)}
        with log.open("w") as out:
            command = server_command(folder, self.port, workers, "127.0.0.1")
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while self.process.poll() is None and time.monotonic() < deadline:
            try:
                if self.request("GET", b"", None)[0] == 200:
                    return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"error: the server did not start: {log.read_text()[-2000:]}")

    def request(self, method: str, body: bytes, content_type: str | None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(method, "/score", body or None, {"Content-Type": content_type} if content_type else {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def one_round(server: Server, body: bytes, content_type: str, requests: int) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of `requests` sequential requests."""
    latencies = []
    start = time.perf_counter()
    for _ in range(requests):
        sent = time.perf_counter()
        status, answer = server.request("POST", body, content_type)
        latencies.append((time.perf_counter() - sent) * 1000)
        if status != 200:
            raise SystemExit(f"error: the server answered {status}: {answer[:300]!r}")
    elapsed = time.perf_counter() - start
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)]
    return requests / elapsed, latencies[len(latencies) // 2], p99


def model_only(folders: dict[str, Path], threads: int, rounds: int) -> list[str]:
    """The network alone in this process through scripts/score.py's Model (no HTTP, no preprocessing): median ms a call
    per round, best round, both backends interleaved; the lines to print."""
    from scripts.score import load_model

    os.environ["SCORE_THREADS"] = str(threads)
    inputs = {
        "penguins, 1 row": ("penguins", torch.randn(1, 5), 200),
        "penguins, 100 rows": ("penguins", torch.randn(100, 5), 200),
        "birds, 1 image 224 px": ("birds", torch.randn(1, 3, 224, 224), 10),
    }
    models = {(task, backend): load_model(folder, backend) for task, folder in folders.items() for backend in BACKENDS}
    lines = []
    for name, (task, batch, calls) in inputs.items():
        best: dict[str, float] = {}
        for backend in BACKENDS:
            models[task, backend].logits(batch)  # warm-up
        for _ in range(rounds):
            for backend in BACKENDS:
                times = []
                for _ in range(calls):
                    start = time.perf_counter()
                    models[task, backend].logits(batch)
                    times.append(time.perf_counter() - start)
                median = sorted(times)[len(times) // 2] * 1000
                best[backend] = min(best.get(backend, median), median)
        for backend in ("torch", "onnxruntime"):
            lines.append(
                f"  {name:24} {backend:12} {best[backend]:9.3f} ms a call   {best['torch'] / best[backend]:.2f}x torch"
            )
    return lines


def bench(requests: int = 300, image_requests: int = 60, rounds: int = 3, workers: int = 1, threads: int = 0) -> None:
    """
    Args:
        requests: penguin requests per round and variant.
        image_requests: bird photo requests per round and variant.
        rounds: rounds per variant, interleaved with the other variants'.
        workers: server processes (gunicorn workers) per server.
        threads: SCORE_THREADS, the threads of one request (0: one per core, each library's default).
    """
    if not (SERVE_VENV / "bin" / "python").is_file():
        sys.exit(f"error: {SERVE_VENV} is missing: run `make serve-env` first")
    cases = [
        ("penguins, 1 row", "penguins", json.dumps(PENGUIN).encode(), "application/json", requests),
        ("penguins, 100 rows", "penguins", json.dumps([PENGUIN] * 100).encode(), "application/json", requests),
        ("birds, 1 JPEG 500x375", "birds", photo(), "image/jpeg", image_requests),
    ]
    with tempfile.TemporaryDirectory() as temp:
        folders = {"penguins": penguin_model(Path(temp) / "penguins"), "birds": birds_model(Path(temp) / "birds")}
        servers = {
            (task, backend): Server(folder, backend, workers, threads, Path(temp) / f"{task}-{backend}.log")
            for task, folder in folders.items()
            for backend in BACKENDS
        }
        try:
            results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
            for name, task, body, content_type, count in cases:
                for backend in BACKENDS:
                    one_round(servers[task, backend], body, content_type, max(5, count // 10))  # warm-up
                for _ in range(rounds):
                    for backend in BACKENDS:
                        results.setdefault((name, backend), []).append(
                            one_round(servers[task, backend], body, content_type, count)
                        )
        finally:
            for server in servers.values():
                server.stop()
        network_lines = model_only(folders, threads, rounds)
    print(
        f"serving: azmlinfsrv with scripts/score.py, {workers} worker(s), {threads or os.cpu_count()} thread(s) a "
        f"request, sequential requests from one client over loopback, {rounds} rounds interleaved, median of rounds "
        f"({os.cpu_count()} cores)"
    )
    for name, *_ in cases:
        reference = statistics.median(r[0] for r in results[name, "torch"])
        for backend in ("torch", "onnxruntime"):
            rate, p50, p99 = (statistics.median(r[i] for r in results[name, backend]) for i in range(3))
            print(
                f"  {name:24} {backend:12} {rate:7.1f} req/s   p50 {p50:7.2f} ms   p99 {p99:7.2f} ms   "
                f"{rate / reference:.2f}x torch"
            )
    print(f"the network alone, in this process (scripts/score.py's Model.logits), best of {rounds} rounds:")
    print("\n".join(network_lines))


def main(argv: list[str] | None = None) -> None:
    from jsonargparse import auto_cli

    auto_cli(bench, args=argv)


if __name__ == "__main__":
    main()
