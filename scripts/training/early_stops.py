"""A process that stops on a mistake of the user's before the processes of a job have met (torch.distributed's
rendezvous, as trainer.fit, validate or test starts), under a launcher that leaves the others alone when one stops:
Azure ML's `pytorch` distribution, which sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK in every process and
starts them itself (no torchrun). A --trainer.default_root_dir that only node 1 cannot write, a --checkpoint_dir whose
last.ckpt only one node has and does not match the config: the others waited for it inside the rendezvous, in C++,
until torch's timeout (30 minutes), a job of GPU nodes burning its hours. torchrun (TorchDistributor runs it) and
mpirun watch their processes themselves; Lightning's own launcher too.

The stop reaches the others through the store at MASTER_ADDR:MASTER_PORT that the rendezvous itself uses:

- The stopping process (`tell_unmet`) leaves its line there, as one does after the meeting (peer_errors.py). Global
  rank 0, whose address that is, hosts the store itself when it is the one stopping, and stays until every process has
  read the line (at most torch's rendezvous timeout, the others' wait before); its line is printed first.
- Every process watches the store (`watch`) from when its Trainer is built until it has met the others; a line found
  there ends it at once with that line, exit status 1. Its main thread may be waiting inside the rendezvous, which
  nothing in Python interrupts: the watcher ends the process (os._exit). Nothing of the run exists yet then: its MLflow
  run, its config and its checkpoints come after the meeting.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from scripts.training.peer_errors import KEY, leave_line, stopped_with

SEEN = "scripts.train/seen"  # how many processes have the line: rank 0 keeps the store until every one has it
POLL_S = 0.2
# Launchers that end the other processes themselves: torchrun (LOCAL_WORLD_SIZE, TORCHELASTIC_*), mpirun, horovodrun.
OWN_WATCH = ("LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE")


@dataclass(frozen=True)
class Meeting:
    address: str
    port: int
    rank: int
    size: int


def meeting(environ: Mapping[str, str] = os.environ) -> Meeting | None:
    """Where this process is to meet the others (torch.distributed's env:// variables), when its launcher set them and
    would leave the others waiting if it stopped; else None."""
    if any(name in environ for name in OWN_WATCH):
        return None
    numbers = [environ.get(name, "") for name in ("MASTER_PORT", "RANK", "WORLD_SIZE")]
    if not environ.get("MASTER_ADDR") or not all(value.isdigit() for value in numbers) or int(numbers[2]) < 2:
        return None
    port, rank, size = map(int, numbers)
    return Meeting(environ["MASTER_ADDR"], port, rank, size)


def listening(place: Meeting) -> bool:
    """Whether the store is up. A plain connection: torch's own client logs each refused try with a C++ backtrace."""
    try:
        socket.create_connection((place.address, place.port), timeout=1).close()
        return True
    except OSError:
        return False


def client(place: Meeting) -> dist.TCPStore:
    return dist.TCPStore(place.address, place.port, is_master=False, timeout=timedelta(seconds=10),
                         wait_for_workers=False)  # fmt: skip


def wait_for_all(store: dist.TCPStore, place: Meeting, deadline: float) -> None:
    """Rank 0 hosts the store: it stays until every process has the line, or until `deadline`."""
    while place.rank == 0 and store.add(SEEN, 0) < place.size and time.monotonic() < deadline:
        time.sleep(POLL_S)


class Watch:
    """A thread that ends this process with the line another leaves before they meet."""

    def __init__(self, place: Meeting) -> None:
        self.place = place
        self.stopped = threading.Event()
        self.ending = threading.Lock()  # held while the watcher ends the process: stop() then waits for its end
        self.thread = threading.Thread(target=self.run, name="early-stops", daemon=True)
        self.thread.start()

    def run(self) -> None:
        store = None
        while not self.stopped.wait(POLL_S) and not dist.is_initialized():
            try:
                if store is None and listening(self.place):
                    store = client(self.place)
                if store is not None and store.check([KEY]):
                    return self.end(store)
            except Exception:  # the store's host went: it may come again (rank 0, once it reaches the rendezvous)
                store = None

    def end(self, store: dist.TCPStore) -> None:
        with self.ending:
            if self.stopped.is_set() or dist.is_initialized():  # met: from now on a stop is peer_errors.py's
                return
            line = stopped_with(store.get(KEY).decode())
            store.add(SEEN, 1)
            print(f"error: {line}", file=sys.stderr, flush=True)
            wait_for_all(store, self.place, time.monotonic() + default_pg_timeout.total_seconds())
            sys.stdout.flush()
            os._exit(1)

    def stop(self) -> None:
        self.stopped.set()
        with self.ending:
            pass


watching: Watch | None = None


def watch() -> None:
    """Called as the Trainer is built: until this process has met the others, another's stop ends it too."""
    global watching
    if (watching is None or not watching.thread.is_alive()) and (place := meeting()) and not dist.is_initialized():
        watching = Watch(place)


def stop_watching() -> None:
    global watching
    if watching is not None:
        watching.stop()
        watching = None


def tell_others(line: str, met: bool) -> None:
    """Gives the other processes of a job this process's last line: after they met (`met`), those in a collective
    would end in gloo's traceback (peer_errors.py); before, they would wait for this one until torch.distributed's
    timeout (`tell_unmet`). scripts.train calls it for a process that is not alone."""
    if met:
        leave_line(line)
    tell_unmet(line)


def tell_unmet(line: str) -> None:
    """Called by a process that stops with `line`: if it has not met the others yet, they end with it (`rank N: line`)
    instead of waiting for it. Rank 0 waits here until they have it (Ctrl-C ends the wait)."""
    stop_watching()
    place = meeting()
    if place is None or dist.is_initialized():
        return
    deadline = time.monotonic() + default_pg_timeout.total_seconds()
    try:
        if place.rank == 0:
            store = dist.TCPStore(place.address, place.port, is_master=True, timeout=timedelta(seconds=10),
                                  wait_for_workers=False)  # fmt: skip
        else:
            while not listening(place) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            store = client(place)
        store.compare_set(KEY, "", f"rank {place.rank}: {line}")
        store.add(SEEN, 1)
        wait_for_all(store, place, deadline)
    except (Exception, KeyboardInterrupt):  # the port taken, no host in time, a Ctrl-C: its own line is said anyway
        pass
