"""Finding and signalling a worker's whole process tree (Linux).

Theory of operation
-------------------
A worker's tree is every process it started, directly or not.  Three nets catch them,
because each alone has holes:

1. **parentage** — the children, recursively, of each live worker (one pass over
   ``/proc/*/stat`` for all workers at once, where psutil would read all of ``/proc``
   once per worker).  Misses a descendant whose parent died (it is re-parented away),
   unless the agent is a child subreaper (``PR_SET_CHILD_SUBREAPER``, see
   :func:`become_subreaper`): then orphans are re-parented to the agent and stay in
   its tree.
2. **process group** — each worker leads its own process group; ``killpg`` reaches every
   member atomically, even one forked a microsecond ago.  Misses anyone who called
   ``setsid()``/``setpgid()``.
3. **environment marker** (:class:`Marker`) — a variable every worker gets and its
   descendants inherit whatever their session or parent.  The launcher adds no variable
   of its own for it: the marker is torch's ``TORCHELASTIC_ERROR_FILE``, whose value is
   a path under the agent's unique run log directory
   (``<log_dir>/<run_id>_<random>/attempt_<k>/<local_rank>/error.json``), so the prefix
   ``<run dir>/`` marks the agent's processes and ``<run dir>/attempt_<k>/`` one group's.
   Only where there is no such path (``--log-dir /dev/null``, or a custom
   :class:`~elastic.multiprocessing.api.LogsSpecs`) does the launcher add
   ``ELASTIC_AGENT_INSTANCE=<uuid>`` and ``ELASTIC_WORKER_GROUP=<uuid>`` instead.
   :func:`pids_with_env` scans ``/proc/<pid>/environ``.  Misses a descendant started
   with a scrubbed environment (``env={}``), and processes of other users (unreadable).

Where cgroup v2 is usable a fourth net has no such hole: the agent's cgroup
(:mod:`elastic.real.cgroup`), which the stop kills last and the reaper sidecar kills if
the agent dies.

Signals go through pidfds (:class:`ProcHandle`): a pid is opened, *then* checked to still
be the process that was found, then signalled through the fd, so a recycled pid is never
hit.  The fd also becomes readable when the process exits, which is how the launcher
waits for a tree to die without polling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Collection, Iterable

from elastic._records import Frozen, set_fields
from elastic.real.reaper import AGENT_MARKER, ERROR_FILE, GROUP_MARKER, needle

__all__ = [
    "AGENT_MARKER",
    "ERROR_FILE",
    "GROUP_MARKER",
    "Marker",
    "ProcHandle",
    "become_subreaper",
    "proc_stat",
    "start_ticks",
    "tree_handles",
    "env_has",
    "pids_with_env",
]

logger = logging.getLogger(__name__)


class Marker(Frozen):
    """``name=value`` in a process's environment; with ``prefix``, a value starting so."""

    __slots__ = ("name", "prefix", "value")
    name: str
    value: str
    prefix: bool

    def __init__(self, name: str, value: str, prefix: bool = False) -> None:
        set_fields(self, "name", name)
        set_fields(self, "value", value)
        set_fields(self, "prefix", prefix)

    @property
    def needle(self) -> bytes:
        """What to look for in ``b"\\0" + environ + b"\\0"``."""
        return needle(*self.argv())

    def argv(self) -> list[str]:
        """Three command-line words (see :meth:`from_argv`)."""
        return [self.name, self.value, "prefix" if self.prefix else "exact"]

    @classmethod
    def from_argv(cls, words: list[str]) -> Marker:
        name, value, how = words
        return cls(name, value, how == "prefix")


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process a child subreaper: orphaned descendants are re-parented to it.

    Returns False (and logs why) where ``prctl`` is unavailable; the marker scan still
    finds orphans then.
    """
    try:
        try:  # the C extension when it was built: ctypes costs ≈3 ms of the agent's start
            from elastic.real._spawn import set_child_subreaper
        except ImportError:  # pragma: no cover - depends on the install
            set_child_subreaper = _ctypes_set_child_subreaper
        set_child_subreaper()
    except (OSError, AttributeError) as e:
        logger.warning("cannot become a child subreaper (%s); orphans found by marker only", e)
        return False
    return True


def _ctypes_set_child_subreaper() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _read_proc(path: str) -> bytes | None:
    """The whole of a ``/proc`` file, or None (gone, or another user's).

    Raw ``os.open``/``os.read``: a scan reads one or two files per process on the host,
    and the buffered ``open()`` doubles the cost of each (≈10 µs → ≈4 µs).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:  # the process went away between open and read
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_environ(pid: int) -> bytes | None:
    # None when gone or another user's; a zombie's is empty
    return _read_proc(f"/proc/{pid}/environ")


def env_has(pid: int, marker: Marker) -> bool:
    """True if ``marker`` is in the environment ``pid`` was started with."""
    data = _read_environ(pid)
    return data is not None and marker.needle in b"\0" + data + b"\0"


def pids_with_env(marker: Marker, *, exclude: Collection[int] = ()) -> set[int]:
    """Pids of live processes started with ``marker`` in their environment.

    Reads ``/proc/*/environ`` (the environment at ``exec``, so changes a process makes
    to its own ``os.environ`` do not hide it).  Costs about 10 µs per process.
    """
    needle = marker.needle
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in exclude:
            continue
        data = _read_environ(pid)
        if data and needle in b"\0" + data + b"\0":
            found.add(pid)
    return found


class ProcHandle:
    """A pidfd on one process: signal it safely, learn its exit, reap it if it is ours."""

    __slots__ = ("exited", "fd", "pid")

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.exited = False

    @classmethod
    def open(cls, pid: int, *, marker: Marker | None = None) -> ProcHandle | None:
        """Open ``pid`` if it is alive and (with ``marker``) still carries the marker.

        The check runs after the pidfd is open, so the handle cannot refer to a process
        that recycled the pid after it was found.
        """
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None
        if marker is not None and not env_has(pid, marker):
            os.close(fd)
            return None
        return cls(pid, fd)

    def send(self, sig: int) -> bool:
        """Send ``sig``; False if the process already exited."""
        try:
            signal.pidfd_send_signal(self.fd, sig)
        except ProcessLookupError:
            return False
        return True

    def reap(self) -> None:
        """Collect its exit status if it is a child of this process (else leave it)."""
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitid(os.P_PIDFD, self.fd, os.WEXITED | os.WNOHANG)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time in clock ticks) from ``/proc/<pid>/stat``, or None if gone."""
    st = _stat4(pid)
    return None if st is None else st[:3]


def _stat4(pid: int) -> tuple[int, str, int, int] | None:
    """(ppid, state, start time, process group) from ``/proc/<pid>/stat``, or None."""
    raw = _read_proc(f"/proc/{pid}/stat")
    if not raw:
        return None
    # the command name may hold spaces and parentheses: the fields start after the last ")"
    fields = raw[raw.rindex(b")") + 2 :].split(None, 20)
    return int(fields[1]), fields[0].decode(), int(fields[19]), int(fields[2])


def start_ticks(pid: int | None = None) -> int:
    """The start time of ``pid`` (default: now, as the start time a process born now
    would get), in clock ticks since boot; for ``tree_handles(orphans_since=...)``."""
    if pid is not None:
        st = _stat4(pid)
        return st[2] if st is not None else 0
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


_own: tuple[int, int] | None = None  # (pid, start time) of this process


def _own_start() -> int:
    """This process's start time (clock ticks since boot), read once per process."""
    global _own
    pid = os.getpid()
    if _own is None or _own[0] != pid:  # a forked child has its own
        st = proc_stat(pid)
        _own = (pid, st[2] if st is not None else 0)
    return _own[1]


