"""The registered model (an MLflow pyfunc) in every runtime that serves it, side by side in one run: requests per
second and p50 / p99 latency of the local inference server (azmlinfsrv running scripts/score.py, as `make serve` and
`--scoring script` deployments run it) and of `mlflow models serve` (what Azure ML's no-code deployments and most MLflow
users run), the pyfunc called in this process, and rows per second of Spark's spark_udf against scripts.score's batch
scoring over the same CSV.

    python -m scripts.bench.serve                       # make bench-serve
    python -m scripts.bench.serve --requests 400 --rounds 5 --workers 2 --spark_rows 50000

Three requests: one penguin row, a batch of 100 rows, one bird photo (a 500x375 JPEG, efficientnet_lite0 at 224 px).
The networks are untrained (time does not depend on the weights), saved as `--register_model` saves a model. Both
servers run in the serving environment (--serve_python, default .venv-serve: `make serve-env`), 1 worker unless
--workers, all started first; then rounds of sequential requests from one client over loopback, the variants
interleaved round by round so that a busy machine slows them alike. Printed: each round's requests/s, p50 and p99 as
it is measured (`round 1, penguins, 1 row, mlflow models serve: 55.6 req/s, p50 20.24 ms, p99 20.24 ms`), then the
median over rounds of each, and each variant's requests/s as a ratio to the inference server's measured in the same
run.
The pyfunc in-process is mlflow.pyfunc.load_model(...).predict(DataFrame), no HTTP. Spark: --spark_rows penguin rows in
one CSV, scored by `scripts.spark score` (spark_udf, a session on --master started before the clock) and by
scripts.score's batch scoring (python -m scripts.score MODEL CSV) in this process, alternating, each round's rows/s
printed as it is measured, then the best of the rounds. A step that fails ends the bench in one line naming it, after
every figure measured before it (scripts/bench/report.py).
"""

from __future__ import annotations

import base64
import http.client
import importlib  # extra: spark
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

from scripts.bench.report import BenchError, Report, error_line
from scripts.serve import SERVE_VENV, server_command
from scripts.serving.mlflow_model import save_model, serving_inputs

PENGUIN = {"island": "Biscoe", "bill_length_mm": 50.4, "bill_depth_mm": 15.3, "flipper_length_mm": 200}
PENGUIN["body_mass_g"] = 5000
VARIANTS = ("azmlinfsrv + score.py", "mlflow models serve", "pyfunc in-process")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def penguin_model(folder: Path) -> Path:
    from datamodules.penguins import PenguinDataModule
    from lightning_modules.penguin_net import PenguinNet

    data = PenguinDataModule()
    data.setup("fit")
    save_model(PenguinNet(3), data.splits["train"][0][:8], data.class_names, folder / "model", serving_inputs(data))
    return folder / "model"


def birds_model(folder: Path) -> Path:
    from datamodules.image_folder import ImageFolderDataModule
    from lightning_modules.transfer_net import TransferNet

    inputs = serving_inputs(ImageFolderDataModule("unused", image_size=224))
    save_model(TransferNet(2, weights="none"), torch.randn(2, 3, 224, 224), ["chickens", "turkeys"], folder / "model",
               inputs)  # fmt: skip
    return folder / "model"


def photo() -> bytes:
    from torchvision.io import encode_jpeg

    generator = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 375, 500), dtype=torch.uint8, generator=generator)
    image = torch.nn.functional.avg_pool2d(image[None].float(), 5, stride=1, padding=2)[0].to(torch.uint8)
    return bytes(encode_jpeg(image, quality=90).numpy())  # smoothed noise: about the size of a real photo's JPEG


