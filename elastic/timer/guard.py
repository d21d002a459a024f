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
* **signals**: only ``allowed_signals`` (default ``{SIGKILL, SIGTERM}``).

Where it applies: at the *reap*, inside the servers' ``_reap_worker`` (torch's name),
right before the signal is sent (so a pid reused since the request is checked as it
is now).  Requests themselves are accepted whatever pid or signal they name, and
listed by ``get_expired_timers`` as torch lists them: a subclass or a test that
overrides ``_reap_worker`` sees every expired timer, and only the default
``_reap_worker`` — the one that calls ``os.kill`` — refuses (a warning, and
``False``: not reaped).  The servers then drop the refused worker's timers instead of
retrying it (a refusal does not go away with time).
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

    def pid_allowed(self, pid: int) -> bool:
        """True if ``pid`` is a registered worker or a descendant of one (see module doc)."""
        if pid <= 0 or pid == self._server_pid:
            return False
        roots = self._worker_pids
        if roots is not None and pid in roots:
            return True
        anchors = roots if roots is not None else frozenset({self._server_pid})
        return _has_ancestor(pid, anchors)

    def refusal(self, pid: int, sig: int) -> str | None:
        """Why ``sig`` may not be sent to ``pid`` (a phrase for a log line), or None."""
        if sig not in self.allowed_signals:
            return f"signal {sig} is not allowed (allowed: {sorted(self.allowed_signals)})"
        if pid <= 0:
            return "a pid <= 0 names a process group or every process, not a worker"
        if pid == self._server_pid:
            return "it is the timer server's own process"
        if not self.pid_allowed(pid):
            return "not a worker of this agent (nor a descendant of one)"
        return None

    def send(self, pid: int, sig: int) -> bool:
        """``os.kill(pid, sig)`` with torch's outcome: True when sent or already gone.

        False when ``os.kill`` failed for another reason (the caller retries later).
        Call :meth:`refusal` first: this does no check of its own.
        """
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            log.info("Process with pid=%s does not exist. Skipping", pid)
            return True
        except OSError:
            log.exception("Error terminating pid=%s", pid)
            return False
        return True
