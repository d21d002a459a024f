"""The simulated store host: one MemoryStore behind per-node clients with latency,
outages and partitions.

Each node's agent talks to the store through its own :class:`SimStoreClient`.  An
operation costs one simulated round trip (``latency``; zero latency costs no event).

The fault model (what etcd and a TCP store really do)
-----------------------------------------------------
* **Request leg.**  An operation starts only when its client can reach the store: during
  a store outage, or while the node is cut off from the store, the request waits until
  the store is reachable again (a retrying client, as etcd's and torch's TCPStore client
  reconnect).
* **In flight.**  An operation already accepted by the store (a ``get`` waiting for its
  key, a ``watch`` waiting for a revision) is executed by the store, but its answer — a
  value, a wake-up, a timeout — travels back over the same link: if the link is down
  (outage or partition) when the answer is ready, the answer is held until the link heals.
  A cut-off node therefore neither completes an operation nor receives a wake-up.
* **Partition.**  A node cut off from the store stops renewing its leases (renewals are
  messages too): each expires ``ttl`` after the last renewal that reached the store
  before the cut, unless the link heals first, in which case renewals resume and nothing
  expires.  A lease's owner renews it on a fixed schedule, every ``ttl/3`` from its
  grant's answer (both real clients do: the network store's and etcd's); a renewal held
  by the cut past the next one's time restarts the schedule at its answer, after the
  heal.  The last renewal is computed, not simulated (no event per renewal): the lease
  expires between ``2/3 ttl`` and ``ttl`` after the cut, as measured against real
  agents in network namespaces (``elastic compare`` on
  ``scenarios/fidelity_partition_*.yaml``).  The store host's
  side keeps running and expires them (etcd's leader and a TCPStore host both expire on
  their own clock).
* **Store outage.**  The store host is down: no lease expires while no store runs, and
  when it comes back every abandoned lease expires no sooner than ``ttl`` after its
  return (etcd's new leader extends every lease by its full TTL, ``lessor.Promote``).
  An outage therefore expires nobody's lease: a node that died before or during the
  outage is seen dead ``ttl`` after the store returns.
* **Crash.**  A node crash abandons every lease its client holds, for good.
* **Revoke** is an operation like any other: a node that cannot reach the store cannot
  revoke; a node leaving while cut off abandons its leases instead.

No event is spent per lease renewal (DESIGN §2), and with no fault active an operation
costs exactly the events it did before the fault model: the reachability checks are
plain attribute reads.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any, TypeVar

from elastic.clock import OneShot
from elastic.memstore import MemoryStore
from elastic.store import Lease
from sim.clock import SimClock, _Wake

__all__ = ["SimStoreClient", "SimStoreHost"]

T = TypeVar("T")


class SimStoreHost:
    """The store's host: the data, its latency and its reachability."""

    def __init__(self, clock: SimClock, latency: float = 0.0) -> None:
        self.clock = clock
        self.latency = latency
        self.store = MemoryStore(clock)
        self._down_until: OneShot | None = None

    def client(self, node: Any) -> SimStoreClient:
        # not kept here: a registry of every (node, incarnation) ever booted, which nothing
        # read, grew with every node restart of a long run
        return SimStoreClient(self, node)

    @property
    def down(self) -> bool:
        return self._down_until is not None

    def outage_start(self) -> None:
        # The store is down, not the nodes: no lease can expire while no store runs (as
        # etcd extends leases across a leader change); operations wait for it to return.
        if self._down_until is None:
            self._down_until = self.clock.event()
            self.store.pause_expiry()

    def outage_end(self) -> None:
        ev, self._down_until = self._down_until, None
        if ev is not None:
            self.store.resume_expiry()
            ev.set()


class _ClientLease:
    """A lease as its owner's client sees it: revoking it is an operation on the link."""

    __slots__ = ("_client", "id", "inner", "ttl")

    def __init__(self, client: SimStoreClient, inner: Lease) -> None:
        self._client = client
        self.inner = inner
        self.id = inner.id
        self.ttl = inner.ttl

    def alive(self) -> bool:
        return self.inner.alive()

    def abandon(self) -> None:
        self.inner.abandon()

    async def revoke(self) -> None:
        await self._client._call(self.inner.revoke)


def _inner(lease: Lease | None) -> Lease | None:
    return lease.inner if isinstance(lease, _ClientLease) else lease


