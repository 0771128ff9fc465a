"""strategies.launch_check: processes a launcher started against the Trainer's devices x num_nodes."""

from __future__ import annotations

import pytest

from scripts.training.early_stops import Meeting, meeting
from strategies.launch_check import check_launch, launched_first
from strategies.mpi_environment import LaunchError


@pytest.mark.parametrize(
    ("environ", "devices", "nodes"),
    [
        ({}, 4, 2),  # nothing launched: Lightning starts the processes itself
        ({"WORLD_SIZE": "8", "NODE_RANK": "1", "RANK": "5", "LOCAL_RANK": "1"}, 4, 2),  # Azure ML's pytorch, 2 x 4
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, 2, 2),  # torchrun on 2 nodes
        ({"WORLD_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "2"}, 1, 1),  # mpirun: MPIEnvironment checks
        ({"WORLD_SIZE": "2", "NODE_RANK": "1", "RANK": "1", "LOCAL_RANK": "0"}, 1, 2),  # Azure ML, 1 process a node
        ({"WORLD_SIZE": "4", "NODE_RANK": "1"}, 2, 2),  # Lightning's own launch, the second node's first process
    ],
)
def test_launches_that_match_pass(environ, devices, nodes):
    check_launch(devices, nodes, environ)


@pytest.mark.parametrize(
    ("environ", "devices", "nodes", "give"),
    [
        ({"WORLD_SIZE": "8", "NODE_RANK": "0"}, 2, 2, "--trainer.devices 4 --trainer.num_nodes 2"),
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, 1, 1, "--trainer.devices 2 --trainer.num_nodes 1"),
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, 4, 1, "--trainer.devices 2 --trainer.num_nodes 2"),
        ({"WORLD_SIZE": "6"}, 1, 4, "--trainer.devices 6 --trainer.num_nodes 1"),
        # Azure ML's 2 nodes x 2 processes as devices 1 x num_nodes 4: the product matches, the ranks do not (node 1's
        # first process would take rank 1, a rank of node 0's).
        ({"WORLD_SIZE": "4", "NODE_RANK": "1", "RANK": "2", "LOCAL_RANK": "0"}, 1, 4,
         "--trainer.devices 2 --trainer.num_nodes 2"),
        # Azure ML's 2 nodes x 1 process without --trainer.num_nodes: node 1 knows there are 2 nodes.
        ({"WORLD_SIZE": "2", "NODE_RANK": "1", "RANK": "1", "LOCAL_RANK": "0"}, 1, 1,
         "--trainer.devices 1 --trainer.num_nodes 2"),
    ],
)  # fmt: skip
def test_launches_that_disagree_name_the_devices_and_nodes_to_give(environ, devices, nodes, give):
    with pytest.raises(LaunchError) as error:
        check_launch(devices, nodes, environ)
    assert str(error.value).startswith(f"the launcher started {environ['WORLD_SIZE']} processes (WORLD_SIZE)")
    assert f"give {give} (devices: processes per node)" in str(error.value)


def test_a_local_rank_beyond_the_devices_of_a_node_is_one_line_where_the_product_matches():
    """Node 0's second process of Azure ML's 2 x 2 given devices 1 x num_nodes 4: an IndexError in Lightning before."""
    environ = {"WORLD_SIZE": "4", "NODE_RANK": "0", "RANK": "1", "LOCAL_RANK": "1"}
    with pytest.raises(LaunchError) as error:
        check_launch(1, 4, environ)
    assert str(error.value) == (
        "the launcher started 4 processes (WORLD_SIZE), 2 or more on this node (LOCAL_RANK 1), but the Trainer has "
        "devices 1 x num_nodes 4: give --trainer.devices the processes per node and --trainer.num_nodes the nodes "
        "(4 in all)"
    )


@pytest.mark.parametrize(
    ("environ", "first"),
    [
        ({}, True),  # no launcher
        ({"RANK": "0", "LOCAL_RANK": "0", "NODE_RANK": "0", "WORLD_SIZE": "4"}, True),  # torchrun, Azure ML's pytorch
        ({"RANK": "2", "LOCAL_RANK": "0", "NODE_RANK": "1", "WORLD_SIZE": "4"}, False),
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, False),  # mpirun
        # Lightning's own multi-node launch: NODE_RANK on each node, LOCAL_RANK in the processes it starts, no RANK.
        ({"NODE_RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "node0"}, True),
        ({"NODE_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "node0"}, False),
        ({"NODE_RANK": "0", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, False),
    ],
)
def test_only_the_first_process_of_the_first_node_is_rank_0_however_launched(environ, first):
    """What scripts.train checks in rank 0 alone (a --ckpt_path only the first node has, --checkpoint_dir); a process
    of node 1 that took itself for rank 0 stopped at once, and the first node's waited for it for half an hour."""
    assert launched_first(environ) is first


AZURE = {"MASTER_ADDR": "10.0.0.4", "MASTER_PORT": "6105", "WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0",
         "NODE_RANK": "1"}  # fmt: skip


@pytest.mark.parametrize(
    ("environ", "watched"),
    [
        (AZURE, True),  # Azure ML's pytorch: nothing ends the others when one stops
        ({**AZURE, "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}, False),  # torchrun ends them
        ({**AZURE, "OMPI_COMM_WORLD_SIZE": "4"}, False),  # mpirun ends them
        ({**AZURE, "WORLD_SIZE": "1"}, False),  # alone
        ({key: value for key, value in AZURE.items() if key != "RANK"}, False),  # Lightning's own launch: no RANK
    ],
)
def test_a_stop_before_the_processes_meet_is_told_where_no_launcher_ends_the_others(environ, watched):
    """scripts/training/early_stops.py: where the processes meet, for the ones that stop before they do."""
    assert (meeting(environ) == Meeting("10.0.0.4", 6105, 2, 4)) is watched
