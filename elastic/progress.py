"""Progress heartbeats: a worker says "I made progress"; the agent notices when one stops.

Hang detection beyond torch (which has none in the agent): a worker that is alive but
stuck (a collective that never returns, a dead NFS mount) is found by the *absence* of
beats for ``hang_timeout`` seconds.

Worker side — one call, no setup::

    import elastic.progress
    for step in range(steps):
        train_step()
        elastic.progress.beat()

``beat()`` writes one byte to the named pipe in ``$ELASTIC_PROGRESS_FILE`` (the agent
gives each worker its own pipe); without that variable it does nothing, so a script
runs unchanged outside the agent.  From a shell: ``echo > "$ELASTIC_PROGRESS_FILE"``
(``touch`` does not write, so it is not a beat).  ``beat()`` never blocks and never
raises: a full pipe already holds unread beats, and a missing reader is not the
worker's problem.

Agent side, three layers:

* :class:`ProgressWatcher` — pure logic, ``now`` in: last beat per local rank,
  :meth:`~ProgressWatcher.stalled` and :meth:`~ProgressWatcher.next_check`.
  A rank is watched from its first beat (``armed=False``, the default: workers that
  never call ``beat()`` are never declared hung) or from the start (``armed=True``).
* :class:`ProgressMonitor` — the async API on the Clock port, the same in both
  worlds: ``await monitor.wait_stalled()`` returns the stuck local ranks once
  ``hang_timeout`` passed without a beat from them.  It wakes only at the earliest
  possible stall time, never per beat, so a beating worker costs the simulator no
  events beyond one wake-up per ``hang_timeout``.
* :class:`FifoProgressSource` — the real adapter: one FIFO (mode 0o600) per local
  rank; a thread blocks in ``select`` on all of them (no polling) and hands each
  beat to the agent's loop through the ``post`` function it is given (for asyncio:
  ``loop.call_soon_threadsafe``).

API the agent is expected to call (real mode)::

    source = FifoProgressSource(run_dir, local_ranks)          # before starting workers
    env[rank].update(source.env_for(rank))                     # ELASTIC_PROGRESS_FILE
    monitor = ProgressMonitor(clock, ProgressWatcher(hang_timeout, local_ranks, clock.now()))
    source.start(monitor.beat, loop.call_soon_threadsafe)
    stuck = await monitor.wait_stalled()       # e.g. inside clock.first(...) with exits
    ...
    monitor.reset(local_ranks)                 # at each (re)start of the group
    source.stop()

In the simulator the worker model calls ``monitor.beat(local_rank)`` directly.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import stat
import threading
from collections.abc import Callable, Iterable, Mapping

from elastic.clock import Clock, OneShot

__all__ = [
    "ENV_PROGRESS_FILE",
    "FifoProgressSource",
    "ProgressMonitor",
    "ProgressWatcher",
    "beat",
]

log = logging.getLogger(__name__)

ENV_PROGRESS_FILE = "ELASTIC_PROGRESS_FILE"
"""Names the pipe a worker's :func:`beat` writes to."""

# -- worker side ----------------------------------------------------------------------

_beat_fd: int | None = None
_beat_path: str | None = None


def beat() -> bool:
    """Tell the agent this worker made progress.  True if the beat was delivered.

    Never blocks, never raises.  Cheap: one ``write`` on a cached descriptor.
    """
    global _beat_fd, _beat_path
    path = os.environ.get(ENV_PROGRESS_FILE)
    if not path:
        return False
    if _beat_fd is not None and _beat_path != path:
        _close_beat_fd()
    try:
        if _beat_fd is None:
            _beat_fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            _beat_path = path
        os.write(_beat_fd, b"\n")
        return True
    except BlockingIOError:
        return True  # the pipe is full of beats the agent has not read yet
    except OSError as e:
        # ENXIO: no reader yet; EPIPE: the reader went away; ENOENT: no pipe
        if e.errno not in (errno.ENXIO, errno.EPIPE, errno.ENOENT):
            log.debug("progress beat failed: %s", e)
        _close_beat_fd()
        return False


def _close_beat_fd() -> None:
    global _beat_fd, _beat_path
    if _beat_fd is not None:
        with contextlib.suppress(OSError):
            os.close(_beat_fd)
    _beat_fd, _beat_path = None, None


# -- pure logic -----------------------------------------------------------------------


class ProgressWatcher:
    """Last beat per local rank; who is stalled at ``now``.  No clock, no I/O.

    Guarantees: ``stalled(now)`` lists (sorted) the watched ranks whose last beat is
    at least ``hang_timeout`` old; ``next_check(now)`` is the earliest time at which
    ``stalled`` can become non-empty (None if no rank is watched), never earlier than
    a rank could actually stall.
    """

    __slots__ = ("_last", "_ranks", "armed", "hang_timeout", "last_beat")

    def __init__(
        self,
        hang_timeout: float,
        local_ranks: Iterable[int] = (),
        now: float = 0.0,
        *,
        armed: bool = False,
    ) -> None:
        if not hang_timeout > 0:
            raise ValueError(f"hang_timeout must be > 0 seconds, got {hang_timeout!r}")
        self.hang_timeout = float(hang_timeout)
        self.armed = armed
        self._last: dict[int, float] = {}
        self.last_beat: float | None = None
        """Time of the latest beat of any rank (for health checks); None before any."""
        self.reset(local_ranks, now)

    def reset(self, local_ranks: Iterable[int], now: float) -> None:
        """A new worker group: forget old beats; watch ``local_ranks`` if ``armed``."""
        self._ranks = frozenset(local_ranks)
        self._last = dict.fromkeys(sorted(self._ranks), now) if self.armed else {}

    def beat(self, local_rank: int, now: float) -> bool:
        """Record a beat.  True if it started watching a rank (its first beat)."""
        first = local_rank not in self._last
        self._last[local_rank] = now
        self.last_beat = now
        return first

    def watched(self) -> list[int]:
        """Ranks being watched, sorted."""
        return sorted(self._last)

    def stalled(self, now: float, hang_timeout: float | None = None) -> list[int]:
        """Watched ranks with no beat for ``hang_timeout`` (default: the watcher's)."""
        limit = self.hang_timeout if hang_timeout is None else hang_timeout
        # `t + limit <= now`, not `now - t >= limit`: the same float sum as next_check,
        # so waking at next_check always finds the stall (0.5 + 0.2 vs 0.7 - 0.5)
        return sorted(r for r, t in self._last.items() if t + limit <= now)

    def next_check(self, now: float) -> float | None:
        """When to look again: the oldest last beat + ``hang_timeout``; None if unwatched."""
        if not self._last:
            return None
        return min(self._last.values()) + self.hang_timeout


