"""torch's local timer pair, over a ``multiprocessing`` queue.

:class:`LocalTimerClient` puts plain tuples ``(pid, scope_id, expiration_time)`` on the
queue (no custom classes cross the process boundary, so nothing but builtins is ever
unpickled from it); :class:`LocalTimerServer` validates each message, keeps the timers
in a :class:`~elastic.timer.table.TimerTable` and reaps expired workers with SIGKILL.

Every well-formed request is accepted and listed by ``get_expired_timers``, whatever
pid it names (torch's tests use ids like -1).  The safety check is in the reap:
``_reap_worker`` signals only this agent's workers, through a
:class:`~elastic.timer.guard.ReapGuard`; anything else is logged, not signalled, and
its timers are dropped.

The server is event-driven: one reader thread blocks on ``queue.get()`` (a
``multiprocessing`` queue has no selectable handle, so a thread is the honest way to
wait on it) and hands requests to the driver loop, which sleeps until the next deadline
or request.  ``max_interval`` is kept for torch's signature: it is the retry period of
a failed reap and the time ``stop()`` waits for the threads.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue as queue_mod
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any

from elastic.timer.api import RequestQueue, TimerClient, TimerRequest, TimerServer
from elastic.timer.guard import DEFAULT_ALLOWED_SIGNALS, Reaped, ReapGuard
from elastic.timer.serving import DriverThread
from elastic.timer.table import TimerTable
from elastic.timer.wallclock import wall_time

__all__ = ["LocalTimerClient", "LocalTimerServer", "MultiprocessingRequestQueue"]

log = logging.getLogger(__name__)

MAX_SCOPE_LEN = 1024
"""Longest scope id accepted (a ``file#line`` is far shorter)."""

_STOP = ("__elastic_timer_stop__",)
_NOBODY = object()  # no worker refused by the last _reap_worker


def parse_message(msg: object) -> TimerRequest | None:
    """A queue message as a request, or None (logged) if it is not one.

    Accepted: ``(pid: int, scope_id: str, expiration_time: int | float)`` or a
    :class:`TimerRequest` with those field types.
    """
    if isinstance(msg, TimerRequest):
        fields: tuple[object, ...] = (msg.worker_id, msg.scope_id, msg.expiration_time)
    elif isinstance(msg, tuple) and len(msg) == 3:
        fields = msg
    else:
        log.warning(
            "dropping timer message of type %s: expected (pid, scope, expiration)",
            type(msg).__name__,
        )
        return None
    pid, scope, exp = fields
    if (
        type(pid) is not int
        or not isinstance(scope, str)
        or len(scope) > MAX_SCOPE_LEN
        or type(exp) not in (int, float)
        or not math.isfinite(exp)  # type: ignore[arg-type]
    ):
        log.warning("dropping malformed timer message %r", fields[:2])
        return None
    return TimerRequest(pid, scope, float(exp))  # type: ignore[arg-type]


class LocalTimerClient(TimerClient):
    """Client of :class:`LocalTimerServer`; names the worker by its pid."""

    def __init__(self, mp_queue: Any) -> None:
        self._mp_queue = mp_queue

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._mp_queue.put((os.getpid(), scope_id, float(expiration_time)))

    def release(self, scope_id: str) -> None:
        self._mp_queue.put((os.getpid(), scope_id, -1.0))


class MultiprocessingRequestQueue(RequestQueue):
    """A :class:`RequestQueue` over a ``multiprocessing`` queue (torch's class)."""

    def __init__(self, mp_queue: Any) -> None:
        self._mp_queue = mp_queue

    def size(self) -> int:
        return int(self._mp_queue.qsize())

    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        requests: list[TimerRequest] = []
        deadline = wall_time() + timeout
        for _ in range(size):
            try:
                msg = self._mp_queue.get(block=True, timeout=max(0.0, deadline - wall_time()))
            except queue_mod.Empty:
                break
            request = parse_message(msg)
            if request is not None:
                requests.append(request)
            if wall_time() >= deadline:
                break
        return requests


class LocalTimerServer(TimerServer):
    """Server of :class:`LocalTimerClient` (same host, workers are its child processes).

    Extra keyword arguments (ours): ``allowed_signals`` (default SIGKILL/SIGTERM; the
    reap signal is SIGKILL as in torch) and ``on_reap`` (called with a
    :class:`~elastic.timer.guard.Reaped` from the server thread after each reap).
    ``set_worker_pids`` narrows the pids it may signal (see :mod:`elastic.timer.guard`).

    Every request is accepted; ``_reap_worker`` (torch's hook, which tests mock) is
    where the guard refuses a pid ≤ 0, the server itself or a process that is not one
    of its workers: a warning, ``False``, and the worker's timers are dropped.
    """

    def __init__(
        self,
        mp_queue: Any,
        max_interval: float = 60,
        daemon: bool = True,
        *,
        allowed_signals: Iterable[int] = DEFAULT_ALLOWED_SIGNALS,
        on_reap: Callable[[Reaped], None] | None = None,
    ) -> None:
        super().__init__(MultiprocessingRequestQueue(mp_queue), max_interval, daemon)
        self._mp_queue = mp_queue
        self._table: TimerTable[TimerRequest] = TimerTable()
        self.guard = ReapGuard(allowed_signals)
        self._on_reap = on_reap
        self._core = DriverThread(
            type(self).__name__, self._reap, max_interval, self._table, daemon
        )
        self._reader: threading.Thread | None = None
        self._refused: object = _NOBODY

    # torch's storage API (thread-safe while running)

    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        self._core.submit(timer_requests)

    def clear_timers(self, worker_ids: set[Any]) -> None:
        self._core.clear(worker_ids)

    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        out: dict[Any, list[TimerRequest]] = {}

        def read() -> None:
            out.update(self._table.expired(deadline))

        if not self._core.call(read):
            read()
        return out

    @property
    def _timers(self) -> dict[tuple[Any, str], TimerRequest]:
        """torch's view of the live timers: ``(worker_id, scope_id) -> request`` (a copy)."""
        out: dict[tuple[Any, str], TimerRequest] = {}

        def read() -> None:
            out.update({(r.worker_id, r.scope_id): r for r in self._table.timers()})

        if not self._core.call(read):
            read()
        return out

    def _reap_worker(self, worker_id: Any) -> bool:
        """SIGKILL the worker, if it is one of this agent's (else a warning and False)."""
        if type(worker_id) is not int:
            why: str | None = f"the worker id {worker_id!r} is not a pid"
        else:
            why = self.guard.refusal(worker_id, signal.SIGKILL)
        if why is not None:
            log.warning("refusing to signal pid %s: %s", worker_id, why)
            self._refused = worker_id
            return False
        return self.guard.send(worker_id, signal.SIGKILL)

    async def _reap(self, worker_id: Any, scope_id: str, expired_at: float) -> bool:
        self._refused = _NOBODY
        done = self._reap_worker_no_throw(worker_id)
        if not done and self._refused is worker_id:
            # the guard refused it: retrying would only repeat the refusal, so its
            # timers are dropped (nothing was reaped: nothing is reported)
            self._refused = _NOBODY
            return True
        if done and self._on_reap is not None and type(worker_id) is int:
            try:
                self._on_reap(Reaped(worker_id, scope_id, expired_at, int(signal.SIGKILL)))
            except Exception:
                log.exception("on_reap callback failed")
        return done

    def set_worker_pids(self, pids: Iterable[int] | None) -> None:
        """Allow only these workers (and descendants); drop timers of the others."""
        self.guard.set_worker_pids(pids)
        stale = {
            r.worker_id for r in self._table.timers() if not self.guard.pid_allowed(r.worker_id)
        }
        if stale:
            self.clear_timers(stale)

    def get_last_progress_time(self) -> int:
        """Now while the watchdog runs and is not stuck (see ``DriverThread``)."""
        return self._core.last_progress_time()

    def start(self) -> None:
        """Start the driver loop and the queue reader thread (returns at once)."""
        log.info(
            "Starting %s... max_interval=%s, daemon=%s",
            type(self).__name__,
            self._max_interval,
            self._daemon,
        )

        async def on_start(loop: object) -> None:
            return None

        async def on_stop(loop: object) -> None:
            return None

        self._core.start(on_start, on_stop)
        self._reader = threading.Thread(
            target=self._read_queue, daemon=self._daemon, name=f"{type(self).__name__}-reader"
        )
        self._reader.start()

    def _read_queue(self) -> None:
        while True:
            try:
                msg = self._mp_queue.get()
            except (EOFError, OSError, ValueError):  # queue closed under us
                return
            if msg == _STOP:
                return
            request = parse_message(msg)
            if request is None:
                continue
            self._core.submit([request])

    def stop(self) -> None:
        """Stop the reader and the driver; waits up to ``max_interval`` for each."""
        log.info("Stopping %s", type(self).__name__)
        if self._reader is not None:
            with contextlib.suppress(OSError, ValueError):
                self._mp_queue.put(_STOP)
            self._reader.join(self._max_interval)
            self._reader = None
        self._core.stop(self._max_interval)
