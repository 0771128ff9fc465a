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
    """Raises LaunchError naming the devices and nodes to give when the processes the launcher started (WORLD_SIZE, and
    RANK, LOCAL_RANK where it sets them) disagree with devices x num_nodes."""
    if "WORLD_SIZE" not in environ or "OMPI_COMM_WORLD_SIZE" in environ or "HOROVOD_SIZE" in environ:
        return  # no launcher, or mpirun / horovodrun: MPIEnvironment and HorovodStrategy check those
    started = int(environ["WORLD_SIZE"])
    node = int(environ.get("NODE_RANK", environ.get("GROUP_RANK", 0)))  # as Lightning reads them
    local = int(environ.get("LOCAL_RANK", 0))
    rank = int(environ["RANK"]) if environ.get("RANK", "").isdigit() else None
    per_node = int(environ.get("LOCAL_WORLD_SIZE", 0))  # torchrun sets it; Azure ML does not
    if not per_node and rank is not None and node > 0 and (rank - local) % node == 0:
        per_node = (rank - local) // node  # a later node's ranks follow the earlier nodes' processes
    # Lightning numbers this process node x devices + local rank: it must be the launcher's RANK.
    lightning_rank = node * num_devices + local
    if (
        started == num_devices * num_nodes
        and per_node in (0, num_devices)
        and local < num_devices
        and rank in (None, lightning_rank)
    ):
        return
    launched = f"the launcher started {started} processes (WORLD_SIZE)"
    if not per_node and started == num_devices * num_nodes:  # the first node, LOCAL_RANK beyond devices
        raise LaunchError(
            f"{launched}, {local + 1} or more on this node (LOCAL_RANK {local}), but the Trainer has devices "
            f"{num_devices} x num_nodes {num_nodes}: give --trainer.devices the processes per node and "
            f"--trainer.num_nodes the nodes ({started} in all)"
        )
    nodes = started // per_node if per_node else num_nodes if started % num_nodes == 0 else 1
    raise LaunchError(
        f"{launched}, but the Trainer has devices {num_devices} x num_nodes {num_nodes}: give --trainer.devices "
        f"{per_node or started // nodes} --trainer.num_nodes {nodes} (devices: processes per node)"
    )


def launched_first(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is global rank 0 as its launcher set it up (torchrun / Azure ML's pytorch: RANK; mpirun,
    horovodrun), or no launcher started it. Lightning's own multi-node launch sets no RANK, only NODE_RANK on each
    node and LOCAL_RANK in the processes it starts: any of them but the first node's first is not rank 0 either."""
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK"):
        if environ.get(name, "").isdigit():
            return int(environ[name]) == 0
    return all(environ.get(name, "0") in ("", "0") for name in ("NODE_RANK", "GROUP_RANK", "LOCAL_RANK"))


def launched_processes(environ: Mapping[str, str] = os.environ) -> int:
    """How many processes the launcher started (torchrun / Azure ML's pytorch, mpirun, horovodrun), or 1."""
    for name in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE"):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 1
