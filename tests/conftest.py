"""Shared test fixtures: the repository root, a runner for the real CLI in a subprocess, a loopback HTTP server, one
real MLflow server per session and, in front of it, one that answers as Azure ML's tracking does; what several modules
read made once a test run (once_per_run: the fits they compare with or serve)."""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch
from torchvision.io import write_jpeg, write_png

from datamodules.image_folder import ImageFolderDataModule
from datamodules.mnist import FILES as MNIST_FILES
from tests import warm_launcher

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
MNIST = SHARED_DATA / "mnist"  # the four original idx .gz files, where CI has them
needs_mnist = pytest.mark.skipif(
    not all((MNIST / f"{name}.gz").is_file() for name in MNIST_FILES),
    reason=f"needs the four MNIST idx .gz files in {MNIST} (CI has them)",
)
CLASSES = ("chickens", "turkeys")  # the bird folders tests make
# File names a CSV line cannot carry bare: a carriage return, a line feed, a comma and quotes; bytes that are not UTF-8
# (a Latin-1 é); and a name that holds the escape's own text, which must come back as itself.
AWKWARD_NAMES = [b"a\rb.png", b"line\nbreak.png", b'comma, "quoted".png', b"caf\xe9.png", b"back\\xe9slash.png"]
# An environment whose stdout refuses what is not UTF-8.
STRICT_UTF8 = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"}
# Room the temporary files of a `make test` need at most at once on a tmpfs (a passed test's are deleted as it ends:
# pyproject.toml's tmp_path_retention_policy); a smaller /dev/shm leaves them on the disk.
MEMORY_TMP_GB = 4


def run_module(
    module: str, *args: str, env: dict | None = None, timeout: int = 600, launcher: list[str] = ()
) -> subprocess.CompletedProcess:
    """`[launcher] python -m <module> args...` from the repository root, as a user types it: a process of its own,
    forked from a warm launcher that has imported torch, Lightning and MLflow (tests/warm_launcher.py) unless another
    program starts it or it is Spark's (whose JVM and workers are not forked from the launcher)."""
    if launcher or module.startswith("scripts.spark"):
        return subprocess.run(
            [*launcher, sys.executable, "-m", module, *map(str, args)],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
    return warm_launcher.run(module, [str(arg) for arg in args], REPO, env, timeout)


def original_name(cell: str) -> str:
    """The file name a CSV cell of predict or scripts.score stands for: each `\\xNN` is the byte NN
    (datamodules/printable.py printable_name)."""
    import re

    return os.fsdecode(re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes.fromhex(m[1].decode()), cell.encode()))


