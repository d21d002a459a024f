"""One cgroup v2 per agent: nothing its workers start outlives it, even a SIGKILL of the agent.

Theory of operation
-------------------
The process-tree nets of :mod:`elastic.real.proctree` (parentage, process group,
environment marker) each have a hole; together they still miss one process once the
agent is SIGKILLed: a double-forked daemon started with an empty environment (no marker)
that left the worker's session (no group) is re-parented away from the dead agent, and
nothing tells it from any other process.  A cgroup has no hole: a process is born in its
parent's cgroup and cannot leave it without write access to another cgroup's
``cgroup.procs``.

Layout.  The agent creates ``<cgroup2 mount>/<its own cgroup>/elastic-<pid>-<nonce>``
(:meth:`AgentCgroup.create`; the mount is read from ``/proc/self/mountinfo`` and the
agent's cgroup from ``/proc/self/cgroup``, nothing is hard-coded) and, for each worker
group it starts, a leaf ``g<k>`` inside it (:meth:`AgentCgroup.group`).  Every worker
joins its group's leaf before it runs a line of its program, so everything it ever forks
is born there: the C start path writes ``0`` to the leaf's ``cgroup.procs`` between
``vfork`` and ``exec`` (:mod:`elastic.real._spawn`), the exec shim before its ``exec``, a
``fork`` start-method child and a ``--preload`` zygote's forked worker first thing
(:func:`join`).  The agent itself, its reaper sidecar and its zygote stay where they were.

Stopping.  A group's stop signals the tree as before, then kills whatever remains in the
group's leaf (``cgroup.kill``: the kernel SIGKILLs every process in it, one forking
meanwhile included) and awaits ``populated 0`` in its ``cgroup.events``: an awaited
notification (the file signals ``POLLPRI`` when it changes, watched through an epoll
registered with the event loop), not a sleep loop.  Then the leaf is removed.  When the
agent closes its workers (:meth:`~elastic.real.workers.ProcessWorkers.aclose`) it does the
same for its whole cgroup.  The reaper sidecar (:mod:`elastic.real.reaper`) is told the
agent's cgroup: when the agent dies, however (SIGKILL included), it writes
``cgroup.kill``, waits for the cgroup to empty, and removes it.  A cgroup whose agent and
sidecar both died (both SIGKILLed) is removed by the next agent that starts beside it, if
it is empty: empty cgroups of dead agents do not accumulate.

Requirements and fallback.  Linux with the cgroup v2 hierarchy mounted (unified or
hybrid mode), kernel ≥ 5.14 (``cgroup.kill``), and the right to create a cgroup under
the agent's own and to move processes into it (root, or a delegated subtree).  Where any
of these is missing the agent logs one debug line and works as before (the nets of
:mod:`elastic.real.proctree` and the sidecar's marker sweep).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import select

from elastic.ids import uuid4_hex
from elastic.real.reaper import CGROUP_PREFIX, remove_cgroup

__all__ = [
    "AgentCgroup",
    "GroupCgroup",
    "cgroup2_dir",
    "join",
    "populated",
]

logger = logging.getLogger(__name__)

MOUNTINFO = "/proc/self/mountinfo"
PROC_CGROUP = "/proc/self/cgroup"
_MAX_STALE = 256  # cgroups of dead agents removed per start, at most


def _unescape(field: str) -> str:
    """A mountinfo path field: spaces, tabs, newlines and backslashes are octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup2_dir(mountinfo: str | None = None, proc_cgroup: str | None = None) -> str | None:
    """The directory of this process's cgroup v2 (its mount point joined with its path),
    or None: no cgroup2 mount, no ``0::`` line, or the cgroup not visible in the mount.
    ``mountinfo`` and ``proc_cgroup`` default to :data:`MOUNTINFO` and :data:`PROC_CGROUP`."""
    mountinfo = MOUNTINFO if mountinfo is None else mountinfo
    proc_cgroup = PROC_CGROUP if proc_cgroup is None else proc_cgroup
    try:
        with open(proc_cgroup, encoding="utf-8", errors="replace") as f:
            own = next((ln[3:].rstrip("\n") for ln in f if ln.startswith("0::")), None)
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if own is None or not own.startswith("/"):
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split(" ")
        if not sep or len(fields) < 5 or right.split(" ", 1)[0] != "cgroup2":
            continue
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        if root == "/":
            rel = own
        elif own == root or own.startswith(root + "/"):
            rel = own[len(root) :]
        else:
            continue  # a bind mount of another part of the hierarchy
        path = os.path.normpath(mount + rel)
        if os.path.isdir(path):
            return path
    return None


def populated(path: str) -> bool:
    """True if the cgroup ``path`` (or one below it) holds a process; False when gone."""
    try:
        with open(os.path.join(path, "cgroup.events"), "rb") as f:
            return b"populated 1" in f.read()
    except OSError:
        return False


def join(path: str) -> None:
    """Move the calling process into the cgroup ``path`` (a forked child, before it forks)."""
    fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


