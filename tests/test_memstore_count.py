"""MemoryStore.count_prefix (and the simulated client's) answers as a snapshot would:
the same revision, the number of keys under the prefix, and whether the prefix is a key."""

from __future__ import annotations

import random

import pytest

from elastic.memstore import MemoryStore
from sim.clock import SimClock
from sim.store import SimStoreHost

# more than four keys under some prefixes (a range that long is bisected, not stepped over),
# under one ending in the last code point too (it has no successor to bisect to)
_KEYS = ["a", "a/", "a/1", "a/b/2", "a/b/", "a0", "b", "é/1"]
_KEYS += ["c/\U0010ffff", *(f"c/\U0010ffff{i}" for i in range(6)), "c/\U0010ffffx"]
_PREFIXES = ["", "a", "a/", "a/b/", "a/b/2", "b", "c/", "c/\U0010ffff", "é/", "zz", "\U0010ffff"]


@pytest.mark.parametrize("seed", range(10))
def test_count_prefix_agrees_with_a_snapshot(seed: int) -> None:
    rng = random.Random(seed)
    clock = SimClock()
    store = MemoryStore(clock)

    async def run() -> None:
        for _ in range(200):
            if rng.random() < 0.6:
                await store.set(rng.choice(_KEYS), b"v")
            else:
                await store.delete(rng.choice(_KEYS))
            for prefix in _PREFIXES:
                rev, snap = await store.snapshot(prefix)
                assert await store.count_prefix(prefix) == (rev, len(snap), prefix in snap)

    clock.spawn(run())
    clock.env.run()
    assert not clock.unobserved


def test_count_prefix_through_the_simulated_client_costs_one_round_trip() -> None:
    clock = SimClock()
    host = SimStoreHost(clock, latency=0.25)
    client = host.client("n0")
    got: list[tuple[float, tuple[int, int, bool]]] = []

    async def run() -> None:
        await client.multi_set({"r/m/": b"end", "r/m/a": b"1", "r/m/b": b"2", "r/x": b""})
        counted = await client.count_prefix("r/m/")
        got.append((clock.now(), counted))

    clock.spawn(run())
    clock.env.run()
    assert not clock.unobserved
    assert got == [(0.5, (1, 3, True))]
