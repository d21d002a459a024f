"""Who the timer servers may signal, and with what: a real adapter (``os.kill``, ``/proc``).

torch's servers take the pid and the signal from the request and call
``os.kill(pid, signal)`` — any process that can write to the pipe can make the agent
signal any process it may signal.  :class:`ReapGuard` narrows that down:

* **pids**: only the worker pids the agent registered with :meth:`set_worker_pids`
  (updated at each (re)start), or their descendants (a worker's own subprocesses,
  found by walking ``/proc/<pid>/stat`` up the tree; psutil where there is no
  ``/proc``).  Until the agent registers pids, the server's own descendants
  are allowed, which is what a worker group launched by this process is.  Never the
  server's own pid, never pid ≤ 0 (process groups, "everyone").
* **signals**: only ``allowed_signals`` (default ``{SIGKILL, SIGTERM}``), plus 0
  ("never reap", torch's meaning) in a request.

The check runs when a request arrives *and* again right before the signal is sent
(a pid can be reused in between).  Anything refused is logged and dropped.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DEFAULT_ALLOWED_SIGNALS", "ReapGuard", "Reaped"]

log = logging.getLogger(__name__)

DEFAULT_ALLOWED_SIGNALS: frozenset[int] = frozenset({signal.SIGKILL, signal.SIGTERM})


@dataclass(frozen=True, slots=True)
class Reaped:
    """A report to the agent: a worker was signalled because its timer expired.

    ``expiration_time`` is in the server's time base (wall-clock seconds).
    """

    worker_pid: int
    scope_id: str
    expiration_time: float
    signal: int


_MAX_DEPTH = 4096  # ancestors walked at most (a process tree is never this deep)


def _ppid(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc/<pid>/stat`` (≈5 µs), or None if unknown."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return int(raw[raw.rindex(b")") + 2 :].split(None, 2)[1])
    except (ValueError, IndexError):
        return None


def _has_ancestor(pid: int, anchors: frozenset[int]) -> bool:
    """True if one of ``anchors`` is a (strict) ancestor of ``pid``.

    Reads ``/proc/<pid>/stat`` up the tree (tens of µs), where psutil's ``parents()``
    built a Process per ancestor (≈2 ms a refused request, issue 15); psutil where
    there is no ``/proc``.
    """
    if not os.path.isdir("/proc/self"):  # pragma: no cover - not Linux
        import psutil  # only here: a worker importing the timer client never needs it

        try:
            return any(p.pid in anchors for p in psutil.Process(pid).parents())
        except psutil.Error:
            return False
    cur: int | None = pid
    for _ in range(_MAX_DEPTH):
        cur = _ppid(cur) if cur is not None else None
        if cur is None or cur <= 0:
            return False
        if cur in anchors:
            return True
    return False


class ReapGuard:
    """The pid and signal policy of a timer server (see the module docstring)."""

    def __init__(
        self,
        allowed_signals: Iterable[int] = DEFAULT_ALLOWED_SIGNALS,
        *,
        server_pid: int | None = None,
    ) -> None:
        self.allowed_signals = frozenset(int(s) for s in allowed_signals)
        self._server_pid = os.getpid() if server_pid is None else server_pid
        # replaced whole (never mutated) so reader threads see a consistent set
        self._worker_pids: frozenset[int] | None = None

    @property
    def worker_pids(self) -> frozenset[int] | None:
        """The registered worker pids, or None before the agent registered any."""
        return self._worker_pids

    def set_worker_pids(self, pids: Iterable[int] | None) -> None:
        """Allow exactly these workers (and their descendants); None = server's descendants."""
        self._worker_pids = None if pids is None else frozenset(int(p) for p in pids)

    def signal_allowed(self, sig: int) -> bool:
        """0 (never reap) or one of ``allowed_signals``."""
        return sig == 0 or sig in self.allowed_signals

    def pid_allowed(self, pid: int) -> bool:
        """True if ``pid`` is a registered worker or a descendant of one (see module doc)."""
        if pid <= 0 or pid == self._server_pid:
            return False
        roots = self._worker_pids
        if roots is not None and pid in roots:
            return True
        anchors = roots if roots is not None else frozenset({self._server_pid})
        return _has_ancestor(pid, anchors)

    def kill(self, pid: int, sig: int) -> bool:
        """Send ``sig`` to ``pid`` if allowed.  True when the worker is dealt with.

        A process that is already gone counts as reaped (torch's rule); a refused
        pid or signal also returns True, so its timers are dropped, not retried.
        False only when ``os.kill`` failed for another reason (retry later).
        """
        if not self.signal_allowed(sig) or sig == 0:
            log.warning("refusing to send signal %s to pid %s: not an allowed signal", sig, pid)
            return True
        if not self.pid_allowed(pid):
            log.warning(
                "refusing to signal pid %s: not a worker of this agent (or already gone)", pid
            )
            return True
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            log.info("Process with pid=%s does not exist. Skipping", pid)
            return True
        except OSError:
            log.exception("Error terminating pid=%s", pid)
            return False
        return True
