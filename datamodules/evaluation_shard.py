"""Validation and test of a DataLoader-based datamodule under several processes, each item counted once:
`EvaluationShard`, the sampler such a datamodule gives its evaluation DataLoaders (datamodules/image_folder.py).

    python -m scripts.train fit --config configs/birds.yaml --config configs/trainer/ddp.yaml --trainer.devices 2
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

from torch.utils.data import DistributedSampler

from datamodules.base import check_shardable


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
