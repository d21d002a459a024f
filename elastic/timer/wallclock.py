"""Wall-clock time for the timer API: a real adapter, the one place the timers read it.

torch's timer protocol carries *absolute wall-clock* expiration times
(``time.time() + after``) from the worker to the server, so the worker-side
:func:`elastic.timer.expires` and the real servers must agree on wall time.
:class:`WallClock` is :class:`elastic.real.clock.AsyncioClock` with ``now()`` on that
time base, so the shared driver compares deadlines in the unit the clients send.
A wall-clock jump moves every deadline with it, exactly as in torch.
"""

from __future__ import annotations

import time

from elastic.real.clock import AsyncioClock

__all__ = ["WallClock", "wall_time"]


def wall_time() -> float:
    """Seconds since the epoch (the time base of torch's timer requests)."""
    return time.time()


class WallClock(AsyncioClock):
    """The asyncio clock, but ``now()`` is wall time (sleeps stay loop-timed)."""

    def now(self) -> float:
        return time.time()
