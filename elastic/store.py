"""The store port: the rendezvous key-value store, with waits, watches and leases.

Theory of operation
-------------------
Keys are ``str``, values are ``bytes`` (data, never pickles — DESIGN §3).  Every
mutation bumps a store-wide *revision* (as etcd does); a watch waits for the first
mutation under a key prefix after a given revision, so a node learns of a membership
change with one wake-up and no polling.

Leases are how liveness is held: ``grant_lease(ttl)`` returns a :class:`Lease`; keys
set with ``lease=`` vanish (a deletion, seen by watches) once the lease expires.  A
lease is kept alive for as long as its owner lives; after the owner stops renewing
(the process dies, the node crashes, or :meth:`Lease.abandon` is called) it expires
``ttl`` seconds later, and not before.  Real network stores renew in the background;
in-process and simulated stores need no renewal traffic at all.

Guarantees (the conformance suite :mod:`elastic.testing.store` checks them against every
implementation, in both worlds):

* ``get`` blocks until the key exists, else raises :class:`TimeoutError` after
  ``timeout`` seconds (``None`` = wait forever);
* ``add`` and ``compare_set`` are atomic with respect to every other operation;
* ``compare_set(key, expected, desired)`` sets ``desired`` iff the current value equals
  ``expected`` (``None`` = "the key is absent"), and returns the value after the
  operation — torch's semantics;
* ``multi_get`` waits for all keys; ``multi_set`` is applied as one revision;
* leased keys vanish ``ttl`` after the owner stops renewing, not before.

A wake and the read that follows it: ``watch_snapshot``
--------------------------------------------------------
A waiter that wakes almost always reads at once (the rendezvous: a joiner its round's
own keys, a member its round's wait list).  A store that can answers both in one round
trip with the optional operation ``watch_snapshot(prefix, after, read_prefix,
timeout)`` (:class:`WatchSnapshotStore`; not part of :class:`Store`, so a store written
before it keeps working).  Its invariant:

* it waits as ``watch(prefix, after, timeout)`` does (for a mutation under ``prefix``
  with revision > ``after``; a compacted history wakes it at once; :class:`TimeoutError`
  after ``timeout``) and returns ``(rev, items)``: ``items`` is exactly what
  ``snapshot(read_prefix)`` returns at revision ``rev``, and ``rev`` is at least the
  revision that woke it (no later mutation is in ``items``; a ``watch`` from ``rev``
  sees every one).  ``rev`` is the woken revision itself where the store reads at the
  wake (etcd: a range at the event's revision), or the store's revision at the instant
  it read (the in-memory and network stores, whose host reads when the watch wakes,
  before it answers).

:func:`watch_snapshot_op` gives the operation of any store: its own, else ``watch`` then
``snapshot`` (two round trips, the same invariant: the snapshot's revision is at least
the woken one).  Native: :class:`~elastic.memstore.MemoryStore` and the simulator's
client (one simulated round trip), the network store (one wire op, answered by the host
at the wake; a host too old to have it is detected at ``hello`` and the client falls
back), etcd (a watch, then a range at the event's revision: two RPCs inside the store,
one operation to its caller), the polled backend's store (one read of its blob gives
both: :class:`~elastic.rendezvous.backend_store.BackendStore`); a
:class:`~elastic.rendezvous.prefix_store.PrefixStore` forwards it.  The conformance
suite checks the invariant on every store, through :func:`watch_snapshot_op`.

An arrival in one operation: ``arrive``
---------------------------------------
Joining a rendezvous round is three steps: count the arrival (``add``), write the
joiner's leased key (``set``), and learn how many live joiners came before.  Apart, the
last step must read every joiner's key (a joiner before may have counted itself and not
written yet), O(N) per arrival.  A store that can does all three as one operation, the
optional ``arrive(counter, key, value, under, lease=)`` (:class:`ArriveStore`).  Its
invariant:

* one revision: the counter's new value ``n`` and ``key`` are written together, then the
  keys under ``under`` are counted, with nothing in between; it returns ``(n, rev,
  present, marked)``: ``rev`` the revision after it, ``present`` the keys under
  ``under`` (``key`` among them if it is under it), ``marked`` whether ``under`` itself
  is a key.  So when every arrival goes through it, ``present`` counts exactly the live
  arrivals up to this one.

Native: the in-memory store and the simulator's client (one simulated round trip), the
network store (one wire op, not resent after a broken connection, as ``add``; a host too
old to have it is refused locally with :class:`~elastic.errors.StoreUnsupportedError`
and nothing is sent), etcd (one transaction fenced on the counter, as its ``add``), the
polled backend's store (one fenced write of its blob).  :func:`arrive_op` finds it; a
caller keeps its own protocol for a store without it — the steps cannot be emulated
apart.  The conformance suite checks it, and its atomicity under racing clients, on
every store that has it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

__all__ = [
    "ArriveOp",
    "ArriveStore",
    "Lease",
    "Store",
    "WatchSnapshot",
    "WatchSnapshotStore",
    "arrive_op",
    "watch_snapshot_op",
]


@runtime_checkable
class Lease(Protocol):
    """A liveness token; keys attached to it vanish when it expires."""

    id: int
    ttl: float

    def alive(self) -> bool:
        """True while the lease has not expired or been revoked."""
        ...

    def abandon(self) -> None:
        """Stop renewing, as a dead owner would: the lease expires ``ttl`` from now."""

    async def revoke(self) -> None:
        """Expire now (a graceful leave): its keys vanish at once."""


class Store(Protocol):
    """A key-value store shared by the agents of one job."""

    async def set(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        """Set ``key``; with ``lease`` the key vanishes when the lease expires."""

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until set; :class:`TimeoutError` after ``timeout``."""
        ...

    async def try_get(self, key: str) -> bytes | None:
        """The value of ``key`` now, or ``None``."""
        ...

    async def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (absent = 0); return the sum."""
        ...

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        """Set ``desired`` iff the value is ``expected``; return the value afterwards.

        With ``lease``, a successful set attaches the key to it in the same operation (as
        ``set(lease=)`` does): a claim written this way can never outlive its owner, even
        if the owner dies right after it."""
        ...

    async def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Return once every key exists; :class:`TimeoutError` after ``timeout``."""

    async def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""
        ...

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """The values of ``keys`` in order, waiting for all of them."""
        ...

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        """Set several keys as one revision."""

    async def grant_lease(self, ttl: float) -> Lease:
        """A new lease held by the caller, expiring ``ttl`` after its owner stops renewing."""
        ...

    async def snapshot(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        """(current revision, every key under ``prefix`` with its value)."""
        ...

    async def watch(self, prefix: str, after: int, timeout: float | None = None) -> int:
        """Wait for a mutation of a key under ``prefix`` with revision > ``after``; return it."""
        ...


#: ``watch_snapshot``'s signature: (prefix, after, read_prefix, timeout) -> (rev, items)
WatchSnapshot = Callable[[str, int, str, float | None], Awaitable[tuple[int, dict[str, bytes]]]]


class WatchSnapshotStore(Store, Protocol):
    """A store that answers a wake and the read that follows it in one round trip."""

    async def watch_snapshot(
        self, prefix: str, after: int, read_prefix: str, timeout: float | None = None
    ) -> tuple[int, dict[str, bytes]]:
        """Wait as :meth:`Store.watch` does; then ``read_prefix``'s snapshot at the wake.

        Returns ``(rev, items)``: ``items`` is ``read_prefix``'s keys and values at
        revision ``rev``, and ``rev`` is at least the revision that woke the watch (the
        module docstring).
        """
        ...


def watch_snapshot_op(store: Store) -> WatchSnapshot:
    """``store``'s ``watch_snapshot``: its own if it has one, else ``watch`` then
    ``snapshot`` (two round trips, the same invariant).  Look it up once per caller, not
    per call (the rendezvous does so per handler)."""
    native = getattr(store, "watch_snapshot", None)
    if callable(native):
        op: WatchSnapshot = native
        return op

    async def fallback(
        prefix: str, after: int, read_prefix: str, timeout: float | None = None
    ) -> tuple[int, dict[str, bytes]]:
        await store.watch(prefix, after, timeout)
        return await store.snapshot(read_prefix)

    return fallback


class ArriveOp(Protocol):
    """``arrive``'s signature (:class:`ArriveStore`)."""

    def __call__(
        self, counter: str, key: str, value: bytes, under: str, *, lease: Lease | None = None
    ) -> Awaitable[tuple[int, int, int, bool]]: ...


class ArriveStore(Store, Protocol):
    """A store that counts, records and counts again an arrival in one operation."""

    async def arrive(
        self, counter: str, key: str, value: bytes, under: str, *, lease: Lease | None = None
    ) -> tuple[int, int, int, bool]:
        """Atomically (one revision): add 1 to the integer at ``counter``; set ``key``
        to ``value`` (attached to ``lease``, as ``set(lease=)``); then count the keys
        under ``under``.  Returns ``(n, rev, present, marked)``: the counter's new value,
        the store's revision after the operation, how many keys are under ``under`` (with
        ``key`` if it is one of them) and whether ``under`` itself is a key.

        Nothing else happens between the three steps, so when every arrival goes through
        it, the keys under ``under`` are exactly the live arrivals up to this one."""
        ...


def arrive_op(store: Store) -> ArriveOp | None:
    """``store``'s ``arrive`` if it has one (look it up once per caller), else ``None``:
    the steps apart are not atomic, so the caller keeps its own protocol for them."""
    native = getattr(store, "arrive", None)
    if callable(native):
        op: ArriveOp = native
        return op
    return None
