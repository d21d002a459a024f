"""torch's timer API: requests, client and server interfaces, ``configure`` and ``expires``.

Names, signatures and messages are torch 2.13's
(``torch.distributed.elastic.timer.api``).  A worker wraps a block that might hang::

    from elastic import timer
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with timer.expires(after=60):
        train_step()

and the server on the agent reaps the worker if the block is still running when the
timer expires.  Differences from torch, all on the safe side, are listed in
:mod:`elastic.timer`.

Time: a :class:`TimerClient` stamps requests with :meth:`TimerClient.now` — wall-clock
seconds for torch's clients (the protocol's time base), the world's clock for an
in-process client (:class:`elastic.timer.driver.ClockTimerClient`), so the same
``expires`` works in the simulator.
"""

from __future__ import annotations

import abc
import logging
import sys
import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from elastic.errors import ElasticError
from elastic.timer.wallclock import wall_time

__all__ = [
    "RequestQueue",
    "TimerClient",
    "TimerError",
    "TimerRequest",
    "TimerServer",
    "configure",
    "expires",
]

log = logging.getLogger(__name__)


class TimerError(ElasticError, RuntimeError):
    """A timer could not be used (no client configured, request too large, ...).

    Also a ``RuntimeError``, which is what torch raises in the same places.
    """


@dataclass(frozen=True, slots=True)
class TimerRequest:
    """One acquire or release, as sent from a client to a server.

    A negative ``expiration_time`` is a *release*.  ``worker_id`` is whatever the
    client/server pair uses to name a worker (a pid for torch's local pairs).
    """

    worker_id: Any
    scope_id: str
    expiration_time: float


class TimerClient(abc.ABC):
    """Client side: acquire and release countdown timers with a server."""

    @abc.abstractmethod
    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Register a timer for ``scope_id`` expiring at ``expiration_time``."""

    @abc.abstractmethod
    def release(self, scope_id: str) -> None:
        """Cancel the timer for ``scope_id`` of this client's worker."""

    def now(self) -> float:
        """The time base of ``expiration_time``: wall-clock seconds unless overridden."""
        return wall_time()


class RequestQueue(abc.ABC):
    """Consumer side of the channel that carries :class:`TimerRequest` s to a server."""

    @abc.abstractmethod
    def size(self) -> int:
        """Requests waiting now (never decreases until :meth:`get`)."""

    @abc.abstractmethod
    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting no more than ``timeout`` seconds."""


class TimerServer(abc.ABC):
    """Server side: keeps timers and reaps workers whose timers expired.

    Subclasses implement storage (:meth:`register_timers`, :meth:`clear_timers`,
    :meth:`get_expired_timers`) and :meth:`_reap_worker`.  This base class runs torch's
    generic watchdog thread: wait up to ``max_interval`` for requests on the queue
    (a blocking wait, woken by requests), register them, reap what expired.  The
    servers shipped here (:class:`~elastic.timer.LocalTimerServer`,
    :class:`~elastic.timer.FileTimerServer`) override :meth:`start`/:meth:`stop` with
    the event-driven core of :mod:`elastic.timer.driver`, which wakes exactly at the
    next deadline or request instead.
    """

    def __init__(
        self, request_queue: RequestQueue, max_interval: float, daemon: bool = True
    ) -> None:
        self._request_queue = request_queue
        self._max_interval = max_interval
        self._daemon = daemon
        self._watchdog_thread: threading.Thread | None = None
        self._stop_signaled = False

    @abc.abstractmethod
    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """Apply acquire/release requests (negative expiration = release)."""

    @abc.abstractmethod
    def clear_timers(self, worker_ids: set[Any]) -> None:
        """Drop every timer of ``worker_ids``."""

    @abc.abstractmethod
    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        """Timers with ``expiration_time <= deadline``, per worker id."""

    @abc.abstractmethod
    def _reap_worker(self, worker_id: Any) -> bool:
        """Reap one worker; True if done.  An exception counts as reaped."""

    def _reap_worker_no_throw(self, worker_id: Any) -> bool:
        try:
            return self._reap_worker(worker_id)
        except Exception:
            log.exception(
                "Uncaught exception thrown from _reap_worker(), "
                "check that the implementation correctly catches exceptions"
            )
            return True

    def _watchdog_loop(self) -> None:
        while not self._stop_signaled:
            try:
                self._run_watchdog()
            except Exception:
                log.exception("Error running watchdog")

    def _run_watchdog(self) -> None:
        batch_size = max(1, self._request_queue.size())
        self.register_timers(self._request_queue.get(batch_size, self._max_interval))
        reaped: set[Hashable] = set()
        for worker_id, expired in self.get_expired_timers(wall_time()).items():
            log.info(
                "Reaping worker_id=[%s]. Expired timers: %s",
                worker_id,
                [r.scope_id for r in expired],
            )
            if self._reap_worker_no_throw(worker_id):
                log.info("Successfully reaped worker=[%s]", worker_id)
                reaped.add(worker_id)
            else:
                log.error("Error reaping worker=[%s]. Will retry on next watchdog.", worker_id)
        self.clear_timers(reaped)

    def start(self) -> None:
        """Start the watchdog thread (returns at once)."""
        log.info(
            "Starting %s... max_interval=%s, daemon=%s",
            type(self).__name__,
            self._max_interval,
            self._daemon,
        )
        self._stop_signaled = False
        self._watchdog_thread = threading.Thread(
            target=self._watchdog_loop, daemon=self._daemon, name=type(self).__name__
        )
        self._watchdog_thread.start()

    def stop(self) -> None:
        """Ask the watchdog thread to stop and wait up to ``max_interval`` for it."""
        log.info("Stopping %s", type(self).__name__)
        self._stop_signaled = True
        if self._watchdog_thread is not None:
            self._watchdog_thread.join(self._max_interval)
            self._watchdog_thread = None


_timer_client: TimerClient | None = None


def configure(timer_client: TimerClient) -> None:
    """Set the process-wide client that :func:`expires` uses by default."""
    global _timer_client
    _timer_client = timer_client
    log.info("Timer client configured to: %s", type(timer_client).__name__)


@contextmanager
def expires(
    after: float, scope: str | None = None, client: TimerClient | None = None
) -> Iterator[None]:
    """Acquire a countdown timer expiring ``after`` seconds from now around the block.

    When it expires before the block ends, the worker is *eligible* to be reaped (the
    server decides when and how).  ``scope`` defaults to the caller's ``file#line``, so
    nested or recursive uses at one line share one timer (each entry overwrites the
    deadline, and the first exit releases it) — torch's behaviour.  The timer is
    released when the block exits, however it exits.

    Raises :class:`TimerError` (a ``RuntimeError``) if no client is given or configured.
    """
    if client is None:
        if _timer_client is None:
            raise TimerError("Configure timer client before using countdown timers.")
        client = _timer_client
    if scope is None:
        # the frame of the `with` statement: contextmanager's __enter__ sits between
        caller = sys._getframe(2)
        scope = f"{caller.f_code.co_filename}#{caller.f_lineno}"
    client.acquire(scope, client.now() + after)
    try:
        yield
    finally:
        client.release(scope)
