"""One process of a DDP job stopping on a mistake of the user's that only it meets (a bad row in the CSV of its own
node's disk): the others fail in their next collective with gloo's "Connection closed by peer" traceback, which names
no cause. The stopping process leaves its line in torch.distributed's store, the TCPStore at MASTER_ADDR:MASTER_PORT
that the processes met through (Lightning sets both for every launcher it runs under); a process whose collective then
fails so ends with that line instead, naming the rank. Nothing else is hidden: any other error keeps its traceback,
and so does a lost peer that left no line (a crash, a SIGKILL)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

KEY = "scripts.train/stopped"
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")  # gloo's words for a peer whose process ended
WAIT = timedelta(seconds=5)  # the stopping process writes its line before it exits, which is what closes the socket
# A process that stops alone finds the store at once; where every process stops (an error each meets), the store's host
# may have exited first, and a client tries to connect until its timeout.
LEAVE = timedelta(seconds=1)


def store(timeout: timedelta) -> dist.TCPStore | None:
    if not (dist.is_available() and dist.is_initialized() and "MASTER_ADDR" in os.environ):
        return None
    address, port = os.environ["MASTER_ADDR"], int(os.environ.get("MASTER_PORT", 0))
    return dist.TCPStore(address, port, is_master=False, timeout=timeout, wait_for_workers=False)


def leave_line(line: str) -> None:
    """Called by a process that stops with `line`: the first process's line stays, for the others to end with."""
    try:
        if (client := store(LEAVE)) is not None:
            client.compare_set(KEY, "", f"rank {dist.get_rank()}: {line}")
    except Exception:  # the store's host may have gone: this process's own line is said all the same
        pass


def peer_line(error: BaseException) -> str | None:
    """The line another process stopped with, when `error` is gloo's account of that process having gone; else None."""
    cause: BaseException | None = error
    while cause is not None and not any(words in str(cause) for words in PEER_GONE):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    try:
        if (client := store(WAIT)) is None:
            return None
        client.wait([KEY], WAIT)
        line = client.get(KEY).decode()
    except Exception:  # no line left (a crash, a kill) or no store to ask: gloo's traceback stays
        return None
    return stopped_with(line)


def crash_line(error: BaseException) -> str:
    """`Type: first line` of what `error` was raised from (jsonargparse wraps what a class's __init__ raised): what the
    others end with when this process crashes."""
    while error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


def stopped_with(line: str) -> str:
    """What a process that another's `rank N: line` stops says."""
    return f"{line} (this process stopped with it: the processes train together)"
