"""MemoryStore's per-prefix change index answers a watch exactly as a scan of the log does."""

from __future__ import annotations

import random

import pytest

from elastic.memstore import MemoryStore
from sim.clock import SimClock


def _scan(store: MemoryStore, prefix: str, after: int) -> int | None:
    """The answer before the index: scan the log from ``after``."""
    if after >= store.revision:
        return None
    revs, keys = store._log_revs, store._log_keys
    if not revs or after + 1 < revs[0]:
        return store.revision
    for r, k in zip(revs, keys, strict=True):
        if r > after and k.startswith(prefix):
            return r
    return None


@pytest.mark.parametrize("seed", range(20))
def test_watch_index_agrees_with_a_scan_of_the_log(seed: int) -> None:
    rng = random.Random(seed)
    clock = SimClock()
    store = MemoryStore(clock, log_limit=rng.choice([5, 40, 100_000]))
    prefixes = ["a/", "a/b/", "c/", "", "zz"]
    keys = ["a/1", "a/b/2", "a/b/3", "c/4", "d", "zz9"]

    async def run() -> None:
        for _ in range(400):
            op = rng.random()
            if op < 0.4:
                await store.set(rng.choice(keys), b"v")
            elif op < 0.5:
                await store.multi_set({k: b"m" for k in rng.sample(keys, 3)})
            elif op < 0.6:
                await store.delete(rng.choice(keys))
            else:
                prefix = rng.choice(prefixes)
                after = rng.randint(max(0, store.revision - 30), store.revision + 1)
                assert store._changed_since(prefix, after) == _scan(store, prefix, after)

    clock.spawn(run())
    clock.env.run()
    assert not clock.unobserved
