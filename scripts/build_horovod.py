"""Build and install Horovod 0.28.1 (its last release) against this venv's torch 2.14, with the fixes it needs: for
CPUs (Gloo and MPI), or with `--gpu` for NVIDIA GPUs too (CUDA kernels and NCCL).

    python -m scripts.build_horovod    # or: make horovod; minutes (docs/measured.md), then cached
    python -m scripts.build_horovod --gpu --target /tmp/horovod-gpu   # or: make horovod-gpu; no GPU needed to build

Horovod 0.28.1 predates torch 2.1: it compiles with C++14, torch 2.14's headers need C++20 (and its Gloo,
C++17), so the sdist's CMake files are patched. A CUDA build of torch (PyPI's default) also makes it
compile CUDA kernels, which needs the CUDA toolkit: this builds for CPUs (Gloo and MPI controllers, no
CUDA kernels, no NCCL). `--gpu` builds those too, with a CUDA toolkit it assembles from PyPI's wheels of the
CUDA version torch was built for (nvcc, nvvm, the runtime and CCCL headers; NCCL is torch's own wheel), compute
capabilities 7.5 to 9.0 (CUDA 13 has none below 7.5). Needs cmake, g++ >= 10 and Open MPI's headers
(apt-get install cmake g++ libopenmpi-dev). The wheel is kept in ~/.cache/lightning-template/ and reused
while torch and the fixes stay the same. strategies/horovod/Dockerfile runs this file as a plain script in
Azure ML's image build: it imports nothing of this repository.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

VERSION = "0.28.1"
# (file, text in the 0.28.1 sdist, replacement): each must match once, or the sdist is not the one these fix.
FIXES = [
    ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    ("horovod/torch/CMakeLists.txt", "    set(CMAKE_CXX_STANDARD 14)", "    set(CMAKE_CXX_STANDARD 20)"),
    (
        "cmake/Modules/FindPytorch.cmake",
        'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)\n',
        'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)\n'
        'if ("$ENV{HOROVOD_TORCH_CPU_ONLY}" STREQUAL "1")\n    set(Pytorch_CUDA FALSE)\nendif()\n',
    ),
]
# Fixes of the GPU build only (kept apart so that the CPU wheel's cache key stays the same).
GPU_FIXES: list[tuple[str, str, str]] = []
CACHE = Path.home() / ".cache" / "lightning-template"


def patch(source: Path, fixes: list[tuple[str, str, str]]) -> None:
    for name, old, new in fixes:
        path = source / name
        text = path.read_text()
        if text.count(old) != 1:
            sys.exit(f"error: {path}: expected {old.strip()!r} once; is this Horovod {VERSION}'s sdist?")
        path.write_text(text.replace(old, new))


# The CUDA toolkit pieces PyPI has for torch 2.14.1's CUDA 13.0 (nvcc 13.0 matches its runtime, 13.0.96).
CUDA_WHEELS = ["nvidia-cuda-nvcc==13.0.88", "nvidia-nvvm==13.0.88", "nvidia-cuda-runtime==13.0.96",
               "nvidia-cuda-cccl==13.0.85", "nvidia-cuda-crt==13.0.88"]  # fmt: skip
CUDA_CAPABILITIES = "75,80,86,89,90"  # T4, A100, A10/A40, L4/L40, H100


def cuda_toolkit() -> Path:
    """A CUDA toolkit folder (bin/nvcc, nvvm/, include/, lib/libcudart.so) made of PyPI's wheels, cached."""
    key = hashlib.sha256(repr(CUDA_WHEELS).encode()).hexdigest()[:12]
    folder = CACHE / f"cuda-toolkit-{key}"
    home = folder / "nvidia" / "cu13"
    if not (home / "bin" / "nvcc").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(folder)]
        subprocess.run([*pip, *CUDA_WHEELS], check=True)
        (home / "lib" / "libcudart.so").symlink_to("libcudart.so.13")  # what CMake looks for by name
        (home / "lib64").symlink_to("lib")  # where nvcc links from
    return home


def nccl_folder() -> Path:
    """torch's own NCCL wheel (nvidia-nccl-cu13): headers and libnccl.so.2, to build against the NCCL torch runs."""
    import nvidia.nccl

    folder = Path(nvidia.nccl.__path__[0])
    if not (folder / "lib" / "libnccl.so").exists():
        (folder / "lib" / "libnccl.so").symlink_to("libnccl.so.2")
    return folder


def build(wheels: Path, gpu: bool = False) -> Path:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        pip = [sys.executable, "-m", "pip"]
        subprocess.run(
            [*pip, "download", f"horovod=={VERSION}", "--no-deps", "--no-binary", ":all:", "-d", work], check=True
        )
        with tarfile.open(next(work.glob("horovod-*.tar.gz"))) as archive:
            archive.extractall(work, filter="data")
        source = work / f"horovod-{VERSION}"
        patch(source, FIXES + (GPU_FIXES if gpu else []))
        flags = {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1"}
        flags |= {"HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_TORCH_CPU_ONLY": "1"}
        if gpu:
            home, nccl = cuda_toolkit(), nccl_folder()
            del flags["HOROVOD_TORCH_CPU_ONLY"]
            flags |= {
                "HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_CUDA_HOME": str(home), "CUDA_HOME": str(home),
                "HOROVOD_NCCL_INCLUDE": str(nccl / "include"), "HOROVOD_NCCL_LIB": str(nccl / "lib"),
                "HOROVOD_NCCL_LINK": "SHARED", "HOROVOD_BUILD_CUDA_CC_LIST": CUDA_CAPABILITIES,
                "PATH": f"{home / 'bin'}:{os.environ['PATH']}",
            }  # fmt: skip
        built = work / "wheels"
        command = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", built, source]
        subprocess.run(command, check=True, env={**os.environ, **flags})
        (wheel,) = built.glob("horovod-*.whl")
        wheels.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(wheel, wheels / wheel.name))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=f"build Horovod {VERSION} against this venv's torch")
    parser.add_argument("--gpu", action="store_true", help="with CUDA kernels and NCCL (no GPU needed to build)")
    parser.add_argument("--target", help="install into this folder (for PYTHONPATH) instead of this environment")
    args = parser.parse_args(argv)
    for tool in ("cmake", "g++", "mpicxx"):
        if shutil.which(tool) is None:
            sys.exit(f"error: {tool} not found: apt-get install cmake g++ libopenmpi-dev (or your system's)")
    # One wheel per torch version, set of fixes and flavour: a change to any builds again.
    flavour = (CUDA_WHEELS, GPU_FIXES, CUDA_CAPABILITIES) if args.gpu else ()
    key = hashlib.sha256(repr((torch.__version__, FIXES, *flavour)).encode()).hexdigest()[:12]
    wheels = CACHE / f"horovod-{VERSION}-{'gpu-' if args.gpu else ''}{key}"
    cached = sorted(wheels.glob("horovod-*.whl"))
    wheel = cached[0] if cached else build(wheels, gpu=args.gpu)
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    if args.target:
        install += ["--upgrade", "--target", args.target]
    subprocess.run([*install, wheel], check=True)
    print(f"horovod {VERSION} installed from {wheel}")


if __name__ == "__main__":
    main()
