"""MPIEnvironment reads Open MPI's ranks and the meeting address Azure ML's `mpi` distribution names."""

from __future__ import annotations

import pytest

from strategies.mpi_environment import DEFAULT_PORT, LaunchError, MPIEnvironment

VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "AZ_BATCH_MASTER_NODE", "AZ_BATCHAI_MPI_MASTER_NODE")


@pytest.fixture
def ranks(monkeypatch):
    """Process 5 of 8, the second of 4 on the second node, as mpirun sets them; no address variables."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    values = {"RANK": "5", "SIZE": "8", "LOCAL_RANK": "1", "LOCAL_SIZE": "4"}
    for name, value in values.items():
        monkeypatch.setenv(f"OMPI_COMM_WORLD_{name}", value)
    return monkeypatch


def test_ranks_come_from_open_mpi(ranks):
    environment = MPIEnvironment()
    assert MPIEnvironment.detect() and environment.creates_processes_externally
    assert (environment.world_size(), environment.global_rank(), environment.local_rank()) == (8, 5, 1)
    assert environment.node_rank() == 1


def test_several_azure_ml_nodes_meet_at_the_first_ones_host_and_port(ranks):
    ranks.setenv("AZ_BATCH_MASTER_NODE", "10.0.0.4:6105")
    ranks.setenv("AZ_BATCHAI_MPI_MASTER_NODE", "10.0.0.9")
    assert (MPIEnvironment().main_address, MPIEnvironment().main_port) == ("10.0.0.4", 6105)


def test_one_azure_ml_node_names_its_host_and_the_port_is_torchs_default(ranks):
    ranks.setenv("AZ_BATCHAI_MPI_MASTER_NODE", "10.0.0.9")
    assert (MPIEnvironment().main_address, MPIEnvironment().main_port) == ("10.0.0.9", DEFAULT_PORT)


def test_master_addr_and_port_win_and_by_hand_it_is_this_machine(ranks):
    assert (MPIEnvironment().main_address, MPIEnvironment().main_port) == ("127.0.0.1", DEFAULT_PORT)
    ranks.setenv("AZ_BATCH_MASTER_NODE", "10.0.0.4:6105")
    ranks.setenv("MASTER_ADDR", "node-0")
    ranks.setenv("MASTER_PORT", "1234")
    assert (MPIEnvironment().main_address, MPIEnvironment().main_port) == ("node-0", 1234)


def test_not_detected_without_mpirun(ranks):
    ranks.delenv("OMPI_COMM_WORLD_RANK")
    assert not MPIEnvironment.detect()


def test_trainer_settings_must_match_the_processes_started(ranks):
    MPIEnvironment().validate_settings(num_devices=4, num_nodes=2)
    with pytest.raises(LaunchError, match="give --trainer.devices 4 --trainer.num_nodes 2"):
        MPIEnvironment().validate_settings(num_devices=8, num_nodes=1)
