"""Lightning's cluster environment for processes started by mpirun: Azure ML's `mpi` distribution, or by hand.

Open MPI gives every process its ranks (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE) but not the
address torch.distributed meets at. Azure ML names the first node: AZ_BATCH_MASTER_NODE ("host:port") on
several nodes, AZ_BATCHAI_MPI_MASTER_NODE ("host") on one; by hand it is MASTER_ADDR / MASTER_PORT, or
this machine. Lightning's own MPIEnvironment needs mpi4py (an MPI build); this one reads the variables.

    mpirun -np 2 python -m scripts.train fit --config configs/penguins.yaml --config configs/trainer/ddp_mpi.yaml \\
        --trainer.accelerator cpu --trainer.devices 2
"""

from __future__ import annotations

import os

from lightning.fabric.plugins.environments import ClusterEnvironment

DEFAULT_PORT = 29500  # torch.distributed's; every process must compute the same one, so no random free port


class LaunchError(ValueError):
    """The processes started and the Trainer's devices x num_nodes disagree; the message says what to give."""


class MPIEnvironment(ClusterEnvironment):
    @staticmethod
    def detect() -> bool:
        return "OMPI_COMM_WORLD_RANK" in os.environ and "OMPI_COMM_WORLD_SIZE" in os.environ

    @property
    def creates_processes_externally(self) -> bool:
        return True  # mpirun started every process: Lightning must not start more

    @property
    def main_address(self) -> str:
        if "MASTER_ADDR" in os.environ:
            return os.environ["MASTER_ADDR"]
        if "AZ_BATCH_MASTER_NODE" in os.environ:
            return os.environ["AZ_BATCH_MASTER_NODE"].split(":")[0]
        return os.environ.get("AZ_BATCHAI_MPI_MASTER_NODE", "127.0.0.1")

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        host_port = os.environ.get("AZ_BATCH_MASTER_NODE", "")
        return int(host_port.split(":")[1]) if ":" in host_port else DEFAULT_PORT

    def world_size(self) -> int:
        return int(os.environ["OMPI_COMM_WORLD_SIZE"])

    def set_world_size(self, size: int) -> None:
        pass  # mpirun decided it; validate_settings checks the Trainer agrees

    def global_rank(self) -> int:
        return int(os.environ["OMPI_COMM_WORLD_RANK"])

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])

    def node_rank(self) -> int:
        # mpirun fills each node's slots with consecutive ranks (Azure ML: process_count_per_instance each).
        return self.global_rank() // int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        processes, per_node = self.world_size(), int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])
        if num_devices != per_node or num_devices * num_nodes != processes:
            raise LaunchError(
                f"mpirun started {processes} processes, {per_node} on this node, but the Trainer has devices "
                f"{num_devices} x num_nodes {num_nodes}: give --trainer.devices {per_node} "
                f"--trainer.num_nodes {processes // per_node}"
            )
