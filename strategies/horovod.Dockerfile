# The Azure ML image for Horovod jobs: the jobs' conda environment (environment.yml) plus Horovod 0.28.1 built for
# CPUs against its torch, with the Open MPI 4.1.0 of Azure ML's base image (the mpirun its `mpi` distribution starts
# processes with) and Gloo. scripts.submit builds it for configs that use configs/trainer/horovod.yaml, sending
# Azure ML only the files this COPYs (so code changes do not rebuild it):
#   python -m scripts.submit configs/penguins.yaml --presets+ configs/trainer/horovod.yaml --compute cpu-cluster \
#       --nodes 2 --processes_per_node 2 --distribution mpi
# or by hand, from the repository's root: docker build -f strategies/horovod.Dockerfile .
FROM mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest

# Horovod's build: CMake and a C++20 compiler (torch 2.14's headers need C++20: Ubuntu 22.04's g++ 11).
RUN apt-get update && apt-get install -y --no-install-recommends cmake g++ && rm -rf /var/lib/apt/lists/*

COPY environment.yml /build/environment.yml
RUN conda env create --prefix /opt/template --file /build/environment.yml && conda clean --all --yes
ENV PATH=/opt/template/bin:$PATH
# mpirun's wait between the SIGTERM it passes on (Azure ML's, at preemption and cancel) and its SIGKILL, long enough
# for the fit to stop at a batch's end with last.ckpt kept (Open MPI's default: 1 s). Jobs set it as a variable too;
# a pipeline's sweep trials take none, so the image carries it (scripts/azure_ml/jobs.py MPI_STOP_GRACE).
ENV OMPI_MCA_odls_base_sigkill_timeout=10

# The same build `make horovod` runs (sdist patched for torch 2.14, CPU-only); a layer of its own, so a change to it
# reuses the conda environment above.
COPY scripts/build_horovod.py /build/scripts/build_horovod.py
RUN python /build/scripts/build_horovod.py && rm -rf /build /root/.cache
