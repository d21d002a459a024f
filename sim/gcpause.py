"""The cyclic garbage collector, kept out of a simulation's way.

Measured (issue 16): at 2,048 nodes Python's cyclic collector takes about half of a run's
CPU.  A simulation allocates millions of short-lived objects (simpy events, coroutine
frames), so generation-0 collections run every few hundred allocations, and each older
collection traverses the whole heap of long-lived agent objects.  During a run this:

- freezes what exists at the start (``gc.freeze``: the loaded modules, the scenario, the
  agents built before the first event) so no collection traverses it again;
- raises the generation-0 threshold from 700 to 200,000 allocations, so the young
  collections that still run (cycles are still collected: coroutines and simpy events do
  form cycles, and memory must stay flat) run much less often.  Measured against 50,000
  (bench/results/scale.md): the collector's own time (``gc.callbacks``) at 2,048 nodes
  x 7 days 6.95 -> 2.63 s of 51.6 s, peak RSS 235 -> 225 MiB; at 512 nodes x 54 days
  17.4 -> 16.0 s of CPU, peak RSS 91 -> 102 MiB (still a plateau).

Everything is restored on exit, whatever happens.  ``ENABLED = False`` turns it off (the
benchmark's "before").
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ENABLED", "quiet_gc"]

ENABLED = True
_GEN0 = 200_000


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Within the block: objects that exist now frozen, young collections rarer."""
    if not ENABLED:
        yield
        return
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GEN0, thresholds[1], thresholds[2])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
