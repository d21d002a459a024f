"""An in-memory store implementing the Store port over any Clock.

The same class serves both worlds: waits are one-shot events of the clock it is given,
so in real mode it runs on asyncio (the single-node agent keeps its store in its own
process) and in the simulator on simpy (``sim.store`` adds a store host with latency,
outages and partitions in front of it).

Invariants
----------
* Every mutation (set, add, compare_set that writes, delete, lease expiry) gets the
  next revision; ``multi_set`` is one revision.  Revisions never decrease.
* A waiter is woken exactly once, by the first mutation that can satisfy it; waiters
  re-check their condition (a get woken by a set that a delete undid waits again).
* Watches are indexed by prefix: a mutation costs O(distinct watched prefixes), not
  O(watchers) — a 4,000-node rendezvous must stay O(N).
* The mutation log keeps the last mutations, at most ``log_limit`` of them and, below
  that, :data:`LOG_PER_KEY` per live key (at least :data:`LOG_MIN`): a long-running
  store's memory follows what it holds, not how long it ran (a crash-looping agent's
  embedded store is flat over its restarts), while a large rendezvous keeps several
  rounds of history.  A watch older than the log returns at once with the current
  revision (as etcd reports a compacted revision), and the caller re-reads with
  :meth:`snapshot`.
* Leased keys vanish when their lease expires: ``ttl`` after :meth:`_Lease.abandon`
  (the owner stopped renewing) or after its last :meth:`_Lease.refresh`, at once on
  :meth:`_Lease.revoke`.  Expiry is one timer per abandoned lease, never a sweep; a
  refresh moves the deadline and the same timer sleeps on.
* While expiry is paused (:meth:`MemoryStore.pause_expiry`: the store's host is down, so
  nothing runs to expire a lease) no lease expires; when it resumes every abandoned lease
  expires no sooner than ``ttl`` after the resume — as etcd's new leader extends every
  lease by its full TTL when it takes over (``lessor.Promote``).
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from elastic.clock import Clock, OneShot
from elastic.errors import StoreClosedError, StoreError
from elastic.store import Lease

__all__ = ["MemoryStore", "StoreStats"]

MAX_VALUE_BYTES = 4 * 1024 * 1024
#: the mutation log's bound below ``log_limit``: this many entries per live key, at least
#: LOG_MIN (a round of an N-node rendezvous writes about 5 entries per node and holds
#: about 4 keys per node, so several rounds are kept)
LOG_PER_KEY = 16
LOG_MIN = 1024
#: watched prefixes whose changes are indexed at once (MemoryStore._changed_since)
_MAX_PREFIX_INDEXES = 64


class StoreStats:
    """Counters a benchmark reads: operations, bytes written and keys read by prefix."""

    __slots__ = ("bytes_written", "keys_read", "ops", "watch_wakeups")

    def __init__(self) -> None:
        self.ops = 0
        self.bytes_written = 0
        self.watch_wakeups = 0
        self.keys_read = 0  # keys returned by prefix reads (snapshot, watch_snapshot)


class _Lease(Lease):
    __slots__ = ("_gen", "_keys", "_store", "expires_at", "id", "state", "ttl")

    def __init__(self, store: MemoryStore, lease_id: int, ttl: float) -> None:
        self._store = store
        self.id = lease_id
        self.ttl = ttl
        self.state = "alive"  # alive | abandoned | expired
        self.expires_at: float | None = None
        self._keys: set[str] = set()
        self._gen = 0

    def alive(self) -> bool:
        return self.state != "expired"

    def abandon(self) -> None:
        self.abandon_since(None)

    def abandon_since(self, renewed_at: float | None) -> None:
        """The owner's renewals stopped reaching the store: the lease expires ``ttl`` after
        the last one that did (``renewed_at``, not later than now; None: now)."""
        if self.state != "alive":
            return
        self.state = "abandoned"
        self._gen += 1
        now = self._store._clock.now()
        first = self.ttl
        if renewed_at is not None and renewed_at < now:
            first = max(0.0, renewed_at + self.ttl - now)
            self.expires_at = renewed_at + self.ttl
        else:
            self.expires_at = now + self.ttl
        self._store._clock.spawn(
            self._expire_later(self._gen, first), name=f"lease-{self.id}-expiry"
        )

    def resume(self) -> None:
        """The owner's renewals reach the store again (a healed partition)."""
        if self.state == "abandoned":
            self.state = "alive"
            self.expires_at = None
            self._gen += 1

    def refresh(self) -> None:
        """A renewal reached the store: an abandoned lease now expires ``ttl`` from now.

        No new timer: the one started by :meth:`abandon` sleeps on when it finds the
        deadline moved (a network store's server renews this way; the simulator never
        calls it, so it costs the simulation nothing).
        """
        if self.state != "abandoned":
            return
        store = self._store
        now = store._clock.now()
        deadline = max(self.expires_at or 0.0, store._expiry_resumed_at + self.ttl)
        if store._expiry_paused is None and now >= deadline:
            # too late: the lease died at its deadline, its timer just has not run yet
            # (a store host that was stopped sees the renewal and the timer at once)
            store._expire(self)
            return
        self.expires_at = now + self.ttl

    async def _expire_later(self, gen: int, first: float) -> None:
        store = self._store
        clock = store._clock
        await clock.sleep(first)
        while self._gen == gen and self.state == "abandoned":
            if store._expiry_paused is not None:
                await store._expiry_paused.wait()  # no store runs: nothing expires
                continue
            deadline = max(self.expires_at or 0.0, store._expiry_resumed_at + self.ttl)
            left = deadline - clock.now()
            if left <= 0:
                store._expire(self)
                return
            await clock.sleep(left)  # refreshed meanwhile: sleep to the new deadline

    async def revoke(self) -> None:
        if self.state != "expired":
            self._store._expire(self)


