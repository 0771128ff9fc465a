"""Processes started by a launcher (torchrun, Azure ML's `pytorch` distribution, Spark) must match the Trainer.

Lightning takes the ranks of externally started processes from LOCAL_RANK and NODE_RANK and the Trainer's devices,
not from WORLD_SIZE and RANK: with devices that disagree, two processes take one rank or a rank is missing, and the
job hangs or crashes far from the cause. scripts.train checks it before anything starts:

    torchrun --nproc_per_node 2 -m scripts.train fit --config configs/penguins.yaml --config configs/trainer/ddp.yaml \\
        --trainer.accelerator cpu --trainer.devices 2
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from strategies.mpi_environment import LaunchError


def check_launch(num_devices: int, num_nodes: int, environ: Mapping[str, str] = os.environ) -> None:
    """Raises LaunchError naming the devices and nodes to give when WORLD_SIZE disagrees with devices x num_nodes."""
    if "WORLD_SIZE" not in environ or "OMPI_COMM_WORLD_SIZE" in environ or "HOROVOD_SIZE" in environ:
        return  # no launcher, or mpirun / horovodrun: MPIEnvironment and HorovodStrategy check those
    started = int(environ["WORLD_SIZE"])
    per_node = int(environ.get("LOCAL_WORLD_SIZE", 0))  # torchrun sets it; Azure ML does not
    if started == num_devices * num_nodes and per_node in (0, num_devices):
        return
    nodes = started // per_node if per_node else num_nodes if started % num_nodes == 0 else 1
    raise LaunchError(
        f"the launcher started {started} processes (WORLD_SIZE), but the Trainer has devices {num_devices} x "
        f"num_nodes {num_nodes}: give --trainer.devices {per_node or started // nodes} --trainer.num_nodes {nodes} "
        "(devices: processes per node)"
    )


def launched_first(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is global rank 0 as its launcher set it up (torchrun / Azure ML's pytorch: RANK; mpirun,
    horovodrun), or no launcher started it. Lightning's own multi-node launch sets no RANK, only NODE_RANK on each
    node and LOCAL_RANK in the processes it starts: any of them but the first node's first is not rank 0 either."""
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK"):
        if environ.get(name, "").isdigit():
            return int(environ[name]) == 0
    return all(environ.get(name, "0") in ("", "0") for name in ("NODE_RANK", "GROUP_RANK", "LOCAL_RANK"))
