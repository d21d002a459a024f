"""torch's ``RendezvousBackend``, and the store port built over any such backend.

A backend (torch's contract) holds one opaque blob: ``get_state() -> (bytes, token) |
None`` and ``set_state(state, token) -> (bytes, token, ok) | None``, a compare-and-set
fenced by the token.  A user's own backend (Redis, a Kubernetes ConfigMap, a database
row) implements those two methods and nothing else.

:class:`BackendStore` turns such a backend into the store port, so that
``DynamicRendezvousHandler.from_backend`` runs the very same rendezvous code as the
store-port handler (same decisions, same ranks) over a backend.

Theory of operation
-------------------
* The blob is JSON (never pickle): ``{"version": 1, "rev": r, "kv": {key: [value
  (base64), mod_rev, lease_id]}, "tomb": {key: rev}, "floor": f, "leases": {id: [ttl,
  expires]}, "next_lease": n}``.  Every mutation is one ``set_state`` with the token of the
  state it was computed from; a lost race re-reads and recomputes (optimistic
  concurrency, as torch's backend-driven handler does).
* A backend has no watch and no lease.  Watches poll the blob every ``poll_interval``
  (torch's handler polls too, once a second).  A lease holds its expiry time, which
  its owner pushes to ``now + ttl`` every ``ttl / 3``; any node that reads the blob
  after that time deletes the lease and its keys.  Times are the clock port's
  ``now()``, compared across nodes — as torch compares its nodes' heartbeat times — so
  in real mode :meth:`DynamicRendezvousHandler.from_backend` runs on wall time
  (:class:`~elastic.timer.wallclock.WallClock`) and the hosts' clocks must agree to
  well within the time-to-live (NTP).
* Deletions leave a tombstone (the last 1,024) so a watch sees them; a watch older than
  the oldest tombstone (``floor``) returns at once (a spurious wake-up is allowed by the
  port, a missed one is not).
* ``watch_snapshot`` (:class:`~elastic.store.WatchSnapshotStore`) answers from the blob
  read that saw the change: a wake and its read cost one ``get_state``, not two.

Costs: each operation reads the whole blob (one ``get_state``), each mutation writes it
(one ``set_state``): O(N) bytes for N nodes, as torch's.  This is why ``elastic run``
uses the store-port handler over a real store (watches and leases, no polling) and
keeps this one for torch's documented ``from_backend`` path.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from elastic.clock import Cancelled, Clock, Task
from elastic.errors import StoreClosedError, StoreError
from elastic.rendezvous.api import RendezvousStateError, SyncRunner
from elastic.store import Lease

__all__ = ["BackendStore", "RendezvousBackend", "Token"]

Token = Any
T = TypeVar("T")

#: A rendezvous blob bigger than this is not ours (torch has no limit; we read it whole).
MAX_STATE_BYTES = 4 * 1024 * 1024
_TOMBS = 1024
_VERSION = 1


class RendezvousBackend(ABC):
    """Represent a backend that holds the rendezvous state (torch's contract).

    Implement ``name`` and either torch's blocking ``get_state``/``set_state`` (a user's
    backend) or their ``*_async`` twins (backends over the store port).  The blocking
    methods of an asynchronous backend need ``sync_runner`` (real mode); the
    asynchronous methods of a blocking backend call it directly.
    """

    sync_runner: SyncRunner | None = None

    @property
    @abstractmethod
    def name(self) -> str:
        """Get the name of the backend."""

    def get_state(self) -> tuple[bytes, Token] | None:
        """Get the rendezvous state: ``(state, fencing token)``, or ``None`` if none."""
        if type(self).get_state_async is RendezvousBackend.get_state_async:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither get_state() nor get_state_async()"
            )
        result: tuple[bytes, Token] | None = self._run(self.get_state_async())
        return result

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """Set the state iff ``token`` is current (``None``: iff there is no state).

        Returns the state now held, its token, and whether ours was written.
        """
        if type(self).set_state_async is RendezvousBackend.set_state_async:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither set_state() nor set_state_async()"
            )
        result: tuple[bytes, Token, bool] | None = self._run(self.set_state_async(state, token))
        return result

    async def get_state_async(self) -> tuple[bytes, Token] | None:
        """:meth:`get_state` for the event loop (a blocking backend is called directly)."""
        return self.get_state()

    async def set_state_async(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """:meth:`set_state` for the event loop (a blocking backend is called directly)."""
        return self.set_state(state, token)

    def _run(self, coro: Any) -> Any:
        if self.sync_runner is None:
            coro.close()
            raise RuntimeError(
                f"{type(self).__name__}: the blocking backend API needs a sync_runner (real "
                "mode); on the event loop await get_state_async()/set_state_async()"
            )
        return self.sync_runner(coro)


class _State:
    """The decoded blob (mutable copy while a mutation is computed)."""

    __slots__ = ("dirty", "floor", "kv", "leases", "next_lease", "rev", "tomb")

    def __init__(
        self,
        rev: int = 0,
        kv: dict[str, tuple[bytes, int, int]] | None = None,
        tomb: dict[str, int] | None = None,
        floor: int = 0,
        leases: dict[int, tuple[float, float]] | None = None,
        next_lease: int = 1,
    ) -> None:
        self.rev = rev
        self.kv = kv if kv is not None else {}
        self.tomb = tomb if tomb is not None else {}
        self.floor = floor
        self.leases = leases if leases is not None else {}
        self.next_lease = next_lease
        self.dirty = False  # set by every edit: an unedited state is not written

    def copy(self) -> _State:
        return _State(
            self.rev, dict(self.kv), dict(self.tomb), self.floor, dict(self.leases), self.next_lease
        )

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        self.kv[key] = (value, self.rev, lease)
        self.tomb.pop(key, None)
        self.dirty = True

    def drop(self, key: str) -> None:
        if self.kv.pop(key, None) is not None:
            self.dirty = True
            self.tomb[key] = self.rev
            if len(self.tomb) > _TOMBS:
                oldest = min(self.tomb, key=self.tomb.__getitem__)
                self.floor = max(self.floor, self.tomb.pop(oldest))

    def expire(self, lease: int) -> None:
        if self.leases.pop(lease, None) is not None:
            self.dirty = True
        for key in [k for k, (_, _, lid) in self.kv.items() if lid == lease]:
            self.drop(key)

    def encode(self) -> bytes:
        obj = {
            "version": _VERSION,
            "rev": self.rev,
            "kv": {
                k: [base64.b64encode(v).decode(), mod, lid] for k, (v, mod, lid) in self.kv.items()
            },
            "tomb": self.tomb,
            "floor": self.floor,
            "leases": {str(i): [ttl, exp] for i, (ttl, exp) in self.leases.items()},
            "next_lease": self.next_lease,
        }
        return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()

    @staticmethod
    def decode(raw: bytes, where: str) -> _State:
        def bad(why: str) -> RendezvousStateError:
            return RendezvousStateError(
                f"The rendezvous state in the {where} backend is corrupt: {why}. Another "
                "program may be using this run id; use another run id or delete the state."
            )

        if len(raw) > MAX_STATE_BYTES:
            raise bad(f"{len(raw)} bytes exceeds the {MAX_STATE_BYTES}-byte limit")
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            raise bad(f"not JSON ({bytes(raw[:40])!r})") from None
        if not isinstance(obj, dict) or obj.get("version") != _VERSION:
            raise bad(f"expected a JSON object with version {_VERSION}")
        try:
            kv = {
                str(k): (base64.b64decode(v, validate=True), int(mod), int(lid))
                for k, (v, mod, lid) in obj["kv"].items()
            }
            leases = {int(i): (float(ttl), float(exp)) for i, (ttl, exp) in obj["leases"].items()}
            return _State(
                int(obj["rev"]),
                kv,
                {str(k): int(r) for k, r in obj["tomb"].items()},
                int(obj["floor"]),
                leases,
                int(obj["next_lease"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as e:
            raise bad(f"{type(e).__name__}: {e}") from None


def _int_at(st: _State, key: str) -> int:
    """The integer at ``key`` (absent: 0), as ``add`` reads it."""
    item = st.kv.get(key)
    try:
        return int(item[0]) if item is not None else 0
    except ValueError:
        raise StoreError(f"add({key!r}): the value is not an integer") from None


def _first_change(st: _State, prefix: str, after: int) -> int | None:
    """The first revision after ``after`` that changed a key under ``prefix``, as the blob
    knows it (None: none).  The blob keeps each key's last change and the last
    tombstones: the earliest of those is the first change, or, where a key changed twice
    since, a later one; a watch older than the tombstones kept gets the blob's revision
    (both as from a compacted history: nothing is missed)."""
    if after < st.floor:
        return st.rev
    return min(
        (
            *(mod for k, (_, mod, _) in st.kv.items() if mod > after and k.startswith(prefix)),
            *(rev for k, rev in st.tomb.items() if rev > after and k.startswith(prefix)),
        ),
        default=None,
    )


class _BackendLease(Lease):
    """A lease held in the blob: its owner pushes its expiry every ``ttl / 3``."""

    def __init__(self, store: BackendStore, lease_id: int, ttl: float) -> None:
        self.id = lease_id
        self.ttl = ttl
        self._store = store
        self._lost = False
        self._renewer: Task[None] | None = store._clock.spawn(
            self._renew(), name=f"lease-{lease_id}-renewal"
        )
        self._last: Task[None] | None = None
        self._dies_at: float | None = None  # abandoned: when it expires

    def alive(self) -> bool:
        # abandoned: nobody renews it, the others expire it at _dies_at
        return not self._lost and (
            self._dies_at is None or self._store._clock.now() < self._dies_at
        )

    def abandon(self) -> None:
        self._stop()
        if self._dies_at is None:
            self._dies_at = self._store._clock.now() + self.ttl
        if not self._lost and not self._store._closed:
            # One last renewal, so the lease expires ttl from now, as the port promises
            # (its last beat may be up to ttl/3 old); referenced until it has run.
            self._last = self._store._clock.spawn(
                self._renew_once(), name=f"lease-{self.id}-last-renewal"
            )

    def _stop(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None

    async def revoke(self) -> None:
        self._stop()
        self._lost = True
        await self._store._mutate(lambda st: st.expire(self.id))

    def _beat(self, st: _State) -> bool:
        if self.id not in st.leases:
            return False
        ttl, _ = st.leases[self.id]
        st.leases[self.id] = (ttl, self._store._clock.now() + ttl)
        st.dirty = True
        return True

    async def _renew_once(self) -> None:
        with contextlib.suppress(StoreError):  # closed, or the backend failed: no beat
            if not await self._store._mutate(self._beat):
                self._lost = True

    async def _renew(self) -> None:
        try:
            while True:
                await self._store._clock.sleep(self.ttl / 3)
                if not await self._store._mutate(self._beat):
                    self._lost = True  # expired by the others: the owner must re-join
                    return
        except Cancelled:
            raise


class BackendStore:
    """The store port over a :class:`RendezvousBackend` (see the module docstring)."""

    def __init__(
        self, backend: RendezvousBackend, clock: Clock, *, poll_interval: float = 1.0
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"The poll interval ({poll_interval}) must be positive.")
        self._backend = backend
        self._clock = clock
        self._poll = poll_interval
        self._mine: dict[int, _BackendLease] = {}
        self._closed = False
        # our last write whose set_state() returned None (no verdict): torch's state
        # holder then adopts the state it wrote, unconfirmed, with no token; it stays our
        # view for as long as the backend reports no state (get_state() None)
        self._unconfirmed: _State | None = None

    @property
    def backend(self) -> RendezvousBackend:
        return self._backend

    def close(self) -> None:
        """This node stops using the backend: its leases are no longer renewed (they
        expire ``ttl`` later, as a dead owner's), and every later operation, a wait in
        progress included, raises :class:`StoreClosedError`.  The blob is shared: it
        stays as it is for the other nodes."""
        self._closed = True
        for lease in list(self._mine.values()):
            lease._stop()
            if lease._dies_at is None:  # its last beat's ttl: at most this far away
                lease._dies_at = self._clock.now() + lease.ttl

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(
                f"this store over the {self._backend.name} backend is closed; create a new one"
            )

    # -- the blob ----------------------------------------------------------------------
    def _decode(self, got: tuple[bytes, Token] | None) -> tuple[_State, Token | None]:
        if got is None:
            held = self._unconfirmed
            return (held.copy() if held is not None else _State()), None
        self._unconfirmed = None
        raw, token = got
        return _State.decode(bytes(raw), self._backend.name), token

    def _dead_leases(self, st: _State) -> list[int]:
        now = self._clock.now()
        return [lid for lid, (_, exp) in st.leases.items() if exp <= now and not self._holds(lid)]

    def _holds(self, lid: int) -> bool:
        lease = self._mine.get(lid)
        return lease is not None and lease._renewer is not None

    async def _mutate(self, change: Callable[[_State], T]) -> T:
        """Apply ``change`` (and expire dead leases) with one fenced write; retry on a race.

        ``change`` edits the state in place and returns its result; a state it left
        unedited (and with no dead lease) is not written.
        """
        result, _ = await self._apply(change)
        return result

    async def _apply(self, change: Callable[[_State], T]) -> tuple[T, _State]:
        self._check_open()
        got = await self._backend.get_state_async()
        while True:
            st, token = self._decode(got)
            new = st.copy()
            new.rev += 1
            for lid in self._dead_leases(st):
                new.expire(lid)
            result = change(new)
            if not new.dirty:
                return result, st
            written = await self._backend.set_state_async(new.encode(), token)
            if written is None:
                # no verdict (torch's contract allows it): as torch's state holder does,
                # go on from the state we wrote, unconfirmed and without a token
                new.dirty = False
                self._unconfirmed = new
                return result, new
            raw, new_token, ok = written
            if ok:
                return result, new
            if token is not None and new_token == token:
                raise StoreError(
                    f"the {self._backend.name} backend refused a write fenced by its current "
                    "token; its set_state() does not keep torch's contract"
                )
            got = (raw, new_token)

    async def _read(self) -> _State:
        _, st = await self._apply(lambda st: None)
        return st

    async def _until(
        self, ready: Callable[[_State], T | None], timeout: float | None, what: str
    ) -> T:
        deadline = None if timeout is None else self._clock.now() + timeout
        while True:
            value = ready(await self._read())
            if value is not None:
                return value
            left = None if deadline is None else deadline - self._clock.now()
            if left is not None and left <= 0:
                raise TimeoutError(f"{what} within {timeout}s")
            await self._clock.sleep(self._poll if left is None else min(self._poll, left))
            self._check_open()

    # -- the port ----------------------------------------------------------------------
    async def set(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        lid = self._own(lease)

        def put(st: _State) -> None:
            if lid and lid not in st.leases:
                raise StoreError(f"set({key!r}): lease {lid} has expired")
            st.put(key, bytes(value), lid)

        await self._mutate(put)

    def _own(self, lease: Lease | None) -> int:
        if lease is None:
            return 0
        if not isinstance(lease, _BackendLease) or lease._store is not self:
            raise StoreError("that lease was granted by another store")
        return lease.id

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        def ready(st: _State) -> bytes | None:
            item = st.kv.get(key)
            return None if item is None else item[0]

        return await self._until(ready, timeout, f"the key {key!r} was not set")

    async def try_get(self, key: str) -> bytes | None:
        item = (await self._read()).kv.get(key)
        return None if item is None else item[0]

    async def add(self, key: str, amount: int) -> int:
        def add(st: _State) -> int:
            new = _int_at(st, key) + amount
            st.put(key, str(new).encode())
            return new

        return await self._mutate(add)

    async def arrive(
        self, counter: str, key: str, value: bytes, under: str, *, lease: Lease | None = None
    ) -> tuple[int, int, int, bool]:
        """An arrival in one fenced write of the blob (:class:`~elastic.store.ArriveStore`)."""
        lid = self._own(lease)

        def arrive(st: _State) -> tuple[int, int, bool]:
            n = _int_at(st, counter) + 1
            if lid and lid not in st.leases:
                raise StoreError(f"set({key!r}): lease {lid} has expired")
            st.put(counter, str(n).encode())
            st.put(key, bytes(value), lid)
            return n, sum(1 for k in st.kv if k.startswith(under)), under in st.kv

        (n, present, marked), st = await self._apply(arrive)
        return n, st.rev, present, marked

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        lid = self._own(lease)

        def cas(st: _State) -> bytes:
            item = st.kv.get(key)
            current = None if item is None else item[0]
            if current == expected:
                if lid and lid not in st.leases:
                    raise StoreError(f"compare_set({key!r}): lease {lid} has expired")
                st.put(key, bytes(desired), lid)
                return bytes(desired)
            return current if current is not None else b""

        return await self._mutate(cas)

    async def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        await self._until(
            lambda st: True if all(k in st.kv for k in keys) else None,
            timeout,
            f"the keys {list(keys)} were not all set",
        )

    async def delete(self, key: str) -> bool:
        def drop(st: _State) -> bool:
            existed = key in st.kv
            st.drop(key)
            return existed

        return await self._mutate(drop)

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        return await self._until(
            lambda st: [st.kv[k][0] for k in keys] if all(k in st.kv for k in keys) else None,
            timeout,
            f"the keys {list(keys)} were not all set",
        )

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        def put(st: _State) -> None:
            for k, v in items.items():
                st.put(k, bytes(v))

        await self._mutate(put)

    async def grant_lease(self, ttl: float) -> Lease:
        if not ttl > 0:
            raise StoreError(f"lease ttl must be positive, got {ttl!r}")

        def grant(st: _State) -> int:
            lid = st.next_lease
            st.next_lease += 1
            st.leases[lid] = (float(ttl), self._clock.now() + ttl)
            st.dirty = True
            return lid

        lid = await self._mutate(grant)
        lease = _BackendLease(self, lid, ttl)
        self._mine[lid] = lease
        return lease

    async def snapshot(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        st = await self._read()
        return st.rev, {k: v for k, (v, _, _) in st.kv.items() if k.startswith(prefix)}

    async def watch(self, prefix: str, after: int, timeout: float | None = None) -> int:
        return await self._until(
            lambda st: _first_change(st, prefix, after),
            timeout,
            f"nothing under {prefix!r} changed",
        )

    async def watch_snapshot(
        self, prefix: str, after: int, read_prefix: str, timeout: float | None = None
    ) -> tuple[int, dict[str, bytes]]:
        """:meth:`watch`, and ``read_prefix``'s snapshot from the very blob read that saw
        the change (same revision, :class:`~elastic.store.WatchSnapshotStore`): no
        second ``get_state``."""

        def changed(st: _State) -> tuple[int, dict[str, bytes]] | None:
            if _first_change(st, prefix, after) is None:
                return None
            return st.rev, {k: v for k, (v, _, _) in st.kv.items() if k.startswith(read_prefix)}

        return await self._until(changed, timeout, f"nothing under {prefix!r} changed")
