"""An asyncio event loop in a thread of its own, for torch's synchronous APIs in real mode.

torch's rendezvous handler is synchronous (``handler.next_rendezvous()``); ours is
asynchronous at its core and runs on the clock port.  A synchronous caller cannot simply
``asyncio.run()`` each call: the handler, its store and its clock keep state bound to
one loop between calls (futures a waiter is parked on, lease timers, watches), and
``asyncio.run`` makes a new loop per call and cancels every task of it when the call
returns — two nodes calling ``next_rendezvous()`` that way never meet.

Invariants
----------
* One loop, one thread, for the life of the :class:`LoopThread`.  Everything built on the
  clock port for synchronous use (the :class:`~elastic.real.clock.AsyncioClock`, a
  :class:`~elastic.memstore.MemoryStore`, the handler's background tasks) lives on it.
* :meth:`LoopThread.run` blocks the calling thread until the coroutine finishes on the
  loop and returns its result or raises its exception (the same type the coroutine
  raised).  Any number of threads may call it at once.
* Calling :meth:`LoopThread.run` from the loop's own thread would wait for itself: it
  raises ``RuntimeError`` instead.
* :meth:`LoopThread.close` cancels what is still running on the loop, waits for it, then
  stops and joins the thread; later calls to :meth:`run` raise ``RuntimeError``.

Example::

    loop = LoopThread()
    clock = AsyncioClock()
    handler = get_rendezvous_handler(
        params, store=MemoryStore(clock), clock=clock, node="n0", sync_runner=loop.run
    )
    info = handler.next_rendezvous()
    ...
    handler.shutdown()
    loop.close()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An asyncio loop running in a daemon thread; :meth:`run` is a ``SyncRunner``."""

    def __init__(self, name: str = "elastic-loop") -> None:
        self._loop = asyncio.new_event_loop()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _refuse_own_thread(self, what: str) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                f"LoopThread.{what}() called from the loop's own thread (it would wait for "
                "itself): await the coroutine instead"
            )

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop; block until it is done; return or raise its outcome."""
        try:
            if self._closed:
                raise RuntimeError("LoopThread.run() after close()")
            self._refuse_own_thread("run")
        except RuntimeError:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        """Cancel the loop's remaining tasks, stop it and join its thread (idempotent)."""
        if self._closed:
            return
        self._refuse_own_thread("close")
        self._closed = True
        asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    async def _cancel_all(self) -> None:
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
