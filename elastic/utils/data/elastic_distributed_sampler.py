"""torch's ``ElasticDistributedSampler``: a ``DistributedSampler`` that can resume part
way through an epoch.

Each epoch shuffles the indices ``start_index`` … ``len(dataset) - 1`` with a generator
seeded by the epoch (``set_epoch``), pads them by repeating from the front until every
replica gets the same number, and gives replica ``rank`` every ``num_replicas``-th one
from position ``rank``.  After a restart, ``start_index`` = the number of samples
already consumed (across all replicas) skips them.  Needs torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any, TypeVar

try:
    import torch
    from torch.utils.data.distributed import DistributedSampler
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "elastic.utils.data.ElasticDistributedSampler is a torch DistributedSampler: "
        f"install torch to use it ({e})"
    ) from e

__all__ = ["ElasticDistributedSampler"]

T = TypeVar("T")


class ElasticDistributedSampler(DistributedSampler):  # type: ignore[misc]
    """A ``DistributedSampler`` over a dataset of fixed size, from ``start_index`` on.

    ``num_replicas``/``rank`` default to the default process group's, as torch's sampler.
    ``TypeError`` for a dataset without ``len``; ``ValueError`` for a ``start_index``
    not below the dataset's size.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        start_index: int = 0,
    ) -> None:
        super().__init__(dataset=dataset, num_replicas=num_replicas, rank=rank)
        if not isinstance(dataset, Sized):
            raise TypeError("Dataset must be an instance of collections.abc.Sized")
        if start_index >= len(dataset):
            raise ValueError(
                f"Start index {start_index} should be less than dataset size {len(dataset)}"
            )
        self.start_index = start_index
        self.num_samples = math.ceil((len(dataset) - start_index) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(self.epoch)
        remaining = len(self.dataset) - self.start_index
        indices: list[int] = (torch.randperm(remaining, generator=g) + self.start_index).tolist()
        indices += indices[: self.total_size - len(indices)]
        if len(indices) != self.total_size:
            raise AssertionError(f"{len(indices)} indices; expected {self.total_size}")
        mine = indices[self.rank : self.total_size : self.num_replicas]
        if len(mine) != self.num_samples:
            raise AssertionError(
                f"{len(mine)} indices for rank {self.rank}; expected {self.num_samples}"
            )
        return iter(mine)

    def __len__(self) -> int:
        return int(self.num_samples)