class MemoryStore:
    """The Store port, in memory, on the given clock."""

    def __init__(self, clock: Clock, *, log_limit: int = 100_000) -> None:
        self._clock = clock
        self._data: dict[str, bytes] = {}
        # keys in order, so a prefix snapshot costs O(log n + k), not a scan of every key
        self._sorted: list[str] = []
        self._lease_of: dict[str, _Lease] = {}
        self._revision = 0
        self._log_revs: list[int] = []
        self._log_keys: list[str] = []
        self._log_limit = log_limit
        # prefix -> [lo, upto, revisions in (lo, upto] that changed a key under it]
        self._prefix_revs: dict[str, list[Any]] = {}
        self._key_waiters: dict[str, list[OneShot]] = {}
        self._watchers: dict[str, list[OneShot]] = {}
        self._next_lease = 1
        self._closed = False
        self._expiry_paused: OneShot | None = None
        self._expiry_resumed_at = float("-inf")
        self.stats = StoreStats()

    # -- internals ---------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed; create a new one")

    def _mutated(self, keys: Sequence[str]) -> None:
        self._revision += 1
        rev = self._revision
        for k in keys:
            self._log_revs.append(rev)
            self._log_keys.append(k)
        size = len(self._log_revs)
        cut = 0
        if size > self._log_limit:
            # down to four fifths of the limit, for the same reason as below: cut to the
            # limit, every mutation past it shifted the whole log (7 % of the CPU of a
            # 2,048-node run, whose soft bound is above the default limit)
            cut = size - self._log_limit + self._log_limit // 5
        elif size > LOG_MIN + LOG_MIN // 4:
            soft = max(LOG_MIN, LOG_PER_KEY * len(self._data))
            # trimmed by a fifth at a time: a cut shifts the whole list, so one per
            # mutation would cost O(size) each
            if size > soft + soft // 4:
                cut = size - soft
        if cut:
            # whole revisions only: a watch from just before a revision that changed
            # several keys must see all of them or learn that the log was compacted
            revs = self._log_revs
            while cut < len(revs) and revs[cut] == revs[cut - 1]:
                cut += 1
            del self._log_revs[:cut]
            del self._log_keys[:cut]
        for k in keys:
            waiters = self._key_waiters.pop(k, None)
            if waiters:
                for w in waiters:
                    w.set(rev)
        if self._watchers:
            for prefix in [p for p in self._watchers if any(k.startswith(p) for k in keys)]:
                for w in self._watchers.pop(prefix):
                    self.stats.watch_wakeups += 1
                    w.set(rev)

    def _put(self, key: str, value: bytes, lease: _Lease | None) -> None:
        if not isinstance(value, bytes | bytearray):
            raise TypeError(f"store values are bytes, got {type(value).__name__} for {key!r}")
        if len(value) > MAX_VALUE_BYTES:
            raise StoreError(
                f"value for {key!r} is {len(value)} bytes; the limit is {MAX_VALUE_BYTES}"
            )
        if key not in self._data:
            bisect.insort(self._sorted, key)
        self._data[key] = bytes(value)
        self.stats.bytes_written += len(key) + len(value)
        old = self._lease_of.pop(key, None)
        if old is not None:
            old._keys.discard(key)
        if lease is not None:
            if not lease.alive():
                raise StoreError(f"lease {lease.id} has expired; cannot attach {key!r} to it")
            self._lease_of[key] = lease
            lease._keys.add(key)

    def _expire(self, lease: _Lease) -> None:
        lease.state = "expired"
        keys = sorted(lease._keys)
        lease._keys.clear()
        for k in keys:
            if self._data.pop(k, None) is not None:
                self._unindex(k)
            self._lease_of.pop(k, None)
        if keys:
            self._mutated(keys)

    async def _wait_key(self, key: str, timeout: float | None) -> None:
        """Wait until ``key`` exists."""
        if key in self._data:
            return
        if timeout is None:
            while key not in self._data:
                self._check_open()
                ev = self._clock.event()
                self._key_waiters.setdefault(key, []).append(ev)
                await ev.wait()
            return
        deadline = self._clock.now() + timeout
        while key not in self._data:
            self._check_open()
            remaining = deadline - self._clock.now()
            if remaining <= 0:
                raise TimeoutError(f"key {key!r} was not set within {timeout:g}s")
            ev = self._clock.event()
            self._key_waiters.setdefault(key, []).append(ev)
            try:
                await self._clock.timeout(remaining, ev.wait())
            except TimeoutError:
                raise TimeoutError(f"key {key!r} was not set within {timeout:g}s") from None

    # -- the port ------------------------------------------------------------------
    # Each operation that never waits has a synchronous twin, ``<op>_nowait``, which the
    # port's coroutine runs: the simulator's store client calls it at the end of its round
    # trip, without a coroutine per operation (sim/store.py).
    async def set(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        self.set_nowait(key, value, lease)

    def set_nowait(self, key: str, value: bytes, lease: Lease | None = None) -> None:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        self._put(key, value, self._own(lease))
        self._mutated((key,))

    def _own(self, lease: Lease | None) -> _Lease | None:
        if lease is None:
            return None
        if not isinstance(lease, _Lease) or lease._store is not self:
            raise StoreError("that lease was granted by another store")
        return lease

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        await self._wait_key(key, timeout)
        return self._data[key]

    async def try_get(self, key: str) -> bytes | None:
        return self.try_get_nowait(key)

    def try_get_nowait(self, key: str) -> bytes | None:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        return self._data.get(key)

    async def add(self, key: str, amount: int) -> int:
        return self.add_nowait(key, amount)

    def add_nowait(self, key: str, amount: int) -> int:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        new = self._int_at(key) + amount
        self._put(key, str(new).encode(), None)
        self._mutated((key,))
        return new

    def _int_at(self, key: str) -> int:
        """The integer at ``key`` (absent: 0), as ``add`` reads it."""
        cur = self._data.get(key)
        try:
            return int(cur) if cur is not None else 0
        except ValueError:
            shown = (cur or b"")[:40]
            raise StoreError(f"add({key!r}): the value {shown!r} is not an integer") from None

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        return self.compare_set_nowait(key, expected, desired, lease)

    def compare_set_nowait(
        self, key: str, expected: bytes | None, desired: bytes, lease: Lease | None = None
    ) -> bytes:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        owner = self._own(lease)
        cur = self._data.get(key)
        if cur == expected:
            self._put(key, desired, owner)
            self._mutated((key,))
            return bytes(desired)
        return cur if cur is not None else b""

    async def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        if timeout is None:
            for k in keys:
                await self._wait_key(k, None)
            return
        deadline = self._clock.now() + timeout
        for k in keys:
            try:
                await self._wait_key(k, max(0.0, deadline - self._clock.now()))
            except TimeoutError:
                missing = [x for x in keys if x not in self._data]
                raise TimeoutError(
                    f"keys {missing[:5]!r}{'…' if len(missing) > 5 else ''} "
                    f"were not set within {timeout:g}s"
                ) from None

    async def delete(self, key: str) -> bool:
        return self.delete_nowait(key)

    def delete_nowait(self, key: str) -> bool:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        if key not in self._data:
            return False
        self._unindex(key)
        self._forget(key)
        self._mutated((key,))
        return True

    def _forget(self, key: str) -> None:
        """Drop ``key``'s value and its lease's hold on it (the sorted index is the caller's)."""
        del self._data[key]
        old = self._lease_of.pop(key, None)
        if old is not None:
            old._keys.discard(key)

    async def delete_prefix(self, prefix: str) -> int:
        """:meth:`delete_prefix_nowait`, as an operation of the port's kind."""
        return self.delete_prefix_nowait(prefix)

    def delete_prefix_nowait(self, prefix: str) -> int:
        """Delete every key under ``prefix`` as one mutation (one revision); how many.

        Not part of the Store port (etcd has it as a ranged delete, a TCP store has not):
        a store that has it lets the rendezvous drop a past round in one operation
        (:mod:`elastic.rendezvous.dynamic_rendezvous`) instead of one per key.
        """
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        keys = self._sorted
        i, j = self._range(prefix)
        gone = keys[i:j]
        if not gone:
            return 0
        del keys[i:j]
        for k in gone:
            self._forget(k)
        self._mutated(gone)
        return len(gone)

    async def arrive(
        self, counter: str, key: str, value: bytes, under: str, *, lease: Lease | None = None
    ) -> tuple[int, int, int, bool]:
        """:meth:`arrive_nowait`, as an operation of the port's kind."""
        return self.arrive_nowait(counter, key, value, under, lease)

    def arrive_nowait(
        self, counter: str, key: str, value: bytes, under: str, lease: Lease | None = None
    ) -> tuple[int, int, int, bool]:
        """An arrival, as one mutation (one revision): add 1 to the integer at
        ``counter``, set ``key`` to ``value`` (on ``lease``), then count the keys under
        ``under``; return (the counter's new value, the revision, how many keys are under
        ``under``, whether ``under`` itself is a key) — :class:`~elastic.store.ArriveStore`.
        """
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        owner = self._own(lease)
        if owner is not None and not owner.alive():
            raise StoreError(f"lease {owner.id} has expired; cannot attach {key!r} to it")
        base = self._int_at(counter)
        self._put(key, value, owner)
        self._put(counter, str(base + 1).encode(), None)
        self._mutated((counter, key))
        i, j = self._range(under)
        return base + 1, self._revision, j - i, i < j and self._sorted[i] == under

    async def count_prefix(self, prefix: str) -> tuple[int, int, bool]:
        """:meth:`count_prefix_nowait`, as an operation of the port's kind."""
        return self.count_prefix_nowait(prefix)

    def count_prefix_nowait(self, prefix: str) -> tuple[int, int, bool]:
        """(current revision, how many keys are under ``prefix``, whether ``prefix`` itself
        is a key): what a caller that reads no value learns from :meth:`snapshot`, in
        O(log n) and without copying the keys.

        Not part of the Store port (etcd has it as a ``count_only`` range, a TCP store has
        not): the rendezvous's parked nodes count a round's members with it
        (:mod:`elastic.rendezvous.dynamic_rendezvous`), where a snapshot copied every
        member's key and value (a million dict entries a day at 2,048 nodes).
        """
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        i, j = self._range(prefix)
        return self._revision, j - i, i < j and self._sorted[i] == prefix

    def _range(self, prefix: str) -> tuple[int, int]:
        """The keys under ``prefix`` are ``self._sorted[i:j]``: two bisections."""
        keys = self._sorted
        n = len(keys)
        if not prefix:
            return 0, n
        i = j = bisect.bisect_left(keys, prefix)
        # Performance: most prefixes read hold a key or two (a round's own keys, its wait
        # list): stepped over; a longer run (a round's members) is bisected
        stop = min(i + 4, n)
        while j < stop and keys[j].startswith(prefix):
            j += 1
        if j < stop or j == n:
            return i, j
        if prefix[-1] == "\U0010ffff":  # no successor: scan (never a rendezvous prefix)
            while j < n and keys[j].startswith(prefix):
                j += 1
            return i, j
        # every key under prefix sorts before prefix with its last character bumped
        return i, bisect.bisect_left(keys, prefix[:-1] + chr(ord(prefix[-1]) + 1), j)

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        data = self._data
        if not self._closed:
            # Performance: keys that are all there already (a round's master address,
            # read by every member of every round) need no wait and no deadline
            for k in keys:
                if k not in data:
                    break
            else:
                self.stats.ops += 1
                return [data[k] for k in keys]
        await self.wait(keys, timeout)
        return [data[k] for k in keys]

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        self.multi_set_nowait(items)

    def multi_set_nowait(self, items: Mapping[str, bytes]) -> None:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        for k, v in items.items():
            self._put(k, v, None)
        self._mutated(list(items))

    async def grant_lease(self, ttl: float) -> Lease:
        self._check_open()
        if ttl <= 0:
            raise StoreError(f"lease ttl must be positive, got {ttl!r}")
        self.stats.ops += 1
        lease = _Lease(self, self._next_lease, ttl)
        self._next_lease += 1
        return lease

    def _unindex(self, key: str) -> None:
        i = bisect.bisect_left(self._sorted, key)
        if i < len(self._sorted) and self._sorted[i] == key:
            del self._sorted[i]

    async def snapshot(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        return self.snapshot_nowait(prefix)

    def snapshot_nowait(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        i, j = self._range(prefix)
        self.stats.keys_read += j - i
        # Performance: built in C (no Python loop per key): the decider of a 4,000-node
        # round reads every joiner's key (bench_rendezvous)
        keys = self._sorted[i:j]
        return self._revision, dict(zip(keys, map(self._data.__getitem__, keys), strict=True))

    def _changed_since(self, prefix: str, after: int) -> int | None:
        """The first revision after ``after`` that changed a key under ``prefix`` (None: none).

        Performance: thousands of simulated agents watch the same few prefixes from
        revisions a round of writes behind; scanning the log from ``after`` on every call
        cost O(nodes) each, O(nodes²) a round (18 s of 106 at 2,048 nodes).  Each watched
        prefix keeps the revisions that touched it (``_prefix_revs``), extended by the log
        entries since it was last read, so a call costs a bisection plus the new entries.
        """
        if after >= self._revision:
            return None
        log_revs = self._log_revs
        if not log_revs or after + 1 < log_revs[0]:
            return self._revision  # compacted: tell the caller to re-read
        index = self._prefix_revs.get(prefix)
        if index is None or after < index[0]:
            if index is None and len(self._prefix_revs) >= _MAX_PREFIX_INDEXES:
                self._prefix_revs.clear()  # rebuilt on demand; bounded memory
            index = self._prefix_revs[prefix] = [after, after, []]
        _, upto, revs = index
        if upto < self._revision:
            keys = self._log_keys
            for j in range(bisect.bisect_right(log_revs, upto), len(log_revs)):
                if keys[j].startswith(prefix):
                    revs.append(log_revs[j])
            index[1] = self._revision
            if revs and revs[0] < log_revs[0]:  # forget what the log has compacted away
                del revs[: bisect.bisect_left(revs, log_revs[0])]
                index[0] = log_revs[0] - 1
        i = bisect.bisect_right(revs, after)
        return revs[i] if i < len(revs) else None

    async def watch(self, prefix: str, after: int, timeout: float | None = None) -> int:
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        rev = self._changed_since(prefix, after)
        if rev is not None:
            return rev
        value: Any = await self._woken(prefix, timeout)
        if value is None:
            self._check_open()
        return int(value)

    def _woken(self, prefix: str, timeout: float | None) -> Awaitable[Any]:
        """The wait of :meth:`watch` and :meth:`watch_snapshot`: registers a watcher of
        ``prefix`` and returns what to await for its wake-up (the revision; ``None``: the
        store closed), within ``timeout``.  Performance: a plain function returning the
        awaitable, not a coroutine, so a wait passes no extra frame on its resume."""
        ev = self._clock.event()
        self._watchers.setdefault(prefix, []).append(ev)
        if timeout is None:
            return ev.wait()
        return self._clock.timeout(timeout, ev.wait())

    async def watch_snapshot(
        self, prefix: str, after: int, read_prefix: str, timeout: float | None = None
    ) -> tuple[int, dict[str, bytes]]:
        """:meth:`watch`, then :meth:`snapshot_nowait` of ``read_prefix`` when it wakes, as
        one operation (:class:`~elastic.store.WatchSnapshotStore`): the snapshot is read
        in the same step as the wake-up is taken (nothing runs in between), so its
        revision is the store's at that instant, at least the one that woke it.

        Counted as one operation: one round trip for the simulator's client and the
        network store's host, which answer a wake with the read (``a wake costs one
        round trip``, :mod:`elastic.rendezvous.dynamic_rendezvous`).
        """
        # Performance: watch's body (through _woken, no coroutine), not an await of
        # watch (one coroutine frame fewer for every wait of a simulated agent)
        if self._closed:  # Performance: no method call while open (every operation)
            self._check_open()
        self.stats.ops += 1
        if self._changed_since(prefix, after) is None:
            value: Any = await self._woken(prefix, timeout)
            if value is None:
                self._check_open()
        i, j = self._range(read_prefix)
        self.stats.keys_read += j - i
        keys = self._sorted[i:j]
        return self._revision, dict(zip(keys, map(self._data.__getitem__, keys), strict=True))

    # -- lifecycle -------------------------------------------------------------------
    def pause_expiry(self) -> None:
        """The store's host stopped: no lease expires until :meth:`resume_expiry`."""
        if self._expiry_paused is None:
            self._expiry_paused = self._clock.event()

    def resume_expiry(self) -> None:
        """The store runs again: every abandoned lease gets its full ``ttl`` from now."""
        ev, self._expiry_paused = self._expiry_paused, None
        if ev is not None:
            self._expiry_resumed_at = self._clock.now()
            ev.set()

    @property
    def revision(self) -> int:
        return self._revision

    def keys(self) -> list[str]:
        return list(self._sorted)

    def close(self) -> None:
        """Close the store: every waiter wakes and gets :class:`StoreClosedError`."""
        self._closed = True
        for ws in list(self._key_waiters.values()) + list(self._watchers.values()):
            for w in ws:
                w.set(None)
        self._key_waiters.clear()
        self._watchers.clear()