def _foreign(pid: int, needle: bytes | None) -> bool:
    """True if ``pid`` carries a marker of the process-tree kind that is not ``needle``.

    An orphan re-parented to the agent with no marker at all was started with a scrubbed
    environment (``env={}``): it is the agent's.  One with another marker belongs to
    another agent (or launcher) living in the same process.
    """
    data = _read_environ(pid)
    if data is None:
        return True  # gone, or another user's: not ours to kill
    env = b"\0" + data + b"\0"
    if needle is not None and needle in env:
        return False
    return any(f"\0{name}=".encode() in env for name in _MARKER_NAMES)


_MARKER_NAMES = (ERROR_FILE, AGENT_MARKER, GROUP_MARKER)


def tree_handles(
    roots: Iterable[int],
    marker: Marker | None,
    *,
    exclude: Collection[int] = (),
    orphans_since: int | None = None,
    zombies: list[int] | None = None,
) -> dict[int, ProcHandle]:
    """Handles on every live descendant of ``roots`` and every process carrying ``marker``.

    ``roots`` themselves and ``exclude`` are left out (the caller holds the roots).  One
    pass over ``/proc``, however many roots: ``/proc/<pid>/stat`` of every process on
    the host (≈4 µs each), and the environment only of those younger than the caller
    (``marker`` must be one the caller's own workers carry).

    ``orphans_since`` (clock ticks since boot, as ``/proc/<pid>/stat`` counts; the
    caller is a child subreaper): also every orphan re-parented to the caller — a child
    of the caller started at or after that time, outside the caller's process group (the
    caller's own children stay in it; a worker's descendants are in the worker's group or
    their own), carrying no marker but ``marker`` — and its descendants.  This is how a
    double-forked daemon started with ``env={}`` (no marker) is found while the agent
    lives, at no extra scan.  ``zombies`` (with ``orphans_since``): gets the pids of such
    orphans that are zombies — a worker's child that exited while the worker lived and
    was re-parented to the caller when the worker died — for the caller to reap
    (``exclude`` must hold every worker pid of the caller's, whose exits are read
    elsewhere).
    """
    roots = set(roots)
    me = os.getpid()
    skip = set(exclude) | roots | {me}
    needle = marker.needle if marker is not None else None
    my_pgid = os.getpgid(0)
    # a process older than this one cannot carry its marker (every marked process
    # descends from a worker this process started): its environment is not read
    born = _own_start()
    children: dict[int, list[int]] = {}
    seen: dict[int, int] = {}  # pid → start time, for the identity check after pidfd_open
    marked: set[int] = set()
    orphans: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        st = _stat4(pid)
        if st is None:
            continue
        ppid, state, start, pgid = st
        children.setdefault(ppid, []).append(pid)
        if state == "Z" or pid in skip:
            if (
                zombies is not None
                and state == "Z"
                and orphans_since is not None
                and ppid == me
                and start >= orphans_since
                and pgid != my_pgid
                and pid not in skip
            ):
                zombies.append(pid)
            continue
        seen[pid] = start
        if (
            orphans_since is not None
            and ppid == me
            and start >= orphans_since
            and pgid != my_pgid
            and not _foreign(pid, needle)
        ):
            orphans.append(pid)
            continue
        if needle is not None and start >= born:
            data = _read_environ(pid)
            if data and needle in b"\0" + data + b"\0":
                marked.add(pid)
    # descendants of a marked process belong to the tree too, even with a scrubbed env
    found = marked | set(orphans)
    visited: set[int] = set()
    stack = [*roots, *marked, *orphans]
    while stack:
        pid = stack.pop()
        if pid in visited:
            continue
        visited.add(pid)
        for child in children.get(pid, ()):
            found.add(child)
            stack.append(child)
    handles: dict[int, ProcHandle] = {}
    for pid in sorted(found):
        if pid not in seen:
            continue  # a zombie, or excluded
        h = ProcHandle.open(pid)
        if h is None:
            continue
        now = proc_stat(pid)
        if now is None or now[2] != seen[pid] or now[1] == "Z":
            h.close()  # exited, or its pid was recycled by another process since the scan
            continue
        handles[pid] = h
    return handles
