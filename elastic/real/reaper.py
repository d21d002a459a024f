"""The reaper sidecar: when the agent dies, even by SIGKILL, everything it started dies too.

Theory of operation
-------------------
No orphans, ever (a worker that outlives its agent pins a GPU until someone notices).
Four mechanisms, each covering what the one before cannot:

1. **The worker itself** — every worker starts with ``PR_SET_PDEATHSIG=SIGKILL`` set
   before it runs (between ``vfork`` and ``exec`` in :mod:`elastic.real._spawn`, or by
   the exec shim :mod:`elastic.real._exec_shim` where that was not built): the kernel
   kills it the moment the agent's event-loop thread dies.
2. **Its descendants** — a death signal is not inherited.  Every worker and everything it
   starts carries the agent's marker in its environment (torch's
   ``TORCHELASTIC_ERROR_FILE``, a path under the agent's unique run log directory; see
   :mod:`elastic.real.proctree`).  One sidecar per
   agent (this module, started once by :class:`ReaperSidecar`, not per worker) blocks in
   ``poll()`` on a pidfd of the agent and on a pipe from it.  When the agent dies the
   pidfd becomes readable; the sidecar then SIGKILLs every process whose
   ``/proc/<pid>/environ`` carries the marker, and rescans until none is left (a process
   forking while it is being killed is caught by the next scan).  No polling: the
   sidecar sleeps in the kernel until the agent is gone.
3. **While the agent lives** — the agent is a child subreaper
   (``PR_SET_CHILD_SUBREAPER``), so a descendant whose parent died stays in the agent's
   process tree and ``stop()`` finds it by parentage as well as by the marker
   (:mod:`elastic.real.proctree`) — including an orphan re-parented to the agent
   itself, such as a double-forked daemon started with ``env={}``
   (``tree_handles(orphans_since=...)``), at every restart and at shutdown.
4. **The agent's cgroup** — where cgroup v2 is usable (:mod:`elastic.real.cgroup`) every
   worker joins a cgroup of the agent's before it runs, so everything it forks is born
   there.  The agent sends the cgroup's path over the pipe (``c``, path) before the
   first worker joins it; when the agent dies (or says ``k``) the sidecar writes
   ``cgroup.kill`` — one write kills every process in it, whatever its environment or
   parentage — waits in ``poll`` for ``cgroup.events`` to say ``populated 0``, and
   removes the cgroup.  Then the marker sweep above (for whatever ran outside it).

The sidecar runs in its own session (Ctrl-C in the terminal reaches the agent, which
stops its workers, not the sidecar, which must outlive the agent) and ignores SIGINT,
SIGHUP and SIGTERM (only SIGKILL ends it early).  It holds no marker itself: the agent
sends its marker over the pipe (NUL-terminated fields ``m``, name, value, ``exact`` or
``prefix``) before it spawns the first process that carries it, and each group's private
directory (``d``, path: only ``elastic_workers_*`` directories, the last 64) to remove if
the agent dies.  On a clean shutdown the agent writes ``q`` and the sidecar exits without
scanning.  An agent that fails (an exception of its own, or a stop that did not finish)
writes ``k`` instead: the sidecar sweeps every marked process and removes the
directories at once, then exits.  When the agent dies, what it
wrote is still in the pipe: the sidecar drains it before deciding, so a marker sent an
instant before the agent was killed is used, and a ``q`` is honoured.  A race closed at
start-up: if the agent died before the sidecar opened its pidfd, ``getppid()`` is no
longer the agent, and the sidecar decides at once from what the pipe holds.

What it cannot catch: without a usable cgroup v2 (not root, no cgroup2 mount), a
descendant that dropped the marker (started with a scrubbed environment) *and* left the
worker's process group and session, once the agent is SIGKILLed (it is then re-parented
away, and nothing tells it from any other process); while the agent lives, its ``stop()``
finds such a process by parentage at every restart and at shutdown, so after a SIGKILL
only those started during the last attempt can remain.  With the cgroup: a process that
moved itself to another cgroup (which takes root).

This file runs as ``python -I -S reaper.py <agent_pid>``: standard library only, and
few modules of it (``os``, ``sys``, ``select``, ``_signal``), so the sidecar is up in
about 10 ms of one CPU.  ``elastic run`` starts it first thing (:meth:`ReaperSidecar.start`
before the agent's modules are imported), so that its start-up runs on a CPU the agent's
single-threaded import leaves idle rather than next to the workers starting; the agent's
:class:`~elastic.real.workers.ProcessWorkers` is handed it and sends the marker before
the first worker is spawned.  A ``ProcessWorkers`` given none starts its own right after
the first group's workers (the same synchronous call, before any worker ran a line) and
sends the marker at once.
"""

