"""The timer server's core: an async driver on the Clock port around a :class:`TimerTable`.

Theory of operation
-------------------
One coroutine, :meth:`TimerDriver.run`, owns the table.  Each turn it reaps the workers
whose timers are due at ``clock.now()``, then waits for the *first* of

* the next deadline (``table.next_deadline()``), through ``clock.timeout``, or
* a new request: :meth:`TimerDriver.submit` registers requests and fires the
  current wake-up :class:`~elastic.clock.OneShot`.

With no timers it waits on the one-shot alone: an idle server costs no wake-ups in
either world (no fixed-interval polling, unlike torch's ``max_interval`` loop).

Reaping is a callback, ``async reap(worker_id, scope_id, expired_at) -> bool``, called
once per due worker with its earliest expired timer.  True: the worker's timers are
cleared.  False: the worker is retried ``retry_interval`` later (a sleep to that
deadline, not a poll).  An exception from the callback is logged and counts as reaped,
as in torch.  The real servers pass a callback that signals the process; the simulator
passes one that kills the worker model; the agent can learn of every reap through it.

Threading: ``submit``/``clear`` must be called on the loop that runs ``run`` (the real
servers hop there with ``loop.call_soon_threadsafe``).

API the agent uses (both worlds)::

    driver = TimerDriver(clock, reap=on_expired, retry_interval=1.0)
    task = clock.spawn(driver.run(), name="timer-server")
    client = ClockTimerClient(driver, worker_id=..., clock=clock)   # sim workers
    ...
    task.cancel()
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

from elastic.clock import Cancelled, Clock, OneShot
from elastic.timer.api import TimerClient, TimerRequest
from elastic.timer.table import TimerTable

__all__ = ["ClockTimerClient", "Reap", "TimerDriver"]

log = logging.getLogger(__name__)

Reap = Callable[[Any, str, float], Awaitable[bool]]
"""``async reap(worker_id, scope_id, expired_at) -> bool`` (True = reaped)."""


class TimerDriver:
    """Runs a :class:`TimerTable` on a clock: wakes at the next deadline or request."""

    def __init__(
        self,
        clock: Clock,
        reap: Reap,
        *,
        retry_interval: float = 1.0,
        table: TimerTable[Any] | None = None,
    ) -> None:
        if retry_interval <= 0:
            raise ValueError(f"retry_interval must be > 0 seconds, got {retry_interval!r}")
        self._clock = clock
        self._reap = reap
        self._retry_interval = retry_interval
        self.table: TimerTable[Any] = table if table is not None else TimerTable()
        self._wake: OneShot | None = None
        self.busy_since: float | None = None
        """Clock time the current reap started, None while waiting (health checks)."""
        self.turns = 0
        """Number of wake-ups so far (tests pin that an idle driver does not spin)."""

    def submit(self, requests: Iterable[TimerRequest]) -> None:
        """Register acquire/release requests and wake the driver."""
        self.table.register(requests)
        self._poke()

    def clear(self, worker_ids: Iterable[Hashable]) -> None:
        """Forget every timer of ``worker_ids`` (e.g. the group was stopped)."""
        self.table.clear(worker_ids)
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Serve until cancelled."""
        clock = self._clock
        while True:
            self.turns += 1
            # armed before looking at the table: a submit during a reap wakes the next wait
            self._wake = wake = clock.event()
            await self._reap_due(clock.now())
            deadline = self.table.next_deadline()
            if deadline is None:
                await wake.wait()
                continue
            delay = deadline - clock.now()
            if delay <= 0:
                continue
            with contextlib.suppress(TimeoutError):
                await clock.timeout(delay, wake.wait())

    async def _reap_due(self, now: float) -> None:
        for worker_id, expired in self.table.expired(now).items():
            first = expired[0]
            log.info(
                "Reaping worker_id=[%s]. Expired timers: %s",
                worker_id,
                [r.scope_id for r in expired],
            )
            self.busy_since = now
            try:
                reaped = await self._reap(worker_id, first.scope_id, first.expiration_time)
            except Cancelled:
                raise
            except Exception:
                log.exception("reap callback failed for worker=[%s]; counted as reaped", worker_id)
                reaped = True
            finally:
                self.busy_since = None
            if reaped:
                self.table.clear([worker_id])
            else:
                log.error("Error reaping worker=[%s]. Will retry.", worker_id)
                self.table.postpone(worker_id, self._clock.now() + self._retry_interval)


class ClockTimerClient(TimerClient):
    """An in-process client for a :class:`TimerDriver` on the same loop (sim workers, tests).

    ``now()`` is the driver's clock, so ``expires(after)`` means ``after`` seconds of
    that world's time.
    """

    def __init__(self, driver: TimerDriver, worker_id: Hashable, clock: Clock) -> None:
        self._driver = driver
        self.worker_id = worker_id
        self._clock = clock

    def now(self) -> float:
        return self._clock.now()

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._driver.submit([TimerRequest(self.worker_id, scope_id, expiration_time)])

    def release(self, scope_id: str) -> None:
        self._driver.submit([TimerRequest(self.worker_id, scope_id, -1)])