class Server:
    """A server on a free loopback port; `path` is where it scores, GET `ready` answers once it has loaded."""

    def __init__(self, port: int, command: list[str], path: str, ready: str, threads: int, log: Path) -> None:
        self.port, self.path = port, path
        # PATH: mlflow models serve starts `uvicorn` by name, from the serving environment's bin folder.
        env = {**os.environ, "SCORE_THREADS": str(threads), "PATH": f"{Path(command[0]).parent}:{os.environ['PATH']}"}
        with log.open("w") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while self.process.poll() is None and time.monotonic() < deadline:
            try:
                if self.request("GET", ready, b"", None)[0] == 200:
                    return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise BenchError(f"it did not start: {error_line(log.read_text())}")

    def request(self, method: str, path: str, body: bytes, content_type: str | None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(method, path, body or None, {"Content-Type": content_type} if content_type else {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)  # mlflow models serve runs uvicorn in a child process of its own
            self.process.wait(timeout=30)


def inference_server(model: Path, python: Path, workers: int, threads: int, log: Path) -> Server:
    port = free_port()
    return Server(port, server_command(model, port, workers, "127.0.0.1", python), "/score", "/score", threads, log)


def mlflow_server(model: Path, python: Path, workers: int, threads: int, log: Path) -> Server:
    port = free_port()
    command = [str(python), "-m", "mlflow", "models", "serve", "-m", str(model), "--env-manager", "local",
               "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]  # fmt: skip
    return Server(port, command, "/invocations", "/ping", threads, log)


def one_round(send, requests: int) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of `requests` sequential calls of send()."""
    latencies = []
    start = time.perf_counter()
    for _ in range(requests):
        sent = time.perf_counter()
        send()
        latencies.append((time.perf_counter() - sent) * 1000)
    elapsed = time.perf_counter() - start
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)]
    return requests / elapsed, latencies[len(latencies) // 2], p99


def http_sender(server: Server, body: bytes, content_type: str):
    def send() -> None:
        status, answer = server.request("POST", server.path, body, content_type)
        if status != 200:
            raise BenchError(f"the server answered {status}: {answer[:300]!r}")

    return send


def cases(image: bytes) -> list[tuple[str, str, dict, dict]]:
    """(name, task, scripts/score.py's request, MLflow's request) per case; `requests` is filled in by bench."""
    rows = [PENGUIN] * 100
    encoded = base64.b64encode(image).decode()
    return [
        ("penguins, 1 row", "penguins", {"json": PENGUIN}, {"dataframe_records": [PENGUIN]}),
        ("penguins, 100 rows", "penguins", {"json": rows}, {"dataframe_records": rows}),
        ("birds, 1 JPEG 500x375", "birds", {"jpeg": image}, {"dataframe_records": [{"image": encoded}]}),
    ]


# extra: spark
def spark_scoring(
    report: Report, models: dict[str, Path], folder: Path, rows: int, rounds: int, master: str
) -> list[str]:
    """Rows/s of spark_udf (scripts.spark score) and of scripts.score's batch scoring over one CSV of `rows` penguins,
    each round's printed as it is measured; the lines of their best to print."""
    import pandas as pd

    # Imported here, each a step: a module moved away (as LocalSpark once was) is one line after the servers' figures.
    scoring, spark_score, spark_session = (
        report.step(f"importing {module}", importlib.import_module, module)
        for module in ("scripts.score", "scripts.spark.score", "scripts.spark.session")
    )
    csv = folder / "penguins.csv"
    pd.DataFrame([PENGUIN] * rows).to_csv(csv, index=False)
    model_folder = str(models["penguins"])

    def rows_per_second(run, *args) -> float:
        start = time.perf_counter()
        scored = run(*args)
        if scored != rows:
            raise BenchError(f"it scored {scored} rows of {rows}")
        return rows / (time.perf_counter() - start)

    local = report.step(f"starting Spark on {master}", spark_session.LocalSpark, master)
    best: dict[str, float] = {}
    try:
        model = report.step("loading the penguin model for scripts.score", scoring.Model, models["penguins"])
        # warm-up: the Python workers, the model's copy
        report.step(f"spark_udf, {master}, warm-up", spark_score.score, local.session, model_folder, str(csv))
        runs = {
            f"spark_udf, {master}": lambda: spark_score.score(local.session, model_folder, str(csv))["rows"],
            "scripts.score (1 process)": lambda: len(scoring.score_files(model, csv, 1000)),
        }
        for round_ in range(1, rounds + 1):
            for name, run in runs.items():
                rate = report.measured(
                    f"round {round_}, {name}", lambda rate: f"{rate:.0f} rows/s", rows_per_second, run
                )
                best[name] = max(best.get(name, 0), rate)
    finally:
        local.stop()
    spark, ours = best[f"spark_udf, {master}"], best["scripts.score (1 process)"]
    return [
        f"  {'scripts.score (1 process)':28} {ours:9.0f} rows/s",
        f"  {'spark_udf, ' + master:28} {spark:9.0f} rows/s   {spark / ours:.2f}x scripts.score",
    ]


# end extra: spark


def bench(
    requests: int = 300,
    image_requests: int = 60,
    rounds: int = 3,
    workers: int = 1,
    threads: int = 0,
    serve_python: str = str(SERVE_VENV / "bin" / "python"),
    spark_rows: int = 20000,  # extra: spark
    master: str = "local[2]",  # extra: spark
) -> None:
    """
    Args:
        requests: penguin requests per round and variant.
        image_requests: bird photo requests per round and variant.
        rounds: rounds per variant, interleaved with the other variants'.
        workers: server processes per server.
        threads: SCORE_THREADS, ONNX Runtime's threads of one request (0: one per core).
        serve_python: the serving environment's Python, which runs both servers (`make serve-env` builds it).
        spark_rows: penguin rows in the CSV that Spark and scripts.score score (0: no Spark row)  # extra: spark
        master: the Spark row's master (local-cluster[2,1,1024] puts each task in a process)  # extra: spark
    """
    from scripts.serve import ServeError, check_numbers

    try:
        check_numbers(5001, workers, threads)  # the server's own bounds: workers and threads this machine runs
    except ServeError as error:
        sys.exit(f"error: {error}")
    bounds = [("--requests", requests, 1, 100_000), ("--rounds", rounds, 1, 100),
              ("--image_requests", image_requests, 1, 100_000)]  # fmt: skip
    bounds.append(("--spark_rows", spark_rows, 0, 10_000_000))  # extra: spark
    for option, value, lowest, highest in bounds:
        if not lowest <= value <= highest:
            sys.exit(f"error: {option} {value}: give {lowest} to {highest}")
    python = Path(serve_python)
    if not python.is_file():
        sys.exit(f"error: {python} is missing: run `make serve-env` first (or give --serve_python)")
    import mlflow
    import pandas as pd

    report = Report("serve")
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        models = {
            "penguins": report.step("saving the penguin model", penguin_model, temp / "penguins"),
            "birds": report.step("saving the bird model", birds_model, temp / "birds"),
        }
        servers = {}
        try:
            for task, model in models.items():
                for variant, start in ((VARIANTS[0], inference_server), (VARIANTS[1], mlflow_server)):
                    log = temp / f"{task}-{start.__name__}.log"
                    servers[task, variant] = report.step(
                        f"starting {variant} for {task}", start, model, python, workers, threads, log
                    )  # fmt: skip
            os.environ["SCORE_THREADS"] = str(threads)
            loaded = {
                task: report.step(f"loading the {task} pyfunc", mlflow.pyfunc.load_model, str(model))
                for task, model in models.items()
            }
            image = photo()
            results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
            for name, task, ours, theirs in cases(image):
                count = image_requests if task == "birds" else requests
                if "jpeg" in ours:
                    body, content_type = ours["jpeg"], "image/jpeg"
                    frame = pd.DataFrame({"image": [image]})
                else:
                    body, content_type = json.dumps(ours["json"]).encode(), "application/json"
                    frame = pd.DataFrame(ours["json"] if isinstance(ours["json"], list) else [ours["json"]])
                senders = {
                    VARIANTS[0]: http_sender(servers[task, VARIANTS[0]], body, content_type),
                    VARIANTS[1]: http_sender(
                        servers[task, VARIANTS[1]], json.dumps(theirs).encode(), "application/json"
                    ),  # fmt: skip
                    VARIANTS[2]: lambda model=loaded[task], frame=frame: model.predict(frame),
                }
                for variant, send in senders.items():
                    report.step(f"{name}, {variant}, warm-up", one_round, send, max(5, count // 10))
                for round_ in range(1, rounds + 1):
                    for variant, send in senders.items():
                        measured = report.measured(
                            f"round {round_}, {name}, {variant}",
                            lambda r: f"{r[0]:.1f} req/s, p50 {r[1]:.2f} ms, p99 {r[2]:.2f} ms", one_round, send, count,
                        )  # fmt: skip
                        results.setdefault((name, variant), []).append(measured)
        finally:
            for server in servers.values():
                server.stop()
        print(
            f"serving the registered pyfunc: {workers} worker(s) a server, {threads or os.cpu_count()} thread(s) a "
            f"request, sequential requests from one client over loopback, {rounds} rounds interleaved, median of "
            f"rounds ({os.cpu_count()} cores)",
            flush=True,  # before Spark's part starts
        )
        for name, *_ in cases(b""):
            reference = statistics.median(r[0] for r in results[name, VARIANTS[0]])
            for variant in VARIANTS:
                rate, p50, p99 = (statistics.median(r[i] for r in results[name, variant]) for i in range(3))
                print(
                    f"  {name:22} {variant:22} {rate:7.1f} req/s   p50 {p50:7.2f} ms   p99 {p99:7.2f} ms   "
                    f"{rate / reference:.2f}x azmlinfsrv",
                    flush=True,
                )
        # extra: spark
        if spark_rows:
            lines = spark_scoring(report, models, temp, spark_rows, rounds, master)
            print(f"batch scoring of {spark_rows} penguin rows from one CSV, best of {rounds} rounds:")
            print("\n".join(lines))
        # end extra: spark


def main(argv: list[str] | None = None) -> None:
    from jsonargparse import auto_cli

    auto_cli(bench, args=argv)


if __name__ == "__main__":
    main()