from __future__ import annotations

import os
import sys

# not ``signal``/``time``/``contextlib``/``typing``: their imports (enum, collections,
# functools, re) are most of this interpreter's start-up; ``_signal`` is the same
# functions, built in
_sig = __import__("_signal")
_SIGKILL = 9

__all__ = [
    "AGENT_MARKER",
    "CGROUP_PREFIX",
    "ERROR_FILE",
    "GROUP_MARKER",
    "ReaperSidecar",
    "kill_cgroup",
    "kill_marked",
    "marker_message",
    "needle",
    "remove_cgroup",
]

# The variables that mark a worker's process tree (see elastic.real.proctree, which
# re-exports them): torch's error file path, else the launcher's own two.
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
AGENT_MARKER = "ELASTIC_AGENT_INSTANCE"
GROUP_MARKER = "ELASTIC_WORKER_GROUP"
# a sidecar inherits none of them from its agent: it would count as a worker's
# descendant of a launcher above (the agent's own error file is that launcher's marker)
_NOT_INHERITED = (ERROR_FILE, AGENT_MARKER, GROUP_MARKER)


def needle(name: str, value: str, how: str) -> bytes:
    """The bytes a marked ``/proc/<pid>/environ`` holds (as ``proctree.Marker.needle``)."""
    text = f"\0{name}={value}"
    return (text if how == "prefix" else text + "\0").encode()


