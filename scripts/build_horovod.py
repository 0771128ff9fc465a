"""Build and install Horovod 0.28.1 (its last release) for CPUs against this venv's torch 2.14, with the fixes it needs.

    python -m scripts.build_horovod    # or: make horovod; ~4 min on 2 cores, then cached

Horovod 0.28.1 predates torch 2.1: it compiles with C++14, torch 2.14's headers need C++20 (and its Gloo,
C++17), so the sdist's CMake files are patched. A CUDA build of torch (PyPI's default) also makes it
compile CUDA kernels, which needs the CUDA toolkit: this builds for CPUs (Gloo and MPI controllers, no
CUDA kernels, no NCCL). A GPU build is not done here yet. Needs cmake, g++ >= 10 and Open MPI's headers
(apt-get install cmake g++ libopenmpi-dev). The wheel is kept in ~/.cache/lightning-template/ and reused
while torch and the fixes stay the same. strategies/horovod.Dockerfile runs this file as a plain script in
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
CACHE = Path.home() / ".cache" / "lightning-template"


def patch(source: Path) -> None:
    for name, old, new in FIXES:
        path = source / name
        text = path.read_text()
        if text.count(old) != 1:
            sys.exit(f"error: {path}: expected {old.strip()!r} once; is this Horovod {VERSION}'s sdist?")
        path.write_text(text.replace(old, new))


def build(wheels: Path) -> Path:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        pip = [sys.executable, "-m", "pip"]
        subprocess.run(
            [*pip, "download", f"horovod=={VERSION}", "--no-deps", "--no-binary", ":all:", "-d", work], check=True
        )
        with tarfile.open(next(work.glob("horovod-*.tar.gz"))) as archive:
            archive.extractall(work, filter="data")
        source = work / f"horovod-{VERSION}"
        patch(source)
        flags = {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1"}
        flags |= {"HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_TORCH_CPU_ONLY": "1"}
        built = work / "wheels"
        command = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", built, source]
        subprocess.run(command, check=True, env={**os.environ, **flags})
        (wheel,) = built.glob("horovod-*.whl")
        wheels.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(wheel, wheels / wheel.name))


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=f"build Horovod {VERSION} for CPUs against this venv's torch").parse_args(argv)
    for tool in ("cmake", "g++", "mpicxx"):
        if shutil.which(tool) is None:
            sys.exit(f"error: {tool} not found: apt-get install cmake g++ libopenmpi-dev (or your system's)")
    # One wheel per torch version and set of fixes: a change to either builds again.
    key = hashlib.sha256(repr((torch.__version__, FIXES)).encode()).hexdigest()[:12]
    wheels = CACHE / f"horovod-{VERSION}-{key}"
    cached = sorted(wheels.glob("horovod-*.whl"))
    wheel = cached[0] if cached else build(wheels)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", wheel], check=True)
    print(f"horovod {VERSION} installed from {wheel}")


if __name__ == "__main__":
    main()
