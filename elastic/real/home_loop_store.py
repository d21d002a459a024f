"""The store port of a store bound to one event loop, usable from any loop.

A store opened for torch's synchronous API lives on the process-wide loop thread
(:func:`elastic.real.rdzv_context.shared_loop`): a network client's connection, an etcd
channel, a lease's renewal task and an in-memory store's waiters belong to that loop.
torch's ``LocalElasticAgent(spec).run()`` drives the same handler from a loop of its own
(the main thread's, which is where signals are handled), and an operation awaited there
on the store's objects fails ("attached to a different loop") or never wakes.

:class:`HomeLoopStore` is the boundary: every operation runs on the store's *home* loop.

Invariants
----------
* Awaited on the home loop, an operation is the inner store's own coroutine, awaited
  directly: the synchronous API (which runs there) pays nothing.
* Awaited on any other loop, the operation is scheduled on the home loop and the caller
  awaits its outcome: the same value, or the same exception.  Cancelling the caller
  cancels the operation on the home loop (a blocking ``get`` or ``watch`` does not go on
  waiting for nobody).
* Leases: :meth:`HomeLoopStore.grant_lease` gives a :class:`HomeLoopLease`; given back
  to an operation it is unwrapped, and its ``revoke`` and ``abandon`` run on the home
  loop too (``abandon`` is scheduled there: it sends a last renewal).
* The optional operations (``watch_snapshot``, ``arrive``) are the inner store's when it
  has them; ``watch_snapshot`` otherwise is ``watch`` then ``snapshot``, and ``arrive``
  raises :class:`~elastic.errors.StoreUnsupportedError` before doing anything, which the
  rendezvous answers with its steps apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from elastic.errors import StoreUnsupportedError
from elastic.store import Lease, Store, arrive_op, watch_snapshot_op

__all__ = ["HomeLoopLease", "HomeLoopStore"]

T = TypeVar("T")


async def _on(home: asyncio.AbstractEventLoop, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    if asyncio.get_running_loop() is home:
        return await make()
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), home))


class HomeLoopLease:
    """A lease of a :class:`HomeLoopStore`: the inner store's, driven on its loop."""

    __slots__ = ("_home", "id", "inner", "ttl")

    def __init__(self, inner: Lease, home: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self._home = home
        self.id = inner.id
        self.ttl = inner.ttl

    def __repr__(self) -> str:
        return f"HomeLoopLease({self.inner!r})"

    def alive(self) -> bool:
        return self.inner.alive()

    def abandon(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._home:
            self.inner.abandon()
        elif not self._home.is_closed():
            self._home.call_soon_threadsafe(self.inner.abandon)

    async def revoke(self) -> None:
        await _on(self._home, self.inner.revoke)


def _inner(lease: Lease | None) -> Lease | None:
    return lease.inner if isinstance(lease, HomeLoopLease) else lease


class HomeLoopStore:
    """The store port over ``inner``, whose objects belong to the loop ``home``."""

    def __init__(self, inner: Store, home: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self._home = home
        self._watch_snapshot = watch_snapshot_op(inner)
        self._arrive = arrive_op(inner)

    def __repr__(self) -> str:
        return f"HomeLoopStore({self.inner!r})"

    def __getattr__(self, name: str) -> Any:
        # what else the inner store offers (its address, statistics...), as it is
        return getattr(self.inner, name)

    async def set(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        await _on(self._home, lambda: self.inner.set(key, value, lease=_inner(lease)))

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        return await _on(self._home, lambda: self.inner.get(key, timeout))

    async def try_get(self, key: str) -> bytes | None:
        return await _on(self._home, lambda: self.inner.try_get(key))

    async def add(self, key: str, amount: int) -> int:
        return await _on(self._home, lambda: self.inner.add(key, amount))

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        return await _on(
            self._home,
            lambda: self.inner.compare_set(key, expected, desired, lease=_inner(lease)),
        )

    async def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        await _on(self._home, lambda: self.inner.wait(keys, timeout))

    async def delete(self, key: str) -> bool:
        return await _on(self._home, lambda: self.inner.delete(key))

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        return await _on(self._home, lambda: self.inner.multi_get(keys, timeout))

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        await _on(self._home, lambda: self.inner.multi_set(items))

    async def grant_lease(self, ttl: float) -> Lease:
        lease = await _on(self._home, lambda: self.inner.grant_lease(ttl))
        return HomeLoopLease(lease, self._home)

    async def snapshot(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        return await _on(self._home, lambda: self.inner.snapshot(prefix))

    async def watch(self, prefix: str, after: int, timeout: float | None = None) -> int:
        return await _on(self._home, lambda: self.inner.watch(prefix, after, timeout))

    async def watch_snapshot(
        self, prefix: str, after: int, read_prefix: str, timeout: float | None = None
    ) -> tuple[int, dict[str, bytes]]:
        op = self._watch_snapshot

        async def run() -> tuple[int, dict[str, bytes]]:
            return await op(prefix, after, read_prefix, timeout)

        return await _on(self._home, run)

    async def arrive(
        self, counter: str, key: str, value: bytes, under: str, *, lease: Lease | None = None
    ) -> tuple[int, int, int, bool]:
        op = self._arrive
        if op is None:
            raise StoreUnsupportedError(
                f"{type(self.inner).__name__} has no arrive (one operation for a join)"
            )

        async def run() -> tuple[int, int, int, bool]:
            assert op is not None
            return await op(counter, key, value, under, lease=_inner(lease))

        return await _on(self._home, run)
