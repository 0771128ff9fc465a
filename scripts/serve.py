"""Serve a registered model or a checkpoint on this machine with Azure ML's own inference server, as an online endpoint
runs it: the scoring script scripts/score.py under azmlinfsrv, on http://127.0.0.1:5001/score.

    make serve MODEL=models:/penguins-classifier/1   # from the registry (MLFLOW_TRACKING_URI or outputs/mlflow.db)
    make serve MODEL=outputs/<exp>/<run>/checkpoints/best.ckpt ARGS="--port 5002"
    python -m scripts.serve models:/penguins-classifier/1 --port 5001 --workers 2

The model becomes a folder under outputs/serving/ (a registered version downloaded; a checkpoint saved as
`--register_model` saves it: the pyfunc with its ONNX network and torch-free preprocessing) and the server gets it as
AZUREML_MODEL_DIR, what Azure ML mounts in a deployment. The server runs in its own environment, .venv-serve (`make
serve-env`, pinned in scripts/serving/environment.yml, which is also the deployment's: no torch, no Lightning).
Ctrl-C stops it. Mistakes (a model that is not there, no .venv-serve, a bad option) are one line and exit 1.
"""

from __future__ import annotations

import contextlib
import errno
import filecmp
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from scripts.training.machine import usable_cores

SERVE_VENV = Path(".venv-serve")
SERVING = Path("outputs/serving")  # the model folders the server is given
REPO = Path(__file__).resolve().parents[1]


class ServeError(Exception):
    """A model, option or environment that cannot serve; the message names it and what to give."""


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else the local store scripts.train writes (outputs/mlflow.db): scripts/serving/
    model_registry.py, as every command that takes models:/ finds it."""
    from scripts.serving.model_registry import RegistryError
    from scripts.serving.model_registry import tracking_uri as registry_store

    try:
        return registry_store()
    except RegistryError as error:
        raise ServeError(str(error)) from None


def download(uri: str, target: Path) -> Path:
    """The registered model `uri` (models:/NAME/VERSION, models:/NAME@alias, runs:/RUN/model) in `target`."""
    import mlflow
    from mlflow.exceptions import MlflowException

    store = tracking_uri()
    mlflow.set_tracking_uri(store)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # the server's log follows
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as part:
            mlflow.artifacts.download_artifacts(uri, dst_path=part)
            shutil.rmtree(target, ignore_errors=True)
            Path(part).rename(target)
            Path(part).mkdir()  # for TemporaryDirectory's clean-up
    except MlflowException as error:
        message = str(error).splitlines()[0]
        raise ServeError(f"{uri}: not in the registry at {store} ({message}); check the name and version") from None
    finally:
        mlflow.set_tracking_uri(None)
    return target


def from_checkpoint(checkpoint: Path, target: Path) -> Path:
    """The checkpoint saved as a registered model would be (scripts/serving/mlflow_model.py) in `target`; kept while it
    is newer than the checkpoint and ships this repository's code as it is now."""
    import torch

    from scripts.export import load
    from scripts.serving.mlflow_model import ExportError, save_model, serving_inputs, test_inputs

    newer = (target / "MLmodel").is_file() and (target / "MLmodel").stat().st_mtime > checkpoint.stat().st_mtime
    if newer and ships_current_code(target):
        return target
    try:
        module, datamodule = load(checkpoint)
    except ExportError as error:
        raise ServeError(str(error)) from None
    try:
        inputs = serving_inputs(datamodule)
    except ExportError as error:
        raise ServeError(f"{checkpoint}: {error}") from None
    if inputs is None:
        raise ServeError(
            f"{checkpoint}: {type(datamodule).__name__} has no serving_kind; give it serving_kind, serving_state "
            "and serving_preprocess (datamodules/base.py says how)"
        )
    if module.input_shape is not None:  # torch.export needs shapes alone
        example = torch.randn(2, *module.input_shape, generator=torch.Generator().manual_seed(0))
    else:  # a checkpoint that does not say: the shape of a test batch of its data
        example = test_inputs(datamodule, batches=1)[0]
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as part:
        try:
            save_model(module.network, example, module.class_names, Path(part) / "model", inputs)
        except ExportError as error:
            raise ServeError(f"{checkpoint}: {error}") from None
        shutil.rmtree(target, ignore_errors=True)
        (Path(part) / "model").rename(target)
    return target


