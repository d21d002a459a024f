"""The real clock: the Clock port on an asyncio event loop and wall (monotonic) time.

A thin adapter: every guarantee of :mod:`elastic.clock` maps onto asyncio's own
(``asyncio.CancelledError`` is :data:`elastic.clock.Cancelled`; ``asyncio.timeout``
raises the builtin :class:`TimeoutError` since Python 3.11).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from elastic.clock import OneShot, Task, Waitable

__all__ = ["AsyncioClock", "run_sync"]

T = TypeVar("T")


class _AsyncioTask(Task[T]):
    __slots__ = ("_task", "name")

    def __init__(self, task: asyncio.Task[T], name: str) -> None:
        self._task = task
        self.name = name

    def cancel(self) -> None:
        self._task.cancel()

    def done(self) -> bool:
        return self._task.done()

    async def join(self) -> T:
        # shield: cancelling the joiner must not cancel the joined task
        return await asyncio.shield(self._task)

    def _future(self) -> asyncio.Future[Any]:
        return self._task


class _AsyncioOneShot(OneShot):
    __slots__ = ("_fut",)

    def __init__(self) -> None:
        self._fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def set(self, value: Any = None) -> None:
        if not self._fut.done():
            self._fut.set_result(value)

    def is_set(self) -> bool:
        return self._fut.done()

    async def wait(self) -> Any:
        return await asyncio.shield(self._fut)

    def _future(self) -> asyncio.Future[Any]:
        return self._fut


def _future_of(w: Waitable) -> asyncio.Future[Any]:
    if isinstance(w, _AsyncioTask | _AsyncioOneShot):
        return w._future()
    raise TypeError(f"first() takes tasks and events of this clock, got {w!r}")


class AsyncioClock:
    """The Clock port on the running asyncio loop."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def spawn(self, coro: Coroutine[Any, Any, T], name: str = "") -> Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name or None)
        # A task whose failure nobody joins must not warn at garbage collection; the
        # agent's supervisor joins what matters.  Retrieve the exception quietly.
        task.add_done_callback(_quiet)
        return _AsyncioTask(task, name)

    def event(self) -> OneShot:
        return _AsyncioOneShot()

    async def first(self, *waitables: Waitable) -> tuple[int, Any]:
        if not waitables:
            raise ValueError("first() needs at least one task or event")
        futs = [_future_of(w) for w in waitables]
        for i, f in enumerate(futs):  # lowest index wins ties
            if f.done():
                return i, f.result()
        # asyncio.wait never cancels what it waits on, so losers keep running
        await asyncio.wait(futs, return_when=asyncio.FIRST_COMPLETED)
        for i, f in enumerate(futs):
            if f.done():
                return i, f.result()
        raise AssertionError("asyncio.wait returned with nothing done")  # pragma: no cover

    async def timeout(self, seconds: float, coro: Coroutine[Any, Any, T]) -> T:
        async with asyncio.timeout(max(0.0, seconds)):
            return await coro

    async def run_in_thread(self, fn: Callable[[], T]) -> T:
        """Run the blocking ``fn`` in a worker thread without blocking the loop.

        Real mode only (the simulator's clock has no threads): how the agent drives a
        torch-style synchronous rendezvous handler or hook.  Cancelling the awaiter does
        not stop ``fn``; it finishes in its thread and its result is dropped.
        """
        return await asyncio.to_thread(fn)


def _quiet(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh event loop (the synchronous torch API)."""
    return asyncio.run(coro)
