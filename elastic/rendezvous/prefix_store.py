"""A view of a :class:`~elastic.store.Store` with every key under one prefix.

Guarantees: every operation is forwarded to the underlying store with ``prefix`` put in
front of each key, so two views with different prefixes never see each other's keys;
``snapshot`` returns keys without the prefix; leases are the underlying store's.
``watch_snapshot`` is the underlying store's own where it has one (one round trip), else
its ``watch`` then ``snapshot`` (:func:`~elastic.store.watch_snapshot_op`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from elastic.store import Lease, Store, WatchSnapshot, watch_snapshot_op

__all__ = ["PrefixStore"]


class PrefixStore(Store):
    """``store`` with ``prefix`` in front of every key (torch's ``PrefixStore``)."""

    __slots__ = ("_watch_snapshot", "prefix", "underlying")

    def __init__(self, store: Store, prefix: str) -> None:
        self.underlying = store
        self.prefix = prefix
        self._watch_snapshot: WatchSnapshot | None = None  # looked up on first use

    @property
    def underlying_store(self) -> object:
        """torch's name: the store this view wraps (a blocking store a handler was
        given, not the adapter that calls it in threads)."""
        from elastic.rendezvous.api import ThreadedStore

        inner = self.underlying
        return inner.store if isinstance(inner, ThreadedStore) else inner

    def _k(self, key: str) -> str:
        return self.prefix + key

    async def set(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        await self.underlying.set(self._k(key), value, lease=lease)

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        return await self.underlying.get(self._k(key), timeout)

    async def try_get(self, key: str) -> bytes | None:
        return await self.underlying.try_get(self._k(key))

    async def add(self, key: str, amount: int) -> int:
        return await self.underlying.add(self._k(key), amount)

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        return await self.underlying.compare_set(self._k(key), expected, desired, lease=lease)

    async def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        await self.underlying.wait([self._k(k) for k in keys], timeout)

    async def delete(self, key: str) -> bool:
        return await self.underlying.delete(self._k(key))

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        return await self.underlying.multi_get([self._k(k) for k in keys], timeout)

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        await self.underlying.multi_set({self._k(k): v for k, v in items.items()})

    async def grant_lease(self, ttl: float) -> Lease:
        return await self.underlying.grant_lease(ttl)

    async def snapshot(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        rev, items = await self.underlying.snapshot(self._k(prefix))
        n = len(self.prefix)
        return rev, {k[n:]: v for k, v in items.items()}

    async def watch(self, prefix: str, after: int, timeout: float | None = None) -> int:
        return await self.underlying.watch(self._k(prefix), after, timeout)

    async def watch_snapshot(
        self, prefix: str, after: int, read_prefix: str, timeout: float | None = None
    ) -> tuple[int, dict[str, bytes]]:
        op = self._watch_snapshot
        if op is None:
            op = self._watch_snapshot = watch_snapshot_op(self.underlying)
        rev, items = await op(self._k(prefix), after, self._k(read_prefix), timeout)
        n = len(self.prefix)
        return rev, {k[n:]: v for k, v in items.items()}
