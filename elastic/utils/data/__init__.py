"""torch's ``torch.distributed.elastic.utils.data``: data helpers for elastic jobs.

:class:`CyclingIterator` is plain Python.  :class:`ElasticDistributedSampler` is a
``torch.utils.data.DistributedSampler`` and so needs torch: it is imported on first
use, and without torch that use raises ``ImportError`` saying so (importing this package
never needs torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elastic.utils.data.cycling_iterator import CyclingIterator

if TYPE_CHECKING:
    from elastic.utils.data.elastic_distributed_sampler import ElasticDistributedSampler

__all__ = ["CyclingIterator", "ElasticDistributedSampler"]


def __getattr__(name: str) -> object:
    if name == "ElasticDistributedSampler":
        from elastic.utils.data.elastic_distributed_sampler import ElasticDistributedSampler

        return ElasticDistributedSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