async def wait_empty(path: str, timeout: float) -> bool:
    """Wait until the cgroup ``path`` holds no process; False after ``timeout`` seconds.

    Awaited, not polled: ``cgroup.events`` signals ``POLLPRI`` when it changes; an epoll
    watching for that is itself readable then, so the event loop wakes this up.
    """
    try:
        fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True  # removed: empty
    loop = asyncio.get_running_loop()
    ep = select.epoll()
    changed = asyncio.Event()

    def _changed() -> None:
        ep.poll(0)  # level-triggered: the next read of the file disarms it
        changed.set()

    try:
        ep.register(fd, select.EPOLLPRI)
        loop.add_reader(ep.fileno(), _changed)
        try:
            async with asyncio.timeout(timeout):
                # each read re-arms the notification: a change after it wakes us
                while b"populated 1" in os.pread(fd, 256, 0):
                    await changed.wait()
                    changed.clear()
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(ep.fileno())
        return True
    finally:
        ep.close()
        os.close(fd)


class GroupCgroup:
    """The leaf cgroup of one worker group: its workers join it, its stop kills it."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def open_procs(self) -> int:
        """An fd on its ``cgroup.procs`` (close-on-exec), for the C start path."""
        return os.open(os.path.join(self.path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    async def kill(self, timeout: float) -> bool:
        """SIGKILL what is left in it and await its emptiness; True if something was
        left.  Nothing is written when it is empty already (the usual case: the stop's
        signals reached everything)."""
        if not populated(self.path):
            return False
        try:
            with open(os.path.join(self.path, "cgroup.kill"), "wb") as f:
                f.write(b"1")
        except OSError as e:
            logger.error("cannot kill the processes left in %s: %s", self.path, e)
            return True
        if not await wait_empty(self.path, timeout):
            logger.error("%s still holds processes after SIGKILL (stuck in the kernel?)", self.path)
        return True

    def remove(self) -> None:
        if not remove_cgroup(self.path):
            logger.debug("cgroup %s not removed (not empty yet)", self.path)


class AgentCgroup:
    """The agent's cgroup (``elastic-<pid>-<nonce>``); one leaf per worker group."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._groups = 0

    @classmethod
    def create(
        cls, *, mountinfo: str | None = None, proc_cgroup: str | None = None
    ) -> AgentCgroup | None:
        """Create this agent's cgroup under its own; None (one debug line) where cgroup
        v2 is unavailable or not writable: the caller works without it."""
        own = cgroup2_dir(mountinfo, proc_cgroup)
        if own is None:
            logger.debug("no cgroup v2 hierarchy: workers are tracked without a cgroup")
            return None
        path = os.path.join(own, f"{CGROUP_PREFIX}{os.getpid()}-{uuid4_hex()[:12]}")
        try:
            os.mkdir(path, 0o755)
        except OSError as e:
            logger.debug(
                "cannot create a cgroup under %s (%s): workers are tracked without", own, e
            )
            return None
        try:
            # what moving a worker and killing the cgroup need: write access to the common
            # ancestor's cgroup.procs (our own cgroup), and cgroup.kill (Linux ≥ 5.14)
            for probe in (os.path.join(own, "cgroup.procs"), os.path.join(path, "cgroup.kill")):
                os.close(os.open(probe, os.O_WRONLY | os.O_CLOEXEC))
        except OSError as e:
            with contextlib.suppress(OSError):
                os.rmdir(path)
            logger.debug("cgroup %s is not usable (%s): workers are tracked without", path, e)
            return None
        _remove_stale(own)
        return cls(path)

    def group(self) -> GroupCgroup | None:
        """A new leaf for the next worker group; None (logged) if it cannot be made."""
        path = os.path.join(self.path, f"g{self._groups}")
        self._groups += 1
        try:
            os.mkdir(path, 0o755)
        except OSError as e:
            logger.warning("cannot create the cgroup %s (%s): this group runs without", path, e)
            return None
        return GroupCgroup(path)

    def kill_now(self) -> None:
        """Write ``cgroup.kill`` without waiting (a failing agent's best effort)."""
        if populated(self.path):
            with (
                contextlib.suppress(OSError),
                open(os.path.join(self.path, "cgroup.kill"), "wb") as f,
            ):
                f.write(b"1")

    async def close(self, timeout: float) -> None:
        """Kill whatever is left in the agent's cgroup, await its emptiness, remove it."""
        if populated(self.path):
            await GroupCgroup(self.path).kill(timeout)
        if not remove_cgroup(self.path):
            logger.warning("cgroup %s could not be removed (processes stuck in it)", self.path)


def _remove_stale(parent: str) -> None:
    """Remove the empty ``elastic-<pid>-*`` cgroups beside ours whose agent is dead (its
    sidecar died with it, or the machine's tests SIGKILLed both)."""
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(CGROUP_PREFIX)]
    except OSError:
        return
    me = os.getpid()
    for entry in entries[:_MAX_STALE]:
        pid_text = entry.name[len(CGROUP_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == me or _alive(int(pid_text)):
            continue
        if not populated(entry.path):
            remove_cgroup(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's
    return True
