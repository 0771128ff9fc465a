"""Validation and test of a DataLoader-based datamodule under several processes, each item counted once:
`EvaluationShard`, the sampler such a datamodule gives its evaluation DataLoaders (datamodules/image_folder.py).

    python -m scripts.train fit --config configs/birds.yaml --config configs/trainer/ddp.yaml --trainer.devices 2
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

from torch.utils.data import DistributedSampler

from datamodules.errors import DataError


def check_shardable(split: str, size: int, world_size: int) -> None:
    """A DataError when an evaluation split of `size` items would leave a process of `world_size` without one item (else
    Lightning's "`DataLoader` within local rank has zero length"); every process stops so, none waits for the others."""
    if 0 < size < world_size:
        raise DataError(
            f"{split} split: {size} item{'s' if size > 1 else ''} for {world_size} processes, each of which evaluates "
            f"its own share (one item at least); give the {split} split {world_size} items or more, or run on "
            f"{size} process{'es' if size > 1 else ''} (--trainer.devices, --trainer.num_nodes)"
        )


class EvaluationShard(DistributedSampler):
    """Rank r of n evaluates items r, r + n, r + 2n, ... of `dataset`: each item once over all processes, so validation
    and test metrics count every item exactly once. Lightning's own DistributedSampler repeats items to even out the
    shards; these may differ by one item, which evaluation allows (no step of it waits for the other processes).
    Being a DistributedSampler, Lightning leaves it in place. `split` ("val", "test") names the dataset in the DataError
    about a split of fewer items than processes."""

    def __init__(self, dataset: Sized, rank: int, world_size: int, split: str = "evaluation") -> None:
        check_shardable(split, len(dataset), world_size)
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=False)
        self.num_samples = len(range(rank, len(dataset), world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))