class SimStoreClient:
    """One node's view of the store (the Store port)."""

    def __init__(self, host: SimStoreHost, node: Any) -> None:
        self.host = host
        self.node = node
        self._leases: list[Lease] = []
        # lease id -> its renewals' schedule: they leave at origin + n * ttl/3 (n >= 1)
        self._renewing_since: dict[int, float] = {}
        self._cut_at = 0.0
        self._cut_until: OneShot | None = None
        self.dead = False

    @property
    def cut(self) -> bool:
        return self._cut_until is not None

    @property
    def reachable(self) -> bool:
        """Whether a message on this node's link to the store gets through now."""
        return self._cut_until is None and self.host._down_until is None

    # -- faults ------------------------------------------------------------------------
    def partition_start(self) -> None:
        if self._cut_until is None:
            self._cut_at = self.host.clock.now()
            self._cut_until = self.host.clock.event()
            self._cut_leases()

    def partition_end(self) -> None:
        ev, self._cut_until = self._cut_until, None
        if ev is not None:
            self._heal_leases()
            ev.set()

    def crash(self) -> None:
        """The node died: its leases stop being renewed, for good."""
        self.dead = True
        for lease in self._leases:
            lease.abandon()
        self._leases = []

    async def leave(self) -> None:
        """A graceful leave: revoke the node's leases if the store can hear it, else they
        are abandoned (and expire ``ttl`` later, on the store's side)."""
        leases, self._leases = self._leases, []
        if self.reachable:
            for lease in leases:
                await self._call(lease.revoke)
        for lease in leases:
            lease.abandon()  # no-op for a revoked lease
        self.dead = True

    def _cut_leases(self) -> None:
        now = self.host.clock.now()
        for lease in self._leases:
            origin = self._renewing_since.get(lease.id)
            since = getattr(lease, "abandon_since", None)
            if origin is None or since is None:
                lease.abandon()
                continue
            # renewal n leaves at origin + n * period and reaches the store a latency
            # later; the grant (n = 0) reached it a latency before its answer
            lat = self.host.latency
            period = lease.ttl / 3
            n = (now - lat - origin) // period
            since(origin + n * period + lat if n >= 1 else origin - lat)

    def _heal_leases(self) -> None:
        alive = []
        for lease in self._leases:
            resume = getattr(lease, "resume", None)
            if lease.alive() and resume is not None:
                resume()
                alive.append(lease)
                self._reschedule(lease)
        self._leases = alive

    def _reschedule(self, lease: Lease) -> None:
        """At a heal: the renewal the cut held (the first due after the cut) reaches the
        store now, and is answered a latency later; if that is past the next one's time,
        the schedule restarts at the answer (``NetLease._renew_forever``)."""
        origin = self._renewing_since.get(lease.id)
        if origin is None:
            return
        now, period = self.host.clock.now(), lease.ttl / 3
        held = origin + max(1.0, -((origin - self._cut_at) // period)) * period
        answer = now + self.host.latency
        if held <= now and answer >= held + period:
            self._renewing_since[lease.id] = answer

    async def _link(self) -> None:
        """Wait until a message on this node's link gets through."""
        while True:
            if self.host._down_until is not None:
                await self.host._down_until.wait()
                continue
            if self._cut_until is not None:
                await self._cut_until.wait()
                continue
            return

    @types.coroutine
    def _call(
        self, op: Callable[..., Coroutine[Any, Any, T]], *args: Any
    ) -> Generator[Any, Any, T]:
        """One round trip: the request waits for the link, the store executes it, and the
        answer (or error) waits for the link again before the caller sees it."""
        # Performance: this runs for every store operation of every simulated agent: the
        # link checks are plain attribute reads, the operation is passed with its
        # arguments (no closure per call), and a healthy link costs no event beyond the
        # latency (which it shares with every other round trip ending at the same
        # instant, sim/clock.py).  It is a generator (``types.coroutine``: awaited as a
        # coroutine is) that yields the latency's wake-up itself: no coroutine frame and
        # no ``__await__`` generator per operation, and one frame fewer for every resume
        # of the agent while it waits (~20 round trips per node per job restart).
        host = self.host
        if self._cut_until is not None or host._down_until is not None:
            yield from self._link()
        if host.latency > 0:
            wake = host.clock.after(host.latency)
            if type(wake) is _Wake:
                yield wake
            else:
                yield from wake.__await__()
            if self._cut_until is not None or host._down_until is not None:
                yield from self._link()  # the link failed while the request travelled
        try:
            result: T = yield from op(*args)
        except Exception:  # an error travels back too; a cancellation stays local
            if self._cut_until is not None or host._down_until is not None:
                yield from self._link()
            raise
        if self._cut_until is not None or host._down_until is not None:
            yield from self._link()
        return result

    @types.coroutine
    def _call_nowait(self, fn: Callable[..., T], *args: Any) -> Generator[Any, Any, T]:
        """:meth:`_call` for an operation that never waits at the store (``fn``: the
        store's ``<op>_nowait``): the same round trip and link checks, with the operation
        called instead of awaited (no coroutine per operation: ~80 ns each, and most of a
        simulated agent's store operations are of this kind)."""
        host = self.host
        if self._cut_until is not None or host._down_until is not None:
            yield from self._link()
        if host.latency > 0:
            wake = host.clock.after(host.latency)
            if type(wake) is _Wake:
                yield wake
            else:
                yield from wake.__await__()
            if self._cut_until is not None or host._down_until is not None:
                yield from self._link()  # the link failed while the request travelled
        try:
            result = fn(*args)
        except Exception:  # an error travels back too
            if self._cut_until is not None or host._down_until is not None:
                yield from self._link()
            raise
        if self._cut_until is not None or host._down_until is not None:
            yield from self._link()
        return result

    # -- the port ----------------------------------------------------------------------
    # Performance: each method returns the round trip's coroutine instead of awaiting it
    # in a coroutine of its own (the caller's ``await`` runs it the same way, one frame
    # fewer to make and to pass every resume through: these run ~60 times per node per
    # job restart).
    def set(
        self, key: str, value: bytes, *, lease: Lease | None = None
    ) -> Coroutine[Any, Any, None]:
        return self._call_nowait(self.host.store.set_nowait, key, value, _inner(lease))

    def get(self, key: str, timeout: float | None = None) -> Coroutine[Any, Any, bytes]:
        return self._call(self.host.store.get, key, timeout)

    def try_get(self, key: str) -> Coroutine[Any, Any, bytes | None]:
        return self._call_nowait(self.host.store.try_get_nowait, key)

    def add(self, key: str, amount: int) -> Coroutine[Any, Any, int]:
        return self._call_nowait(self.host.store.add_nowait, key, amount)

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> Coroutine[Any, Any, bytes]:
        return self._call_nowait(
            self.host.store.compare_set_nowait, key, expected, desired, _inner(lease)
        )

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> Coroutine[Any, Any, None]:
        return self._call(self.host.store.wait, keys, timeout)

    def delete(self, key: str) -> Coroutine[Any, Any, bool]:
        return self._call_nowait(self.host.store.delete_nowait, key)

    def delete_prefix(self, prefix: str) -> Coroutine[Any, Any, int]:
        """The host store's one-operation prefix delete (see MemoryStore.delete_prefix)."""
        return self._call_nowait(self.host.store.delete_prefix_nowait, prefix)

    def multi_get(
        self, keys: Sequence[str], timeout: float | None = None
    ) -> Coroutine[Any, Any, list[bytes]]:
        return self._call(self.host.store.multi_get, keys, timeout)

    def multi_set(self, items: Mapping[str, bytes]) -> Coroutine[Any, Any, None]:
        return self._call_nowait(self.host.store.multi_set_nowait, items)

    async def grant_lease(self, ttl: float) -> Lease:
        async def grant() -> Lease:
            inner = await self.host.store.grant_lease(ttl)
            if self.dead or self.cut:
                inner.abandon()  # a dead or cut-off owner renews nothing
            if not self.dead:
                self._leases.append(inner)
            return inner

        lease = _ClientLease(self, await self._call(grant))
        self._renewing_since[lease.id] = self.host.clock.now()  # the grant's answer
        return lease

    def snapshot(self, prefix: str) -> Coroutine[Any, Any, tuple[int, dict[str, bytes]]]:
        return self._call_nowait(self.host.store.snapshot_nowait, prefix)

    def arrive(
        self, counter: str, key: str, value: bytes, under: str, *, lease: Lease | None = None
    ) -> Coroutine[Any, Any, tuple[int, int, int, bool]]:
        """The host store's arrival in one round trip (MemoryStore.arrive_nowait)."""
        return self._call_nowait(
            self.host.store.arrive_nowait, counter, key, value, under, _inner(lease)
        )

    def count_prefix(self, prefix: str) -> Coroutine[Any, Any, tuple[int, int, bool]]:
        """The host store's key count under a prefix (see MemoryStore.count_prefix)."""
        return self._call_nowait(self.host.store.count_prefix_nowait, prefix)

    def watch(
        self, prefix: str, after: int, timeout: float | None = None
    ) -> Coroutine[Any, Any, int]:
        return self._call(self.host.store.watch, prefix, after, timeout)

    def watch_snapshot(
        self, prefix: str, after: int, read_prefix: str, timeout: float | None = None
    ) -> Coroutine[Any, Any, tuple[int, dict[str, bytes]]]:
        """A watch and the read at its wake in one round trip: the host reads when the
        watch wakes and sends the snapshot with the wake-up (MemoryStore.watch_snapshot)."""
        return self._call(self.host.store.watch_snapshot, prefix, after, read_prefix, timeout)