def own_tmpdir(tmp_path: Path, env: dict | None = None) -> dict[str, str]:
    """`env` (default: this process's) with TMPDIR a folder of the test's: what a launcher leaves in the temporary
    folder (torchrun, TorchDistributor's too, makes a torchelastic_* log folder there and never removes it) goes with
    tmp_path, not into the machine's /tmp."""
    folder = tmp_path / "tmp"
    folder.mkdir(exist_ok=True)
    return {**(os.environ if env is None else env), "TMPDIR": str(folder)}


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def train_cli(tmp_path):
    """Runs `python -m scripts.train SUBCOMMAND ...` with outputs (MLflow store, checkpoints) under tmp_path."""

    def run(subcommand: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return run_module(
            "scripts.train", subcommand, *args, "--trainer.default_root_dir", str(tmp_path / "outputs"), env=env
        )

    return run


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def serve():
    """Serves folders over loopback HTTP, as a download mirror would; yields a function folder -> base URL."""
    servers = []

    def start(folder: Path) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(folder)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def pytest_configure(config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller: its workers and their processes inherit both
        temporary_files_in_memory()
        # A folder every process of this test run sees: `make test` runs pytest-xdist workers (one file's tests in
        # one worker, `--dist loadfile`), and what one session fixture makes for all of them (the MLflow server) is
        # found here.
        os.environ["TESTS_SHARED_DIR"] = tempfile.mkdtemp(prefix="tests-shared-")


def temporary_files_in_memory() -> None:
    """TMPDIR (pytest's tmp_path and every test process's temporary files) on the machine's tmpfs, /dev/shm, where it
    has MEMORY_TMP_GB free and TMPDIR is not set already. Nearly every test fit makes a new sqlite MLflow store in an
    outputs folder of its own, and each sqlite commit waits for the disk: 1-5 s of a ~9 s penguin fit on a VM's disk
    (docs/measured.md). No test depends on the disk's syncs; the full-disk tests mount a tmpfs of their own."""
    memory = Path("/dev/shm")
    if "TMPDIR" in os.environ or not memory.is_dir() or not os.access(memory, os.W_OK):
        return
    free = os.statvfs(memory)
    if free.f_bavail * free.f_frsize >= MEMORY_TMP_GB * 2**30:
        os.environ["TMPDIR"] = str(memory)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def pytest_sessionfinish(session, exitstatus) -> None:
    warm_launcher.close()
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller, after every worker, or pytest without xdist
        shared = Path(os.environ.pop("TESTS_SHARED_DIR", ""))
        record = shared / "mlflow-server.json"
        if shared.name and record.is_file():
            stop_process_group(json.loads(record.read_text())["pid"])
        if shared.name:
            shutil.rmtree(shared, ignore_errors=True)


# The files that take longest (their tests' summed times in a `make test`), first (`make test` passes
# --no-loadscope-reorder): an xdist worker takes the next file when it is nearly done with its own, so a long file
# started last would leave the other core idle at the end.
LONGEST_FIRST = (
    "test_distributed.py", "test_mnist.py", "test_spark.py", "test_bench_spark.py", "test_sweep.py",
    "test_azure_world.py", "test_pipeline.py", "test_bad_input.py", "test_stop_and_resume.py",
    "test_sweep_isolation.py", "test_serve.py", "test_bench_serve.py", "test_mlflow_server.py", "test_pyfunc.py",
    "test_cli_penguins.py", "test_export.py", "test_score.py", "test_batch_score.py", "test_own_datamodule.py",
)  # fmt: skip


def pytest_collection_modifyitems(items) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order


def stop_process_group(pid: int) -> None:
    """SIGTERM to the group `pid` leads (a server and the workers it started), SIGKILL after 30 s."""
    try:
        os.killpg(pid, signal.SIGTERM)
        for _ in range(300):
            with contextlib.suppress(ChildProcessError):  # reaps it where this process started it
                os.waitpid(pid, os.WNOHANG)
            os.killpg(pid, 0)
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real server for the whole test run (it takes 25-55 s to start here): the first worker that asks starts it,
    the others use it; it is stopped by its process group at the end of the run (pytest_sessionfinish)."""
    shared = Path(os.environ["TESTS_SHARED_DIR"])
    with open(shared / "mlflow-server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        record = shared / "mlflow-server.json"
        if not record.is_file():
            url, pid = start_mlflow_server(tmp_path_factory.mktemp("mlflow-server"))
            record.write_text(json.dumps({"url": url, "pid": pid}))
        url = json.loads(record.read_text())["url"]
    return url


def start_mlflow_server(folder: Path) -> tuple[str, int]:
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    # Without MLflow's job runner (seven more processes, each importing MLflow, polling for the whole run): Azure ML's
    # tracking runs no MLflow jobs either, and nothing here submits one.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(folder / "server.log", "w") as log:
        server = subprocess.Popen(
            command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return url, server.pid
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            stop_process_group(server.pid)
            pytest.fail(f"mlflow server did not start: {(folder / 'server.log').read_text()[-2000:]}")
        time.sleep(1)


@pytest.fixture(scope="session")
def azure_tracking(mlflow_server):
    """The session's MLflow server as Azure ML's tracking answers: what Azure ML's MLflow lacks is 404."""
    from tests.azure_world import AzureTrackingProxy

    proxy = AzureTrackingProxy(mlflow_server)
    yield proxy
    proxy.shutdown()
    proxy.server_close()


def write_images(folder: Path, count: int, channel: int, size: tuple[int, int] = (64, 64), start: int = 0) -> None:
    """`count` noisy images, JPEG and PNG in turn, with colour `channel` saturated so classes can be told apart, seeded
    by the folder's last two names too: `val/chickens` holds other pictures than `train/chickens` (a copy of a training
    picture would be left out of validation)."""
    folder.mkdir(parents=True, exist_ok=True)
    seed = zlib.crc32("/".join(folder.parts[-2:]).encode()) * 1000 + channel * 100 + start
    generator = torch.Generator().manual_seed(seed)
    for i in range(start, start + count):
        image = torch.randint(0, 256, (3, *size), dtype=torch.uint8, generator=generator)
        image[channel] = 255
        if i % 2:
            write_jpeg(image, str(folder / f"{i}.jpg"))
        else:
            write_png(image, str(folder / f"{i}.png"))


def birds_data(data_dir: Path, **kwargs) -> ImageFolderDataModule:
    """ImageFolderDataModule of small crops in the test process: 32 px, no workers, batch 4 unless given."""
    return ImageFolderDataModule(str(data_dir), **{"image_size": 32, "num_workers": 0, "batch_size": 4, **kwargs})


def bird_folders(root: Path, splits=("train", "val"), count: int = 6) -> Path:
    for split in splits:
        for channel, name in enumerate(CLASSES):
            write_images(root / split / name, count, channel)
    return root


# ---- several processes: what one process trains, the reference the distributed tests compare with ----
DDP_EPOCHS = 3


def penguin_fit(outputs: Path, *args: str) -> list[str]:
    """`fit` of the penguin recipe for DDP_EPOCHS epochs into `outputs`, plus `args`. Split seed 6: 240 training rows,
    which 2 processes of batch 10 take step for step as one process of batch 20 does (seed 42's 235 would be padded
    with a repeated row under 2 processes, and the weights would differ)."""
    return [
        "fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", str(DDP_EPOCHS),
        "--trainer.default_root_dir", str(outputs), "--data.init_args.seed", "6", *args,
    ]  # fmt: skip


def last_checkpoint(outputs: Path) -> dict:
    """The one last.ckpt under `outputs`."""
    (last,) = outputs.glob("*/*/checkpoints/last.ckpt")
    return torch.load(last, weights_only=False)


def once_per_run(name: str, make: Callable[[Path], None]) -> Path:
    """The folder `make(folder)` fills, made once in the test run: by the first process that asks (an xdist worker),
    while any other that asks meanwhile waits on its lock; a later one finds it made. The folder is the run's shared
    one's (TESTS_SHARED_DIR), removed at the run's end; what reads it must not write into it."""
    shared = Path(os.environ["TESTS_SHARED_DIR"])
    folder = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (shared / f"{name}.made").is_file():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed `make` left
            folder.mkdir()
            make(folder)
            (shared / f"{name}.made").touch()
    return folder


@pytest.fixture(scope="module")
def one_process() -> dict:
    """last.ckpt of the recipe in one process, batch 20: test_distributed, test_horovod and test_spark compare their
    launchers' weights with the same fit, made once in the test run."""

    def fit(outputs: Path) -> None:
        result = run_module("scripts.train", *penguin_fit(outputs, "--test_after_fit", "false"))
        assert result.returncode == 0, result.stderr[-3000:]

    return last_checkpoint(once_per_run("one-process", fit))


def assert_same_training(one: dict, two: dict) -> None:
    """Two processes of batch 10 take, step for step, the rows one process of batch 20 takes: the same weights."""
    assert one["global_step"] == two["global_step"] == 12 * DDP_EPOCHS  # 240 training rows: 12 steps an epoch
    assert one["state_dict"].keys() == two["state_dict"].keys()
    for name, weights in one["state_dict"].items():
        assert torch.allclose(weights, two["state_dict"][name], atol=1e-5), name


def mpirun(*args: str, forward: dict[str, str] | None = None):
    """`mpirun -np 2 python -m scripts.train ARGS`, with `forward`'s variables set in every process (`-x`)."""
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun (apt-get install openmpi-bin; .ci/run installs it)")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **(forward or {})}
    exported = [option for name in forward or {} for option in ("-x", name)]
    return run_module("scripts.train", *args, env=env, launcher=["mpirun", "--oversubscribe", "-np", "2", *exported])
