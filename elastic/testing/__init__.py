"""Conformance suites a third party runs against its own implementation of a port.

In the manner of ``trio.testing``: every implementation of the store port (the in-memory
store in either world, the simulator's per-node client, the network client) must pass
:mod:`elastic.testing.store`, every clock (asyncio's, the simulator's)
:mod:`elastic.testing.clock`, and every workers port (real processes, the simulator's
worker model) :mod:`elastic.testing.workers`; so must yours.  Nothing here does I/O or imports the
simulator: the checks await only the clock and the store they are handed.
"""

from __future__ import annotations

from elastic.testing.store import ALL_CHECKS, StoreHarness, check_store

__all__ = ["ALL_CHECKS", "StoreHarness", "check_store"]
