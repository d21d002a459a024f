"""The simulated store host: one MemoryStore behind per-node clients with latency,
outages and partitions.

Each node's agent talks to the store through its own :class:`SimStoreClient`.  An
operation costs one simulated round trip (``latency``; zero latency costs no event).
During a store outage, or while a node is cut off from the store, the node's
operations wait until the store is reachable again (a retrying client).  A node cut
off by a partition stops renewing its leases: they expire ``ttl`` after the cut unless
it heals first.  A store outage expires nobody's lease (no store runs to expire them).
A node crash abandons every lease its client holds.  No event is spent per lease
renewal (DESIGN §2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from elastic.clock import OneShot
from elastic.memstore import MemoryStore
from elastic.store import Lease
from sim.clock import SimClock

__all__ = ["SimStoreClient", "SimStoreHost"]


class SimStoreHost:
    """The store's host: the data, its latency and its reachability."""

    def __init__(self, clock: SimClock, latency: float = 0.0) -> None:
        self.clock = clock
        self.latency = latency
        self.store = MemoryStore(clock)
        self._down_until: OneShot | None = None
        self.clients: dict[Any, SimStoreClient] = {}

    def client(self, node: Any) -> SimStoreClient:
        c = SimStoreClient(self, node)
        self.clients[node] = c
        return c

    @property
    def down(self) -> bool:
        return self._down_until is not None

    def outage_start(self) -> None:
        # The store is down, not the nodes: no lease can expire while no store runs (as
        # etcd extends leases across a leader change); operations wait for it to return.
        if self._down_until is None:
            self._down_until = self.clock.event()

    def outage_end(self) -> None:
        ev, self._down_until = self._down_until, None
        if ev is not None:
            ev.set()


class SimStoreClient:
    """One node's view of the store (the Store port)."""

    def __init__(self, host: SimStoreHost, node: Any) -> None:
        self.host = host
        self.node = node
        self._leases: list[Lease] = []
        self._cut_until: OneShot | None = None
        self.dead = False

    @property
    def cut(self) -> bool:
        return self._cut_until is not None

    # -- faults ------------------------------------------------------------------------
    def partition_start(self) -> None:
        if self._cut_until is None:
            self._cut_until = self.host.clock.event()
            self._cut_leases()

    def partition_end(self) -> None:
        ev, self._cut_until = self._cut_until, None
        if ev is not None:
            ev.set()
            self._heal_leases()

    def crash(self) -> None:
        """The node died: its leases stop being renewed, for good."""
        self.dead = True
        for lease in self._leases:
            lease.abandon()
        self._leases = []

    def _cut_leases(self) -> None:
        for lease in self._leases:
            lease.abandon()

    def _heal_leases(self) -> None:
        alive = []
        for lease in self._leases:
            resume = getattr(lease, "resume", None)
            if lease.alive() and resume is not None:
                resume()
                alive.append(lease)
        self._leases = alive

    async def _rtt(self) -> None:
        while True:
            if self.host._down_until is not None:
                await self.host._down_until.wait()
                continue
            if self._cut_until is not None:
                await self._cut_until.wait()
                continue
            break
        if self.host.latency > 0:
            await self.host.clock.sleep(self.host.latency)

    # -- the port ----------------------------------------------------------------------
    async def set(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        await self._rtt()
        await self.host.store.set(key, value, lease=lease)

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        await self._rtt()
        return await self.host.store.get(key, timeout)

    async def try_get(self, key: str) -> bytes | None:
        await self._rtt()
        return await self.host.store.try_get(key)

    async def add(self, key: str, amount: int) -> int:
        await self._rtt()
        return await self.host.store.add(key, amount)

    async def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        await self._rtt()
        return await self.host.store.compare_set(key, expected, desired)

    async def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        await self._rtt()
        await self.host.store.wait(keys, timeout)

    async def delete(self, key: str) -> bool:
        await self._rtt()
        return await self.host.store.delete(key)

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        await self._rtt()
        return await self.host.store.multi_get(keys, timeout)

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        await self._rtt()
        await self.host.store.multi_set(items)

    async def grant_lease(self, ttl: float) -> Lease:
        await self._rtt()
        lease = await self.host.store.grant_lease(ttl)
        if self.dead:
            lease.abandon()
        else:
            self._leases.append(lease)
        return lease

    async def snapshot(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        await self._rtt()
        return await self.host.store.snapshot(prefix)

    async def watch(self, prefix: str, after: int, timeout: float | None = None) -> int:
        await self._rtt()
        return await self.host.store.watch(prefix, after, timeout)