# -- async API on the clock port ------------------------------------------------------


class ProgressMonitor:
    """``await wait_stalled()`` on any Clock; see the module docstring."""

    def __init__(self, clock: Clock, watcher: ProgressWatcher) -> None:
        self._clock = clock
        self.watcher = watcher
        self._wake: OneShot | None = None
        self.wakeups = 0
        """How many times ``wait_stalled`` woke up (tests pin: not once per beat)."""

    def beat(self, local_rank: int) -> None:
        """Record a beat now (call on the clock's loop)."""
        if self.watcher.beat(local_rank, self._clock.now()):
            self._poke()  # a newly watched rank may stall before the current deadline

    def reset(self, local_ranks: Iterable[int]) -> None:
        """A new worker group started now."""
        self.watcher.reset(local_ranks, self._clock.now())
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def wait_stalled(self) -> list[int]:
        """Return the local ranks that went ``hang_timeout`` without a beat."""
        clock = self._clock
        while True:
            self._wake = wake = clock.event()
            now = clock.now()
            stuck = self.watcher.stalled(now)
            if stuck:
                self._wake = None
                return stuck
            at = self.watcher.next_check(now)
            self.wakeups += 1
            if at is None:
                await wake.wait()
                continue
            with contextlib.suppress(TimeoutError):
                await clock.timeout(max(0.0, at - now), wake.wait())


# -- real adapter: one FIFO per rank --------------------------------------------------


class FifoProgressSource:
    """Owner-only FIFOs ``<directory>/progress.<local_rank>``, read by one thread.

    ``start(deliver, post)``: for every readable pipe the thread drains it and calls
    ``post(lambda: deliver(local_rank))`` once (beats that arrive together count once).
    """

    def __init__(self, directory: str, local_ranks: Iterable[int]) -> None:
        self._dir = directory
        self._ranks = sorted(set(local_ranks))
        self._fds: dict[int, tuple[int, int]] = {}  # rank -> (read fd, keep-alive write fd)
        self._thread: threading.Thread | None = None
        self._stop_r: int | None = None
        self._stop_w: int | None = None
        for rank in self._ranks:
            path = self.path_for(rank)
            if os.path.lexists(path):
                os.remove(path)
            old = os.umask(0o077)
            try:
                os.mkfifo(path, 0o600)
            finally:
                os.umask(old)

    def path_for(self, local_rank: int) -> str:
        return os.path.join(self._dir, f"progress.{local_rank}")

    def env_for(self, local_rank: int) -> Mapping[str, str]:
        """The environment entry that points worker ``local_rank`` at its pipe."""
        return {ENV_PROGRESS_FILE: self.path_for(local_rank)}

    def start(
        self, deliver: Callable[[int], None], post: Callable[[Callable[[], None]], object]
    ) -> None:
        """Open the pipes and start the reader thread."""
        for rank in self._ranks:
            path = self.path_for(rank)
            if not stat.S_ISFIFO(os.lstat(path).st_mode):
                raise OSError(f"{path}: expected the progress FIFO, found another file")
            rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            # our own writer keeps select from reporting EOF after each worker's close
            wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._fds[rank] = (rfd, wfd)
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(
            target=self._read, args=(deliver, post), daemon=True, name="progress-reader"
        )
        self._thread.start()

    def _read(
        self, deliver: Callable[[int], None], post: Callable[[Callable[[], None]], object]
    ) -> None:
        assert self._stop_r is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._stop_r, selectors.EVENT_READ, None)
            for rank, (rfd, _) in self._fds.items():
                sel.register(rfd, selectors.EVENT_READ, rank)
            while True:
                for key, _ in sel.select():
                    if key.data is None:
                        return
                    rank = int(key.data)
                    with contextlib.suppress(BlockingIOError):
                        while os.read(key.fd, 65536):
                            pass
                    try:
                        post(lambda rank=rank: deliver(rank))  # type: ignore[misc]
                    except RuntimeError:  # the loop is closed: the agent is gone
                        return

    def stop(self) -> None:
        """Stop the thread, close and remove the pipes."""
        if self._stop_w is not None:
            os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        for fd in (self._stop_r, self._stop_w):
            if fd is not None:
                os.close(fd)
        self._stop_r = self._stop_w = None
        for rfd, wfd in self._fds.values():
            os.close(rfd)
            os.close(wfd)
        self._fds.clear()
        for rank in self._ranks:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path_for(rank))
