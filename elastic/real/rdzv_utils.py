"""torch's threaded rendezvous helpers, for code that imports them from ``rendezvous.utils``.

:mod:`elastic.rendezvous.utils` stays pure (no clock, no threads, no sockets) and hands these
names out lazily from here: ``_matches_machine_hostname`` (does a host name this machine?),
``_delay`` (sleep a fixed or random time) and ``_PeriodicTimer`` (call a function every
interval on a daemon thread).  elastic's own agent never uses the last two — its keep-alives
and timeouts are awaited on the clock port — they exist for users' code written against
torch's module.
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from elastic.real.rdzv_store import matches_this_machine

__all__ = ["PeriodicTimer", "delay", "matches_machine_hostname"]

#: torch's rule: a delay shorter than this is not worth a sleep
_MIN_DELAY = 0.01


def matches_machine_hostname(host: str) -> bool:
    """``host`` (a name or an address) names this machine: ``localhost``, any loopback
    address, this host's name or FQDN, or a name resolving to one of its addresses."""
    return matches_this_machine(host)


def delay(seconds: float | tuple[float, float]) -> None:
    """Sleep ``seconds``, or a uniformly random time in ``(low, high)`` when given a pair;
    delays under 10 ms are skipped."""
    if isinstance(seconds, tuple):
        seconds = random.uniform(*seconds)
    if seconds >= _MIN_DELAY:
        time.sleep(seconds)


class _Loop:
    """What the timer's thread needs, kept apart from the timer so that the thread does
    not keep the timer alive (dropping the last reference to the timer stops the thread)."""

    __slots__ = ("args", "function", "interval", "kwargs", "stop")

    def __init__(
        self, interval: float, function: Callable[..., None], args: Any, kwargs: Any
    ) -> None:
        self.interval = interval
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self.stop = threading.Event()

    def run(self) -> None:
        # the wait is the period and the stop signal at once: cancel() wakes it at once
        while not self.stop.wait(self.interval):
            self.function(*self.args, **self.kwargs)


def _stop(thread: threading.Thread, stop: threading.Event) -> None:
    stop.set()
    if thread is not threading.current_thread():
        thread.join()


class PeriodicTimer:
    """Call ``function(*args, **kwargs)`` every ``interval`` on a daemon thread.

    The first call comes one interval after :meth:`start`.  :meth:`cancel` (idempotent)
    stops the thread and waits for it; so does dropping the last reference to the timer.
    A timer starts once; its thread is named :attr:`name` (``"PeriodicTimer"`` unless
    :meth:`set_name` chose another before the start).
    """

    def __init__(
        self, interval: timedelta, function: Callable[..., None], *args: Any, **kwargs: Any
    ) -> None:
        self._name: str | None = None
        self._loop = _Loop(interval.total_seconds(), function, args, kwargs)
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize[Any, PeriodicTimer] | None = None

    @property
    def name(self) -> str | None:
        return self._name

    def set_name(self, name: str) -> None:
        if self._thread is not None:
            raise RuntimeError("The timer has already started.")
        self._name = name

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("The timer has already started.")
        self._thread = threading.Thread(
            target=self._loop.run, name=self._name or "PeriodicTimer", daemon=True
        )
        # the finalizer holds the thread and the event, not the timer: it runs on
        # cancel() or when the timer is collected, never at interpreter exit (the thread
        # is a daemon; joining it there could hang on a blocked function)
        self._finalizer = weakref.finalize(self, _stop, self._thread, self._loop.stop)
        self._finalizer.atexit = False
        self._thread.start()

    def cancel(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
