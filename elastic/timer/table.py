"""The timer table: pure bookkeeping of countdown timers, with no clock and no I/O.

Theory of operation
-------------------
A worker *acquires* a timer for a scope with an absolute expiration time and
*releases* it when it leaves the scope (torch's protocol: a request with a negative
expiration time is a release).  The table keeps one timer per ``(worker_id,
scope_id)``: acquiring the same scope again overwrites the deadline (so a recursive
``expires`` with the default ``file#line`` scope shares one timer, as in torch).

The caller owns time.  It asks :meth:`TimerTable.expired` which timers are due at
``now``, tries to reap those workers, then :meth:`TimerTable.clear`\\ s the workers it
reaped and :meth:`TimerTable.postpone`\\ s those it failed to reap (they come due again
at the retry time).  :meth:`TimerTable.next_deadline` says when the next decision is
needed, so a driver can sleep exactly until then; ``None`` means "nothing to do until a
new request arrives".

Guarantees
----------
* Nothing here reads a clock or blocks; every method is O(number of timers).  A host
  runs a handful of workers with a few scopes each, so a linear scan beats a heap with
  lazy deletion in both speed and simplicity.
* A worker is reported by :meth:`expired` at most once per call, with its expired
  timers sorted by expiration time (ties by scope), so the first one is the one that
  made the worker eligible for reaping.
* A postponed worker is not reported again before its retry time, and its retry time
  is what :meth:`next_deadline` reports for it — a driver never spins on a worker it
  cannot reap.
* Iteration order is deterministic (insertion order of the dict), so the simulator
  replays the same decisions for the same requests.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, Protocol, TypeVar

__all__ = ["TimerLike", "TimerTable"]


class TimerLike(Protocol):
    """What the table needs of a request: torch's ``TimerRequest`` fields."""

    @property
    def worker_id(self) -> Hashable: ...

    @property
    def scope_id(self) -> str: ...

    @property
    def expiration_time(self) -> float: ...


R = TypeVar("R", bound=TimerLike)


class TimerTable(Generic[R]):
    """Active timers keyed by ``(worker_id, scope_id)``; see the module docstring."""

    __slots__ = ("_not_before", "_timers")

    def __init__(self) -> None:
        self._timers: dict[tuple[Hashable, str], R] = {}
        # worker id -> earliest time it may be reported again after a failed reap
        self._not_before: dict[Hashable, float] = {}

    def __len__(self) -> int:
        return len(self._timers)

    def __contains__(self, key: object) -> bool:
        """``(worker_id, scope_id) in table``, as on torch's ``_timers`` dict."""
        return isinstance(key, tuple) and key in self._timers

    def register(self, requests: Iterable[R]) -> None:
        """Apply acquire (expiration ≥ 0) and release (expiration < 0) requests in order."""
        for request in requests:
            key = (request.worker_id, request.scope_id)
            if request.expiration_time < 0:
                self._timers.pop(key, None)
            else:
                self._timers[key] = request
        self._forget_idle_postponements()

    def has(self, worker_id: Hashable, scope_id: str) -> bool:
        """True if this worker holds a timer of this scope."""
        return (worker_id, scope_id) in self._timers

    def clear(self, worker_ids: Iterable[Hashable]) -> None:
        """Drop every timer of the given workers (they were reaped or are gone)."""
        ids = set(worker_ids)
        if not ids:
            return
        for key in [k for k in self._timers if k[0] in ids]:
            del self._timers[key]
        for worker_id in ids:
            self._not_before.pop(worker_id, None)

    def postpone(self, worker_id: Hashable, until: float) -> None:
        """Do not report ``worker_id`` as expired before ``until`` (a failed reap's retry)."""
        self._not_before[worker_id] = until

    def timers(self, worker_id: Hashable | None = None) -> list[R]:
        """The active timers (of one worker, if given), in insertion order."""
        return [r for (w, _), r in self._timers.items() if worker_id is None or w == worker_id]

    def expired(self, now: float) -> dict[Hashable, list[R]]:
        """Timers with ``expiration_time <= now``, grouped by worker, earliest first.

        Workers postponed past ``now`` are left out.
        """
        due: dict[Hashable, list[R]] = {}
        for (worker_id, _), request in self._timers.items():
            if request.expiration_time <= now and self._not_before.get(worker_id, now) <= now:
                due.setdefault(worker_id, []).append(request)
        for requests in due.values():
            requests.sort(key=lambda r: (r.expiration_time, r.scope_id))
        return due

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`expired` can report something; None if never."""
        best: float | None = None
        for (worker_id, _), request in self._timers.items():
            at = max(request.expiration_time, self._not_before.get(worker_id, float("-inf")))
            if best is None or at < best:
                best = at
        return best

    def _forget_idle_postponements(self) -> None:
        # a postponement outlives its worker's timers only as garbage; drop it
        if self._not_before:
            live = {w for w, _ in self._timers}
            for worker_id in [w for w in self._not_before if w not in live]:
                del self._not_before[worker_id]
