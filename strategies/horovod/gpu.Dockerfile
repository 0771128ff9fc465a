# The Azure ML image for Horovod jobs on GPUs: Azure ML's CUDA Open MPI image (InfiniBand user space and the NCCL
# RDMA/SHARP plugin, the mpirun of the `mpi` distribution), the jobs' conda environment (environment.yml) and
# Horovod 0.28.1 built with CUDA kernels and NCCL against its torch (CUDA 13: the nodes need an NVIDIA driver R580+).
# scripts.submit builds it for Horovod configs that run on GPUs, sending Azure ML only the files this COPYs:
#   python -m scripts.submit configs/mnist.yaml --presets "[configs/trainer/horovod.yaml, configs/trainer/gpu.yaml]" \
#       --compute gpu-cluster --nodes 2 --processes_per_node 4 --distribution mpi
# or by hand, from the repository's root: docker build -f strategies/horovod/gpu.Dockerfile .
FROM mcr.microsoft.com/azureml/openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04:latest

# Horovod's build: CMake and a C++20 compiler (torch 2.14's headers need C++20: Ubuntu 22.04's g++ 11). The CUDA
# compiler comes from PyPI in the build step (the image's CUDA 11.8 is older than torch's 13).
RUN apt-get update && apt-get install -y --no-install-recommends cmake g++ && rm -rf /var/lib/apt/lists/*

COPY environment.yml /build/environment.yml
RUN conda env create --prefix /opt/template --file /build/environment.yml && conda clean --all --yes
ENV PATH=/opt/template/bin:$PATH
# mpirun's wait between the SIGTERM it passes on (Azure ML's, at preemption and cancel) and its SIGKILL, long enough
# for the fit to stop at a batch's end with last.ckpt kept (Open MPI's default: 1 s). Jobs set it as a variable too;
# a pipeline's sweep trials take none, so the image carries it (scripts/azure_ml/jobs.py MPI_STOP_GRACE).
ENV OMPI_MCA_odls_base_sigkill_timeout=10

# The same build `make horovod-gpu` runs; a layer of its own, so a change to it reuses the conda environment above.
COPY scripts/build_horovod.py /build/scripts/build_horovod.py
RUN python /build/scripts/build_horovod.py --gpu && rm -rf /build /root/.cache
