"""Running the timer driver for real: an asyncio loop in a thread behind torch's start/stop.

A real adapter.  :class:`DriverThread` owns one thread with its own event loop on
:class:`~elastic.timer.wallclock.WallClock` and runs a
:class:`~elastic.timer.driver.TimerDriver` there.  Request sources (a pipe reader, a
queue reader thread) feed it with :meth:`DriverThread.submit`, which is thread-safe:
it hops onto the loop with ``call_soon_threadsafe``, so the driver itself only ever
runs on its loop and awaits only the clock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any, TypeVar

from elastic.timer.api import TimerRequest
from elastic.timer.driver import Reap, TimerDriver
from elastic.timer.table import TimerTable
from elastic.timer.wallclock import WallClock, wall_time

__all__ = ["DriverThread"]

log = logging.getLogger(__name__)

T = TypeVar("T")

Hook = Callable[[asyncio.AbstractEventLoop], Awaitable[None]]


class DriverThread:
    """A :class:`TimerDriver` on a private event loop in a (daemon) thread."""

    def __init__(
        self,
        name: str,
        reap: Reap,
        retry_interval: float,
        table: TimerTable[Any],
        daemon: bool = True,
    ) -> None:
        self._name = name
        self._reap = reap
        self._retry_interval = retry_interval
        self.table = table
        self._daemon = daemon
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._driver: TimerDriver | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.stopped_at: float | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._loop is not None

    def start(self, on_start: Hook, on_stop: Hook) -> None:
        """Start the thread; returns once ``on_start`` ran on the loop (or raised)."""
        self._ready.clear()
        self._error = None
        self.stopped_at = None
        self._thread = threading.Thread(
            target=asyncio.run,
            args=(self._main(on_start, on_stop),),
            daemon=self._daemon,
            name=self._name,
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise self._error

    async def _main(self, on_start: Hook, on_stop: Hook) -> None:
        loop = asyncio.get_running_loop()
        clock = WallClock()
        self._driver = TimerDriver(
            clock, self._reap, retry_interval=self._retry_interval, table=self.table
        )
        self._stopping = asyncio.Event()
        try:
            await on_start(loop)
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._loop = loop
        self._ready.set()
        task = clock.spawn(self._driver.run(), name=f"{self._name}-driver")
        try:
            await self._stopping.wait()
        finally:
            task.cancel()
            try:
                await task.join()
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("%s: the timer driver failed", self._name)
            self._loop = None
            self.stopped_at = wall_time()
            try:
                await on_stop(loop)
            except Exception:
                log.exception("%s: error while stopping", self._name)

    def stop(self, timeout: float | None) -> None:
        """Stop the loop and join the thread (up to ``timeout`` seconds)."""
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None:
            # RuntimeError: the loop closed already
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if thread is not None:
            thread.join(timeout)
        self._thread = None

    def submit(self, requests: Iterable[TimerRequest]) -> None:
        """Thread-safe: register requests with the running driver (or the idle table)."""
        batch = list(requests)
        if not self.call(lambda: self._driver_submit(batch)):
            self.table.register(batch)

    def clear(self, worker_ids: Iterable[Hashable]) -> None:
        """Thread-safe: forget every timer of ``worker_ids``."""
        ids = list(worker_ids)
        if not self.call(lambda: self._driver_clear(ids)):
            self.table.clear(ids)

    def call(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the loop (waiting for it when called from another thread).

        False if the loop is not running (the caller then acts directly).
        """
        loop = self._loop
        if loop is None:
            return False
        if threading.current_thread() is self._thread:
            fn()
            return True
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            try:
                fn()
                done.set_result(None)
            except BaseException as e:
                done.set_exception(e)

        try:
            loop.call_soon_threadsafe(run)
            # bounded: a loop that closes right now never runs `run`
            done.result(timeout=5.0)
        except (RuntimeError, concurrent.futures.TimeoutError):
            return False
        return True

    def _driver_submit(self, batch: list[TimerRequest]) -> None:
        assert self._driver is not None
        self._driver.submit(batch)

    def _driver_clear(self, ids: list[Hashable]) -> None:
        assert self._driver is not None
        self._driver.clear(ids)

    def last_progress_time(self) -> int:
        """torch's ``get_last_progress_time``: now while the watchdog is healthy.

        The driver sleeps when idle, so "progress" is: the loop is running and not
        stuck in one reap for longer than ``retry_interval``.  Otherwise the time it
        stopped or got stuck.
        """
        now = wall_time()
        if not self.running:
            return int(self.stopped_at if self.stopped_at is not None else now)
        driver = self._driver
        busy = driver.busy_since if driver is not None else None
        if busy is not None and now - busy > self._retry_interval:
            return int(busy)
        return int(now)
