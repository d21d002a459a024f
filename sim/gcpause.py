"""The cyclic garbage collector, kept out of a simulation's way.

Measured (issue 16): at 2,048 nodes Python's cyclic collector takes about half of a run's
CPU.  A simulation allocates millions of short-lived objects (simpy events, coroutine
frames), so generation-0 collections run every few hundred allocations, and each older
collection traverses the whole heap of long-lived agent objects.  During a run this
raises the generation-0 threshold from 700 to 200,000 allocations, so the young
collections that still run (cycles are still collected: coroutines and simpy events do
form cycles, and memory must stay flat) run much less often.  Measured against 50,000
(bench/results/scale.md): the collector's own time (``gc.callbacks``) at 2,048 nodes x 7
days 6.95 -> 2.63 s of 51.6 s.

It does **not** ``gc.freeze()`` the heap built before the first event (it did): a frozen
object is never collected, so a node's first agent, built before the run and frozen,
stayed in memory with everything it referenced after the node crashed (its last worker
group, its workers, its store client and lease), a leak of one agent per crashed node:
the 54-day run at 2,048 nodes grew from 109 to 203 MiB, and objects the collector tracks
grew by about 60 per round.  Without the freeze, 2,048 nodes x 8 days: tracked objects
flat (253,218 -> 257,880 with a full collection at each eighth, against 177,600 ->
184,783 frozen), the same CPU (42.4 against 42.9 s) and the same report; full
collections are rare either way (9 in the run, 1.4 s).

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
    """Within the block: young collections rarer."""
    if not ENABLED:
        yield
        return
    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(_GEN0, thresholds[1], thresholds[2])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
