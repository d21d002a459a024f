"""``elastic.utils.data``: torch's ``CyclingIterator`` and ``ElasticDistributedSampler``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from elastic.utils.data import CyclingIterator


def _epochs(stride: int) -> object:
    def fn(epoch: int) -> Iterator[int]:
        return iter(range(stride * epoch, stride * (epoch + 1)))

    return fn


def test_cycles_through_every_epoch_then_stops() -> None:
    it: CyclingIterator[int] = CyclingIterator(90, _epochs(3))  # type: ignore[arg-type]
    assert list(it) == list(range(270))
    with pytest.raises(StopIteration):
        next(it)


def test_starts_at_start_epoch() -> None:
    it: CyclingIterator[int] = CyclingIterator(2, _epochs(3), start_epoch=1)  # type: ignore[arg-type]
    assert list(it) == [3, 4, 5]


def test_empty_epochs_are_passed_over_without_recursion() -> None:
    calls: list[int] = []

    def fn(epoch: int) -> Iterator[int]:
        calls.append(epoch)
        return iter([epoch] if epoch in (0, 4999) else [])

    assert list(CyclingIterator(5000, fn)) == [0, 4999]  # torch's recursion would overflow
    assert calls == list(range(5000))


def test_the_package_imports_without_touching_torch() -> None:
    code = "import sys, elastic.utils.data; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_elastic_sampler_resumes_after_start_index_and_pads_evenly() -> None:
    pytest.importorskip("torch")
    from elastic.utils.data import ElasticDistributedSampler

    data = list(range(10))
    parts = [
        list(ElasticDistributedSampler(data, num_replicas=3, rank=r, start_index=2))
        for r in range(3)
    ]
    assert all(len(p) == 3 for p in parts)  # ceil(8 / 3)
    seen = [i for p in parts for i in p]
    assert set(seen) == set(range(2, 10))  # every remaining sample, none already consumed
    assert len(seen) == 9  # one repeated to pad
    # the shuffle is a function of the epoch
    s = ElasticDistributedSampler(data, num_replicas=3, rank=0, start_index=2)
    first = list(s)
    assert list(s) == first
    s.set_epoch(1)
    assert list(s) != first and len(s) == 3


@pytest.mark.torch
def test_elastic_sampler_gives_torchs_indices() -> None:
    torch_data = pytest.importorskip("torch.distributed.elastic.utils.data")
    from elastic.utils.data import ElasticDistributedSampler

    for size, replicas, start in ((10, 3, 2), (17, 4, 0), (5, 4, 3), (100, 7, 33)):
        for rank in range(replicas):
            ours = ElasticDistributedSampler(range(size), replicas, rank, start)
            theirs = torch_data.ElasticDistributedSampler(range(size), replicas, rank, start)
            for epoch in (0, 3):
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_elastic_sampler_refuses_bad_input() -> None:
    pytest.importorskip("torch")
    from elastic.utils.data import ElasticDistributedSampler

    with pytest.raises(ValueError, match="Start index 3 should be less than dataset size 3"):
        ElasticDistributedSampler([0, 1, 2], num_replicas=1, rank=0, start_index=3)
