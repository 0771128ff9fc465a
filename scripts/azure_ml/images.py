"""The images Azure ML jobs, pipeline steps and image deployments run on: Azure ML's Open MPI images (its CUDA one for
GPUs), and Horovod's, built from strategies/horovod/*Dockerfile in a build context of its own.

    python -m scripts.submit configs/penguins.yaml --presets+ configs/trainer/horovod.yaml --compute cpu-cluster \\
        --processes_per_node 2 --distribution mpi --dry_run true
"""

from __future__ import annotations

import shutil
from pathlib import Path

BASE_IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest"  # Open MPI: the mpirun of `mpi` jobs
# GPU jobs: Azure ML's Open MPI image on CUDA with the InfiniBand user space (libibverbs) and Mellanox's NCCL RDMA/SHARP
# plugin on LD_LIBRARY_PATH, so NCCL between ND-series nodes goes over InfiniBand instead of TCP. torch from PyPI
# brings its own CUDA 13 runtime and NCCL (the image's CUDA 11.8 toolkit is not used): the node needs an NVIDIA driver
# R580 or newer and a GPU of compute capability 7.5 or more (T4, A10, A100, H100; not V100, see the README).
GPU_IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04:latest"
HOROVOD_DOCKERFILE = Path("strategies/horovod/Dockerfile")
HOROVOD_GPU_DOCKERFILE = Path("strategies/horovod/gpu.Dockerfile")  # Horovod with CUDA and NCCL, on GPU_IMAGE
HOROVOD_CONTEXT = Path("outputs/horovod-image")  # the Dockerfile and the files it COPYs, what Azure ML builds from


def horovod_build_context(gpu: bool = False) -> Path:
    """HOROVOD_CONTEXT (-gpu), made a Docker build context: the Horovod Dockerfile (as Dockerfile) and the files of
    this folder it COPYs, at their paths.

    Azure ML builds an environment again whenever its context changes: with the whole repository as the
    context, every code change would rebuild the conda environment and Horovod (tens of minutes)."""
    dockerfile = HOROVOD_GPU_DOCKERFILE if gpu else HOROVOD_DOCKERFILE
    folder = HOROVOD_CONTEXT.with_name(HOROVOD_CONTEXT.name + ("-gpu" if gpu else ""))
    shutil.rmtree(folder, ignore_errors=True)
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                (folder / source).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, folder / source)
    shutil.copy(dockerfile, folder / "Dockerfile")
    return folder
