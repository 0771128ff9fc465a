"""torchrun, with its arguments, ending in one line when a process it started fails: torchrun itself (its launcher
process) raises ChildFailedError at its end, a Python traceback and a summary block of some 35 lines below the
failing rank's own `error: ...` line. This runs torchrun's own `main` (torch.distributed.run) and says instead which
rank failed and with which exit status; the rank's line stays above it. Everything else is torchrun's.

    python -m scripts.torchrun --nproc_per_node 2 -m scripts.train fit --config configs/penguins.yaml \
        --config configs/trainer/ddp.yaml --trainer.accelerator cpu --trainer.devices 2
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun


def main(args: list[str] | None = None) -> None:
    try:
        torchrun(sys.argv[1:] if args is None else args)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        sys.exit(
            f"error: torchrun: rank {rank} (local rank {failure.local_rank}) ended with exit status "
            f"{failure.exitcode}, and torchrun stopped the others; that rank's own error is above"
        )


if __name__ == "__main__":
    main()
