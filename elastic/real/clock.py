"""The real clock: the Clock port on an asyncio event loop and wall (monotonic) time.

A thin adapter: every guarantee of :mod:`elastic.clock` maps onto asyncio's own
(``asyncio.CancelledError`` is :data:`elastic.clock.Cancelled`; ``asyncio.timeout``
raises the builtin :class:`TimeoutError` since Python 3.11).

Two rules are the simulator's (``sim.clock``), so that both worlds behave alike:

* a spawned task that fails while nobody has joined it is recorded in
  :attr:`AsyncioClock.unobserved` (and dropped from it when someone retrieves the error:
  ``join`` or ``first``), never swallowed; ``elastic run`` logs what is left at its end;
* a task cannot cancel itself (``RuntimeError``; it returns instead).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from elastic.clock import OneShot, Task, Waitable, note_unobserved

__all__ = ["AsyncioClock", "run_sync"]

T = TypeVar("T")


class _AsyncioTask(Task[T]):
    __slots__ = ("_clock", "_task", "name")

    def __init__(self, clock: AsyncioClock, task: asyncio.Task[T], name: str) -> None:
        self._clock = clock
        self._task = task
        self.name = name

    def cancel(self) -> None:
        if self._task is asyncio.current_task():
            raise RuntimeError(f"task {self.name!r} cannot cancel itself (it returns instead)")
        self._task.cancel()

    def done(self) -> bool:
        return self._task.done()

    async def join(self) -> T:
        # shield: cancelling the joiner must not cancel the joined task
        try:
            return await asyncio.shield(self._task)
        except Exception as e:
            self._clock._observed(e)
            raise

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

    def __init__(self) -> None:
        # (task name, error) of failed tasks whose error nobody has retrieved yet
        self.unobserved: list[tuple[str, BaseException]] = []
        self.unobserved_dropped = 0

    def _observed(self, exc: BaseException) -> None:
        self.unobserved = [(n, e) for (n, e) in self.unobserved if e is not exc]

    def _done(self, task: asyncio.Task[Any]) -> None:
        # Retrieving the exception here also keeps asyncio from warning at collection.
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, Exception):
            note_unobserved(self, task.get_name(), exc)

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def spawn(self, coro: Coroutine[Any, Any, T], name: str = "") -> Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name or None)
        # a failure nobody joins is recorded, not swallowed (module docstring)
        task.add_done_callback(self._done)
        return _AsyncioTask(self, task, name)

    def event(self) -> OneShot:
        return _AsyncioOneShot()

    async def first(self, *waitables: Waitable) -> tuple[int, Any]:
        if not waitables:
            raise ValueError("first() needs at least one task or event")
        futs = [_future_of(w) for w in waitables]
        for i, f in enumerate(futs):  # lowest index wins ties
            if f.done():
                return i, self._result(f)
        # asyncio.wait never cancels what it waits on, so losers keep running
        await asyncio.wait(futs, return_when=asyncio.FIRST_COMPLETED)
        for i, f in enumerate(futs):
            if f.done():
                return i, self._result(f)
        raise AssertionError("asyncio.wait returned with nothing done")  # pragma: no cover

    def _result(self, f: asyncio.Future[Any]) -> Any:
        try:
            return f.result()
        except Exception as e:
            self._observed(e)
            raise

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


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh event loop (the synchronous torch API)."""
    return asyncio.run(coro)