def _marked(needle: bytes, me: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if needle in b"\0" + data + b"\0":
            found.append(int(entry))
    return found


def kill_marked(needle: bytes, *, max_rounds: int = 200) -> int:
    """SIGKILL every process whose environment holds ``needle``; return how many.

    Rescans until a scan finds none; a killed process leaves ``/proc`` or becomes a
    zombie (whose environment reads empty) at once, so this ends after a round or two.
    Bounded so that an unkillable process (stuck in the kernel) cannot keep it forever.
    """
    me = os.getpid()
    killed: set[int] = set()
    for round_ in range(max_rounds):
        pids = _marked(needle, me)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, _SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        if round_ >= 2:
            # something survives SIGKILL for now (uninterruptible sleep): back off a bit
            # (select's timeout: `time` is not imported here, see above)
            __import__("select").select([], [], [], 0.01)
    return len(killed)


CGROUP_PREFIX = "elastic-"  # the only cgroups the sidecar kills and removes
_CGROUP_WAIT = 10.0  # seconds for a killed cgroup to empty (a process stuck in the kernel)


def kill_cgroup(path: str, timeout: float = _CGROUP_WAIT) -> bool:
    """SIGKILL everything in the cgroup v2 ``path`` and below (``cgroup.kill``) and wait
    until it is empty (``populated 0`` in ``cgroup.events``); True if it is (or is gone).

    The kernel kills every process of the subtree, a process forking meanwhile included,
    in one write.  The wait sleeps in ``poll`` on ``cgroup.events`` (the kernel signals
    ``POLLPRI`` when it changes), up to ``timeout`` seconds in all.
    """
    try:
        fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True  # removed already
    try:
        if _populated(fd):  # (reading it also arms the notification)
            kfd = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(kfd, b"1")
            finally:
                os.close(kfd)
        select = __import__("select")  # only now: see the imports at the top
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        monotonic = __import__("time").monotonic
        deadline = monotonic() + timeout
        while _populated(fd):
            left = deadline - monotonic()
            if left <= 0:
                return False
            poller.poll(int(left * 1000) + 1)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _populated(events_fd: int) -> bool:
    """``populated 1`` in an open ``cgroup.events`` (read from its start)."""
    return b"populated 1" in os.pread(events_fd, 256, 0)


def remove_cgroup(path: str) -> bool:
    """Remove the cgroup ``path`` and the cgroups below it, deepest first; True if gone.

    Only empty cgroups can be removed (``EBUSY`` otherwise: they are left as they are).
    A cgroup's files are the kernel's: ``rmdir`` removes a cgroup directory with them.
    """
    if not os.path.isdir(path):
        return True
    for top, _dirs, _files in os.walk(path, topdown=False):
        try:
            os.rmdir(top)
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return True


def _is_agent_cgroup(path: str) -> bool:
    """A path the sidecar may kill: an ``elastic-*`` cgroup v2 directory (it has
    ``cgroup.kill``), as the agent creates (:mod:`elastic.real.cgroup`)."""
    return (
        os.path.isabs(path)
        and os.path.basename(path).startswith(CGROUP_PREFIX)
        and os.path.exists(os.path.join(path, "cgroup.kill"))
    )


_DIR_PREFIX = "elastic_workers_"  # the only directories the sidecar removes
_MAX_DIRS = 64  # the most recent ones kept; older groups' were removed by the agent


class _Orders:
    """What the agent said over the pipe: its marker (the last one sent), its cgroup
    (the last one sent), the private directories to remove if it dies, "q" (quit
    quietly) and "k" (sweep, then quit)."""

    def __init__(self) -> None:
        self.needle: bytes | None = None
        self.cgroup: str | None = None
        self.quit = False
        self.sweep = False
        self.dirs: list[str] = []
        self._rest = b""

    def feed(self, data: bytes) -> None:
        fields = (self._rest + data).split(b"\0")
        self._rest = fields.pop()  # an unterminated field: the rest of it is to come
        i = 0
        while i < len(fields):
            if fields[i] == b"q":
                self.quit = True
            elif fields[i] == b"k":
                self.sweep = True
            elif fields[i] in (b"d", b"c"):
                if len(fields) - i < 2:
                    self._rest = b"\0".join([*fields[i:], self._rest])
                    return
                path = os.fsdecode(fields[i + 1])
                if fields[i] == b"c":
                    self.cgroup = path  # checked when it is used (_is_agent_cgroup)
                elif os.path.basename(path).startswith(_DIR_PREFIX) and path not in self.dirs:
                    self.dirs = [*self.dirs[-(_MAX_DIRS - 1) :], path]
                i += 1
            elif fields[i] == b"m":
                if len(fields) - i < 4:  # the marker's fields are split across reads
                    self._rest = b"\0".join([*fields[i:], self._rest])
                    return
                name, value, how = (os.fsdecode(f) for f in fields[i + 1 : i + 4])
                self.needle = needle(name, value, how)
                i += 3
            i += 1

    def drain(self, fd: int) -> None:
        """Read what the pipe holds without blocking (the agent may be gone)."""
        try:
            os.set_blocking(fd, False)
            while True:
                data = os.read(fd, 65536)
                if not data:
                    return
                self.feed(data)
        except OSError:  # BlockingIOError: nothing more for now
            return


def marker_message(marker: list[str]) -> bytes:
    """The pipe message that gives the sidecar the marker (``Marker.argv()``'s three fields)."""
    return b"".join(os.fsencode(f) + b"\0" for f in ["m", *marker])


def _remove_dirs(dirs: list[str]) -> None:
    if dirs:
        rmtree = __import__("shutil").rmtree  # only now: see the imports at the top
        for d in dirs:
            rmtree(d, ignore_errors=True)


def _sidecar(agent_pid: int, pipe: int = 0) -> int:
    # it must outlive the agent: the terminal's or a parent launcher's shutdown signals are
    # for the agent, which then stops its workers and lets this process go with "q"
    import select

    for sig in (_sig.SIGINT, _sig.SIGHUP, _sig.SIGTERM):
        _sig.signal(sig, _sig.SIG_IGN)
    orders = _Orders()
    try:
        pidfd: int | None = os.pidfd_open(agent_pid)
    except OSError:
        pidfd = None
    if pidfd is not None and os.getppid() == agent_pid:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(pipe, select.POLLIN)
        pipe_open = True
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if pipe in ready and pipe_open:
                data = os.read(pipe, 65536)
                orders.feed(data)
                if orders.sweep:
                    break  # the agent failed to stop everything: sweep now, then leave
                if orders.quit:
                    return 0  # clean shutdown: the agent stopped its workers itself
                if not data:
                    # every write end closed; the agent may still live (it closed the
                    # pipe by mistake), so keep waiting on its pidfd alone
                    poller.unregister(pipe)
                    pipe_open = False
            if pidfd in ready:
                break  # the agent is gone
    # the agent is gone (or asked for a sweep): what it wrote last is still in the pipe
    orders.drain(pipe)
    if orders.quit and not orders.sweep:
        return 0  # it finished cleanly (and removed its cgroup itself)
    why = "failed" if orders.sweep else "died"
    cgroup = orders.cgroup if orders.cgroup and _is_agent_cgroup(orders.cgroup) else None
    # first: one write kills all the agent's processes, whatever their environment or
    # parentage (a double-forked env={} daemon included)
    if cgroup is not None and not kill_cgroup(cgroup):
        sys.stderr.write(f"elastic reaper: agent {agent_pid} {why}; {cgroup} not emptied\n")
    if orders.needle is not None:
        n = kill_marked(orders.needle)  # what runs outside the cgroup (none was usable)
        if n:
            sys.stderr.write(f"elastic reaper: agent {agent_pid} {why}; killed {n} process(es)\n")
    if cgroup is not None:
        remove_cgroup(cgroup)
    _remove_dirs(orders.dirs)
    return 0


class ReaperSidecar:
    """The agent's handle on its sidecar: start it once, send the marker, let it go."""

    #: pids of the sidecars this process started and has not reaped: its children, never
    #: orphans of a worker (``ProcessGroup.stop`` leaves them alone)
    live_pids: set[int] = set()  # noqa: RUF012  # shared by design

    def __init__(self, marker: list[str] | None = None) -> None:
        """``marker``: the agent's marker as ``proctree.Marker.argv()`` writes it, sent
        right after the start; or None, to send it later with :meth:`set_marker`."""
        self.marker = marker
        self.pid: int | None = None
        self._pipe_w: int | None = None

    @property
    def pipe_fd(self) -> int | None:
        """The write end held by the agent (a forked child must close it)."""
        return self._pipe_w

    def start(self) -> int:
        """Start the sidecar (idempotent); return its pid."""
        if self.pid is not None:
            return self.pid
        r, w = os.pipe()
        # no marker of ours, nor of a launcher above us (it would count us as its worker's)
        env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        try:
            pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
                env,
                file_actions=[(os.POSIX_SPAWN_DUP2, r, 0)],
                setsid=True,
            )
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self.pid = pid
        ReaperSidecar.live_pids.add(pid)
        self._pipe_w = w
        if self.marker is not None:
            self.set_marker(self.marker)
        return pid

    def set_marker(self, marker: list[str]) -> None:
        """Tell the sidecar the marker of what to kill if the agent dies.

        Call it before spawning the first process that carries the marker: the bytes are
        in the pipe when this returns, and the sidecar reads them even after the agent's
        death.
        """
        self.marker = marker
        self._send(marker_message(marker))

    def set_cgroup(self, path: str) -> None:
        """Tell the sidecar the agent's cgroup (:mod:`elastic.real.cgroup`): if the agent
        dies, it kills everything in it and removes it.  Call it before the first
        process is placed there."""
        self._send(b"c\0" + os.fsencode(path) + b"\0")

    def add_dir(self, path: str) -> None:
        """Tell the sidecar a private directory (``elastic_workers_*``) to remove if the
        agent dies (the agent removes it itself otherwise)."""
        self._send(b"d\0" + os.fsencode(path) + b"\0")

    def _send(self, data: bytes) -> None:
        if self._pipe_w is None:
            return
        try:
            while data:
                data = data[os.write(self._pipe_w, data) :]
        except OSError:
            pass  # the sidecar is gone (killed from outside): nothing to tell

    def request_exit(self, sweep: bool = False) -> None:
        """Tell the sidecar to exit without killing anything (the agent cleaned up), or,
        with ``sweep``, to kill every marked process and remove the private directories
        first (the agent is failing: its own stop may not have run or finished)."""
        if self._pipe_w is not None:
            self._send(b"k\0" if sweep else b"q\0")
            if self._pipe_w is not None:
                os.close(self._pipe_w)
                self._pipe_w = None

    def close(self, timeout: float = 5.0, sweep: bool = False) -> None:
        """:meth:`request_exit` (``sweep`` as there), then reap the sidecar (SIGKILL after
        ``timeout``).

        Blocking: a caller on an event loop waits for the exit there first and then
        calls this with ``timeout=0`` (:meth:`ProcessWorkers.aclose
        <elastic.real.workers.ProcessWorkers.aclose>`).  Does nothing once the sidecar
        was reaped.
        """
        pid = self.pid
        if pid is None:
            return
        self.request_exit(sweep)
        import select

        try:
            fd = os.pidfd_open(pid)
        except OSError:  # reaped by someone else already
            ReaperSidecar.live_pids.discard(pid)
            self.pid = None
            return
        try:
            if not select.select([fd], [], [], timeout)[0]:
                os.kill(pid, _SIGKILL)
            try:  # noqa: SIM105  # contextlib costs the sidecar's start-up (see the top)
                os.waitid(os.P_PIDFD, fd, os.WEXITED)
            except ChildProcessError:
                pass
        finally:
            os.close(fd)
            ReaperSidecar.live_pids.discard(pid)
            self.pid = None


if __name__ == "__main__":
    _code = _sidecar(int(sys.argv[1]))
    sys.stderr.flush()
    # no interpreter teardown: the agent may be waiting for this exit (≈1-2 ms)
    os._exit(_code)