def ships_current_code(model: Path) -> bool:
    """Whether every file of the model's code (its preprocessing and pyfunc, copied when it was saved) is the
    repository's now: after an update of the repository, a model saved before would go on answering with the code
    it was saved with."""
    shipped = [path for path in (model / "code").rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    return bool(shipped) and all(
        (REPO / path.relative_to(model / "code")).is_file()
        and filecmp.cmp(path, REPO / path.relative_to(model / "code"), shallow=False)
        for path in shipped
    )


@contextlib.contextmanager
def new_folder(target: Path) -> Iterator[Path]:
    """`target`, made with its parents; the folders made here are removed again when the block fails (a model that is
    not there leaves no empty outputs/serving/<name>/<version> behind)."""
    made = next((folder for folder in [*reversed(target.parents), target] if not folder.exists()), None)
    target.mkdir(parents=True, exist_ok=True)
    try:
        yield target
    except BaseException:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise


def model_dir(model: str, serving: Path = SERVING) -> Path:
    """The AZUREML_MODEL_DIR of `model` (a registry URI, a checkpoint or a model folder), laid out as Azure ML lays out
    a deployment's model: outputs/serving/<name>/<version>/model/MLmodel."""
    if model.startswith(("models:/", "runs:/")):
        parts = [re.sub(r"[^\w.-]+", "-", part) for part in re.split(r"[/@]", model.split(":/", 1)[1]) if part]
        name, version = (parts[0], parts[1]) if model.startswith("models:/") and len(parts) > 1 else ("run", parts[0])
        with new_folder(serving / name / version) as target:
            download(model, target / "model")
        return target
    path = Path(model)
    if path.is_dir():
        if not (path / "MLmodel").is_file() and not list(path.glob("*/MLmodel")):
            raise ServeError(f"{path}: no MLmodel in this folder; give a registered model's folder, .ckpt or models:/")
        return path
    if path.suffix == ".ckpt" and path.is_file():
        with new_folder(serving / f"{path.parent.parent.name}-{path.stem}" / "1") as target:  # its run and name
            from_checkpoint(path, target / "model")
        return target
    raise ServeError(
        f"{model}: no such model; give models:/NAME/VERSION (fit --register_model NAME), a .ckpt, or a model folder"
    )


def server_command(
    folder: Path, port: int, workers: int, host: str, python: Path = SERVE_VENV / "bin" / "python"
) -> list[str]:
    return [
        str(python), "-m", "scripts.serving.inference_server", "--host", host, "--entry_script", "scripts/score.py",
        "--model_dir", str(folder.resolve()), "--port", str(port), "--worker_count", str(workers),
    ]  # fmt: skip


def serve(
    model: str,
    port: int = 5001,
    workers: int = 1,
    threads: int = 0,
    host: str = "127.0.0.1",
    prepare_only: bool = False,
    serving_dir: str = str(SERVING),
) -> None:
    """Starts the inference server on `model` and serves until stopped (Ctrl-C).

    Args:
        model: models:/NAME/VERSION (or models:/NAME@alias, runs:/RUN/model) from the MLflow registry at
            MLFLOW_TRACKING_URI or outputs/mlflow.db; a checkpoint (.ckpt) of `scripts.train fit`; or a model folder.
        port: the port of /score (and of the health probe GET /).
        workers: server processes (gunicorn workers), each with its own copy of the model; at most 2 x cores + 1.
        threads: threads of one request's computation (SCORE_THREADS); 0: one per core; at most the cores. With
            several workers, cores / workers.
        host: the address to listen on; 0.0.0.0 serves every network this machine is on (no key is asked).
        prepare_only: make the model folder, print its path and stop (what `python -m scripts.score` takes).
        serving_dir: where the model folders go.
    """
    check_numbers(port, workers, threads)
    backend = os.environ.get("SCORE_BACKEND", "onnxruntime")
    if backend != "onnxruntime":  # the scoring script would refuse it in each worker, after "serving" was printed
        raise ServeError(
            f"SCORE_BACKEND {backend!r}: the model's network runs with ONNX Runtime only (the serving environment "
            "has no torch); unset SCORE_BACKEND"
        )
    python = SERVE_VENV / "bin" / "python"
    if not prepare_only and not python.is_file():
        raise ServeError(f"{SERVE_VENV} is missing: run `make serve-env` (the inference server's environment) first")
    if not prepare_only:
        check_address(host, port)  # before the model is made and "serving" printed
    folder = model_dir(model, Path(serving_dir))
    if prepare_only:
        print(folder)
        return
    print(f"serving {folder} on http://{host}:{port}/score", flush=True)
    environment = {**os.environ, "SCORE_THREADS": str(threads)}
    os.execve(python, server_command(folder, port, workers, host, python), environment)  # Ctrl-C reaches the server


def check_numbers(port: int, workers: int, threads: int) -> None:
    """Refuses a port that is none, and workers or threads past what this machine runs: each worker is a process
    with its own copy of the model (gunicorn advises 2 x cores + 1), each thread one core's share of a request."""
    n = usable_cores()
    most_workers = 2 * n + 1
    for option, value, lowest, highest, what in (
        ("--port", port, 1, 65535, "a port 1-65535"),
        ("--workers", workers, 1, most_workers, f"1 to {most_workers} (2 x this machine's {n} cores + 1)"),
        ("--threads", threads, 0, n, f"0 (one per core) to {n} (this machine's cores)"),
    ):
        if not lowest <= value <= highest:
            raise ServeError(f"{option} {value}: give {what}")


def check_address(host: str, port: int) -> None:
    """Refuses an address the server cannot listen on: a port another server has, a host not of this machine. The
    server binds as gunicorn does (SO_REUSEADDR: a port left in TIME_WAIT is free)."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise ServeError(
                f"--port {port}: {host}:{port} is in use (another server?); give another --port, or stop that one"
            ) from None
        reason = getattr(error, "strerror", None) or str(error)
        raise ServeError(f"--host {host} --port {port}: cannot listen there ({reason})") from None


def main(args: list[str] | None = None) -> None:
    from scripts.training.cli_errors import run_cli

    run_cli(serve, "scripts.serve", (ServeError,), args)


if __name__ == "__main__":
    main()
