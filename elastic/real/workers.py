"""The real workers port: worker processes started, watched, logged and reaped on Linux.

Theory of operation
-------------------
:class:`ProcessWorkers` implements :class:`elastic.workers.WorkersPort` on an asyncio
event loop (it uses asyncio directly; it does not need the clock port).

Starting.  Each worker is started by the C extension :mod:`elastic.real._spawn`: between
``vfork`` and ``exec`` (no Python code runs there, safe with threads) it joins its own
process group, gets its streams, sets its parent-death signal (``SIGKILL`` when the
agent's event-loop thread dies) and checks the agent is still its parent — one ``exec``,
no second interpreter.  Where the extension was not built (no C compiler at install
time) the worker is started with ``os.posix_spawn`` through the exec shim
(:mod:`elastic.real._exec_shim`), which does the same in Python and then ``exec``'s the
worker in place (same pid, ~15 ms and a second interpreter's CPU more per worker).
An executable entrypoint is resolved on the
worker's ``PATH`` first (a missing one is a one-line :class:`~elastic.errors.ConfigError`);
``${local_rank}`` in string arguments becomes the local rank.  A function entrypoint is
run by :mod:`elastic.real._fn_runner`: with ``start_method="spawn"`` the function is found
again by its import path (module + qualified name, ``__main__`` re-run as
``__mp_main__``), so lambdas and local functions are refused; with ``"fork"`` the child
calls it directly, with the arguments it inherited (any objects: a model, a closure, as
with torch's fork).  Otherwise arguments, and always return values, are data, never
pickle: JSON with tags for tuples, bytes, non-str dict keys and tensors
(:mod:`elastic.real._fn_runner`); a return value that cannot be written so (or is over
64 MiB encoded), or that the agent cannot read back, fails the worker (exit code 1, the
reason in its error file).
Each worker leads its own process group and its environment is the agent's, overlaid by
``WorkerLaunch.env``, plus ``TORCHELASTIC_ERROR_FILE`` (from the
:class:`~elastic.multiprocessing.api.LogsSpecs`) — the same names torch gives.  The
error file's path doubles as the process-tree marker (:class:`proctree.Marker`); only
without one (``/dev/null`` logs, a custom ``LogsSpecs``) are the markers
``ELASTIC_AGENT_INSTANCE`` / ``ELASTIC_WORKER_GROUP`` added.

Watching.  Each worker has a pidfd (``os.pidfd_open``, Linux ≥ 5.3) registered with
``loop.add_reader``: the kernel makes it readable when the worker exits, the callback
reaps it with ``waitid(P_PIDFD)`` and queues a :class:`~elastic.workers.WorkerExit`.  No
thread, no polling; ``next_exit()`` returns exits in the order the kernel reported them.
Exit codes follow torch: negative for a signal.  Causes: ``STOPPED_BY_AGENT`` for exits
during ``stop()`` or from a signal the agent sent with ``signal()``; ``OOM_KILLED`` for
a SIGKILL when the kernel's OOM-kill count rose (:mod:`elastic.multiprocessing.oom`);
``SIGNALED`` for other signals; else ``EXITED``.

Logging.  Redirected streams go straight from the worker to their file.  Tee'd streams
go through a pipe: the loop reads it when readable and a
:class:`~elastic.multiprocessing.tail.TeeSink` writes each chunk to the file and the
``[<role><local_rank>]:``-prefixed lines to the agent's console.  Streams neither
redirected nor filtered out are the agent's own stdout/stderr, as in torch.

Cgroup.  Where cgroup v2 is usable the agent has a cgroup of its own and each group a
leaf in it (:mod:`elastic.real.cgroup`); every worker joins its group's leaf before its
program runs (the C start path between ``vfork`` and ``exec``, the exec shim before its
``exec``, a ``fork`` child and a zygote-forked worker first thing), so all it forks is
born there.  Elsewhere: one debug line, and the nets below alone.

Stopping and orphans.  ``stop(grace, sig)`` signals each live worker's process group and
every descendant found by parentage or marker (:mod:`elastic.real.proctree`), and every
orphan re-parented to the agent since its first start (the agent is a child subreaper: a
double-forked daemon started with ``env={}`` carries no marker but lands there), waits —
on pidfds, not by polling — up to ``grace`` for all of them, then SIGKILLs and rescans
until nothing is left; then it kills what remains in the group's cgroup
(``cgroup.kill``, awaiting ``populated 0``) and removes it.  Every victim's pidfd is
closed and every victim that was the agent's child reaped as soon as it is gone, and
zombie orphans found by a scan are reaped: fds and zombies stay flat over restarts
(tests/test_soak.py).  If the agent fails (``aclose(sweep=True)``, or a stop that
raised) the sidecar sweeps every marked process before it leaves.  If the agent itself
dies, the workers die by their death signal and their descendants by the reaper sidecar
(:mod:`elastic.real.reaper`); the agent is a child subreaper so orphans stay in its tree
while it lives.  ``elastic run`` starts the sidecar first thing (on the CPU its own
start-up leaves idle) and hands it over; it learns the marker before the first worker is
spawned.  Otherwise it is started right after the first group's workers, not before, so
its interpreter does not delay theirs; that leaves no window that matters: until it is
spawned (the same synchronous call that spawned the workers, microseconds) no worker has
run a line of code, let alone started a descendant, and once spawned it checks at
start-up that the agent is still its parent (killing every marked process if not).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import io
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from string import Template
from typing import IO, TYPE_CHECKING, Any, Literal

from elastic._records import Record
from elastic.errors import (
    ConfigError,
    ElasticError,
    EntrypointNotExecutableError,
    EntrypointNotFoundError,
)
from elastic.ids import uuid4_hex
from elastic.multiprocessing.api import DefaultLogsSpecs, LogsDest, LogsSpecs
from elastic.multiprocessing.oom import OomCounters, oom_verdict, read_oom_counters
from elastic.multiprocessing.tail import TeeSink, default_header
from elastic.real import _fn_runner, proctree
from elastic.real.cgroup import AgentCgroup, GroupCgroup
from elastic.real.cgroup import join as join_cgroup
from elastic.real.reaper import ReaperSidecar
from elastic.workers import ExitCause, ExitList, WorkerExit, WorkerLaunch

if TYPE_CHECKING:
    from elastic.real.zygote import Zygote

try:  # the C start path; absent when the extension could not be built
    from elastic.real import _spawn as _cspawn
except ImportError:  # pragma: no cover - depends on the install
    _cspawn = None  # type: ignore[assignment]

__all__ = ["ProcessGroup", "ProcessWorkers", "StartMethod", "substitute_local_rank"]

logger = logging.getLogger(__name__)

StartMethod = Literal["spawn", "fork"]

_SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_exec_shim.py")
_RUNNER = os.path.abspath(_fn_runner.__file__)
#: put first on every worker's PYTHONPATH: its sitecustomize destroys a torch process
#: group left initialised at a normal exit (see that file for why)
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")


def with_exit_hook(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`SITE_DIR` first on ``PYTHONPATH`` (changed in place, returned)."""
    path = env.get("PYTHONPATH")
    if not path:
        env["PYTHONPATH"] = SITE_DIR
    elif path.split(os.pathsep, 1)[0] != SITE_DIR:
        env["PYTHONPATH"] = SITE_DIR + os.pathsep + path
    return env


_PR_SET_PDEATHSIG = 1
_READ_CHUNK = 64 * 1024
_KILL_ROUNDS = 20
_ADOPT_AFTER = 0.05  # seconds: see ProcessGroup._on_exit
_SIDECAR_GRACE = 5.0  # seconds for the sidecar to leave once told to
_SIGTERM = int(signal.SIGTERM)
PRIVATE_DIR_PREFIX = "elastic_workers_"  # the method ProcessGroup.signal shadows the module


def substitute_local_rank(args: Sequence[Any], local_rank: int) -> list[Any]:
    """torch's macro: ``${local_rank}`` in each string argument becomes the local rank."""
    return [
        Template(a).safe_substitute(local_rank=str(local_rank)) if isinstance(a, str) else a
        for a in args
    ]


class _Console:
    """The agent's console as a byte sink, flushing the text layer first to keep order."""

    def __init__(self, stream: IO[str] | IO[bytes]) -> None:
        self._stream = stream

    def write(self, data: bytes, /) -> int:
        s = self._stream
        buffer = getattr(s, "buffer", None)
        if buffer is not None:
            s.flush()
            buffer.write(data)
            buffer.flush()
        elif isinstance(s, io.TextIOBase):
            s.write(data.decode(errors="replace"))
        else:
            s.write(data)  # type: ignore[arg-type]
        return len(data)

    def flush(self) -> None:
        self._stream.flush()


class _Drain(enum.Enum):
    ONE = "one"
    ALL = "all"
    FINAL = "final"


class _Worker(Record):
    """Launcher-side state of one worker (mutable, private)."""

    __slots__ = (
        "done",
        "error_file",
        "handle",
        "launch",
        "pid",
        "result_path",
        "signals_sent",
        "tee_fds",
    )
    launch: WorkerLaunch
    pid: int
    handle: proctree.ProcHandle
    result_path: str | None
    error_file: str | None
    done: asyncio.Future[WorkerExit]
    tee_fds: list[int]
    signals_sent: set[int]

    def __init__(
        self,
        launch: WorkerLaunch,
        pid: int,
        handle: proctree.ProcHandle,
        result_path: str | None,
        error_file: str | None,
        done: asyncio.Future[WorkerExit],
        tee_fds: list[int],
        signals_sent: set[int],
    ) -> None:
        self.launch = launch
        self.pid = pid
        self.handle = handle
        self.result_path = result_path
        self.error_file = error_file
        self.done = done
        self.tee_fds = tee_fds
        self.signals_sent = signals_sent


class ProcessGroup:
    """A started group of worker processes (the real :class:`elastic.workers.RunningGroup`)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        marker: proctree.Marker,
        dest: LogsDest,
        private_dir: str,
        oom_before: OomCounters,
        kill_timeout: float,
        orphans_since: int | None = None,
        cgroup: GroupCgroup | None = None,
    ) -> None:
        self._loop = loop
        #: the group's leaf cgroup, which every worker joins before it runs (None: no
        #: cgroup v2 here; see elastic.real.cgroup)
        self.cgroup = cgroup
        self.marker = marker
        self.logs = dest
        self._private_dir = private_dir
        self._oom_before = oom_before
        self._kill_timeout = kill_timeout
        # the agent is a subreaper: its orphans started since then are this group's to
        # stop (see proctree.tree_handles); None when it is not one
        self._orphans_since = orphans_since
        self._workers: dict[int, _Worker] = {}
        self._exits: asyncio.Queue[WorkerExit] = asyncio.Queue()
        self._stop_task: asyncio.Task[ExitList] | None = None
        self._stopping = False
        self._stop_exits: list[WorkerExit] = []
        self._sinks: dict[int, TeeSink] = {}
        self._adopted: dict[int, proctree.ProcHandle] = {}
        self._adopt_scheduled = False

    # -- RunningGroup --------------------------------------------------------------------

    def pids(self) -> dict[int, int]:
        return {r: w.pid for r, w in sorted(self._workers.items())}

    def running(self) -> frozenset[int]:
        return frozenset(r for r, w in self._workers.items() if not w.done.done())

    async def next_exit(self) -> WorkerExit:
        """The next exit not yet returned, in exit order.

        Raises ``RuntimeError`` if every worker's exit was already returned (waiting
        would never end).  Exits during ``stop()`` are queued here too.
        """
        if self._exits.empty() and not self.running():
            raise RuntimeError(
                "next_exit(): every worker of this group has exited and its exit was "
                "already returned"
            )
        return await self._exits.get()

    def signal(self, sig: int, local_rank: int | None = None) -> None:
        """Send ``sig`` to one worker process (or each), not its descendants."""
        targets = self._workers.values() if local_rank is None else [self._workers[local_rank]]
        for w in targets:
            if not w.done.done() and w.handle.send(sig):
                w.signals_sent.add(sig)

    async def stop(self, grace: float, sig: int = _SIGTERM) -> ExitList:
        """Signal every worker's tree, wait up to ``grace``, SIGKILL the rest.

        Returns once every worker and every descendant found is gone (or, for a process
        stuck in the kernel, after ``kill_timeout`` more seconds, logged).  Returns the
        exits that happened during the stop; they are also queued for ``next_exit``.
        Calling it again waits for the first call and returns the same list.
        """
        if self._stop_task is None:
            self._stop_task = self._loop.create_task(self._stop(grace, sig))
        return await asyncio.shield(self._stop_task)

    def stopped_cleanly(self) -> bool:
        """True once :meth:`stop` has finished without an error."""
        t = self._stop_task
        return t is not None and t.done() and not t.cancelled() and t.exception() is None

    # -- exits ---------------------------------------------------------------------------

    def _watch(self, w: _Worker) -> None:
        self._loop.add_reader(w.handle.fd, self._on_exit, w)

    def _on_exit(self, w: _Worker) -> None:
        try:
            info = os.waitid(os.P_PIDFD, w.handle.fd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            info = None
            code = -1  # reaped by someone else (a foreign waitpid(-1)): status is lost
            logger.warning("worker pid %s was reaped by someone else; exit code unknown", w.pid)
        else:
            if info is None:
                return  # spurious wake-up: not exited yet
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        now = time.monotonic()
        _WORKER_PIDS.discard(w.pid)
        self._loop.remove_reader(w.handle.fd)
        w.handle.exited = True
        for fd in w.tee_fds:
            self._drain(fd, _Drain.ALL)
        lr = w.launch.local_rank
        extra: dict[str, Any] = {}
        value = None
        if code == 0 and w.result_path is not None:
            value, problem = _read_result(w.result_path)
            if problem == _NO_RESULT:  # exited 0 without returning (os._exit(0), say)
                logger.warning("local_rank %s: return value recorded as None: %s", lr, problem)
                extra["return_value_error"] = problem
            elif problem:
                # a value that cannot be read back is a failure, not a silent None
                code = 1
                extra["return_value_error"] = problem
                logger.error("local_rank %s (pid %s) FAILED: %s", lr, w.pid, problem)
                _record_result_error(w.error_file, problem)
        cause = self._cause(w, code)
        error_file = w.error_file if w.error_file and os.path.isfile(w.error_file) else None
        ex = WorkerExit(lr, code, now, cause, w.pid, value, error_file, extra)
        w.done.set_result(ex)
        self._exits.put_nowait(ex)
        if self._stopping:
            self._stop_exits.append(ex)
        if not self._stopping and not self._adopt_scheduled:
            # one scan for the exits of the next _ADOPT_AFTER seconds, not one per exit:
            # workers tend to end together (a job's end, a crash that takes its peers
            # down), and a group that ends or is stopped by then is adopted from by its
            # stop.  An orphan that exits meanwhile is a zombie that long, no more.
            self._adopt_scheduled = True
            self._loop.call_later(_ADOPT_AFTER, self._adopt_after_exit)
        if not self.running() and not self._stopping:
            self._finish()

    def _cause(self, w: _Worker, code: int) -> ExitCause:
        if self._stopping:
            return ExitCause.STOPPED_BY_AGENT
        if code >= 0:
            return ExitCause.EXITED
        if -code in w.signals_sent:
            return ExitCause.STOPPED_BY_AGENT
        if -code == signal.SIGKILL:
            verdict = oom_verdict(code, self._oom_before, read_oom_counters())
            if verdict.oom:
                return ExitCause.OOM_KILLED
        return ExitCause.SIGNALED

    def _adopt_after_exit(self) -> None:
        if self._stopping or not self.running():
            # the agent reacted to the exit by stopping the group (a restart), or every
            # worker has exited, and the agent stops a group that ended (at a restart or
            # at the job's end, after the exit barrier): the stop scans /proc and adopts
            # at its end itself — one scan fewer before a restart or the exit
            self._adopt_scheduled = False
            return
        self._adopt_orphans()

    def _adopt_orphans(self, scan: bool = True) -> None:
        """Watch descendants re-parented to the agent (a subreaper) so their exits are reaped.

        Without this a grandchild whose worker died first would stay a zombie of the
        agent.  Event-driven: each adopted process is reaped when its pidfd fires.
        ``scan=False``: only reap zombies of the workers' groups (a scan just found none).
        """
        self._adopt_scheduled = False
        me = os.getpid()
        worker_pids = {w.pid for w in self._workers.values()}
        zombies: list[int] = []
        found = (
            proctree.tree_handles(
                (),
                self.marker,
                exclude=worker_pids | self._adopted.keys() | _excluded(),
                orphans_since=self._orphans_since,
                zombies=zombies,
            )
            if scan
            else {}
        )
        _reap_zombies(zombies)
        for pid, h in found.items():
            try:
                st = proctree.proc_stat(pid)
                ours = st is not None and st[0] == me
            except OSError:
                ours = False
            if ours:
                self._adopted[pid] = h
                self._loop.add_reader(h.fd, self._on_adopted_exit, h)
            else:
                h.close()
        # zombies in a worker's process group whose exit we never saw
        for w in self._workers.values():
            if w.done.done():
                with contextlib.suppress(ChildProcessError, OSError):
                    while os.waitid(os.P_PGID, w.pid, os.WEXITED | os.WNOHANG) is not None:
                        pass

    def _on_adopted_exit(self, h: proctree.ProcHandle) -> None:
        self._loop.remove_reader(h.fd)
        h.reap()
        h.close()
        self._adopted.pop(h.pid, None)

    # -- logs ----------------------------------------------------------------------------

    def _tee(self, fd: int, sink: TeeSink) -> None:
        os.set_blocking(fd, False)
        self._sinks[fd] = sink
        self._loop.add_reader(fd, self._drain, fd, _Drain.ONE)

    def _drain(self, fd: int, how: _Drain) -> None:
        """Copy what the pipe holds to its sink; close both at end of file.

        ``ONE`` chunk per wake-up of the reader, so a chatty worker cannot starve the loop;
        ``ALL`` that is buffered now (at a worker's exit, so its last lines are logged
        before its exit is reported); ``FINAL`` drains and closes even without end of
        file (after stop, when a writer that escaped may still hold the pipe).
        """
        sink = self._sinks.get(fd)
        if sink is None:
            return
        eof = False
        while True:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            sink.feed(chunk)
            if how is _Drain.ONE:
                break
        if eof or how is _Drain.FINAL:
            self._loop.remove_reader(fd)
            sink.close()
            os.close(fd)
            del self._sinks[fd]

    # -- stop ----------------------------------------------------------------------------

    def _live(self) -> list[_Worker]:
        return [w for w in self._workers.values() if not w.done.done()]

    def _tree(self, known: Mapping[int, proctree.ProcHandle]) -> dict[int, proctree.ProcHandle]:
        worker_pids = {w.pid for w in self._workers.values()}
        zombies: list[int] = []
        found = proctree.tree_handles(
            [w.pid for w in self._live()],
            self.marker,
            exclude=worker_pids | set(known) | _excluded(),
            orphans_since=self._orphans_since,
            zombies=zombies,
        )
        _reap_zombies(zombies)
        return found

    def _send_all(self, sig: int, victims: Mapping[int, proctree.ProcHandle]) -> None:
        for w in self._live():
            # the group first: it reaches a child forked an instant ago, atomically
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.pid, sig)
            w.handle.send(sig)
        for v in victims.values():
            if not v.exited:
                v.send(sig)

    async def _wait_gone(self, victims: Mapping[int, proctree.ProcHandle], timeout: float) -> bool:
        """Wait until every live worker and victim has exited; False on timeout."""
        waits: list[asyncio.Future[Any]] = [w.done for w in self._live()]
        registered: list[int] = []
        for v in victims.values():
            if v.exited or v.fd < 0:
                continue
            fut: asyncio.Future[None] = self._loop.create_future()

            def _fire(v: proctree.ProcHandle = v, fut: asyncio.Future[None] = fut) -> None:
                v.exited = True
                self._loop.remove_reader(v.fd)
                if not fut.done():
                    fut.set_result(None)

            self._loop.add_reader(v.fd, _fire)
            registered.append(v.fd)
            waits.append(fut)
        try:
            if not waits:
                return True
            _, pending = await asyncio.wait(waits, timeout=max(timeout, 0.0))
            return not pending
        finally:
            for fd in registered:
                self._loop.remove_reader(fd)

    async def _stop(self, grace: float, sig: int) -> ExitList:
        self._stopping = True
        victims = self._tree({})
        # nothing alive in the tree (a group that already ended, the usual stop at the
        # end of a job): nothing was signalled, so nothing can have forked since the
        # scan; skip the rescans (each reads all of /proc, ≈1-3 ms)
        nothing_left = not self._live() and not victims
        self._send_all(sig, victims)
        await self._wait_gone(victims, grace)
        deadline = time.monotonic() + self._kill_timeout
        for _ in range(0 if nothing_left else _KILL_ROUNDS):
            victims = self._release_exited(victims)
            victims.update(self._tree(victims))
            if not self._live() and not victims:
                nothing_left = True  # this scan found nothing: the one below would not
                break
            self._send_all(signal.SIGKILL, victims)
            if not await self._wait_gone(victims, deadline - time.monotonic()):
                logger.error(
                    "processes %s survive SIGKILL (stuck in the kernel?); giving up on them",
                    sorted({w.pid for w in self._live()} | set(victims)),
                )
                break
        if self.cgroup is not None:
            # the last net: whatever of the group the scans missed (a daemon that left
            # every tree the scans know) dies with the cgroup; usually it is empty by now
            if await self.cgroup.kill(max(deadline - time.monotonic(), 1.0)):
                nothing_left = False  # killed orphans of ours are zombies to reap below
            self.cgroup.remove()
        for v in victims.values():
            v.reap()
            v.close()
        self._adopt_orphans(scan=not nothing_left)
        self._finish()
        return ExitList.of(self._stop_exits)

    @staticmethod
    def _release_exited(
        victims: Mapping[int, proctree.ProcHandle],
    ) -> dict[int, proctree.ProcHandle]:
        """The victims still alive; those that exited are reaped (if ours) and closed.

        Dropping an exited victim without this leaked its pidfd and, for an orphan
        re-parented to the agent, left it a zombie — at every restart (issue 15).
        """
        alive: dict[int, proctree.ProcHandle] = {}
        for pid, v in victims.items():
            if v.exited:
                v.reap()
                v.close()
            else:
                alive[pid] = v
        return alive

    def _finish(self) -> None:
        """All workers are gone: flush the tee pipes and remove the private directory."""
        for fd in list(self._sinks):
            if self._stopping:
                self._drain(fd, _Drain.FINAL)
            # otherwise a tee'd stream still open is held by a surviving descendant: it
            # keeps logging until its end of file
        for w in self._workers.values():
            w.handle.close()
        shutil.rmtree(self._private_dir, ignore_errors=True)


#: Worker pids of every ProcessWorkers of this process not yet reaped: their exits are
#: read by their group (several agents may share a process), never by an orphan sweep.
_WORKER_PIDS: set[int] = set()


def _excluded() -> set[int]:
    """Children of this process that are never orphans: workers and reaper sidecars."""
    return _WORKER_PIDS | ReaperSidecar.live_pids


def _reap_zombies(pids: list[int]) -> None:
    """Collect zombie orphans re-parented to the agent (each would stay a zombie)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


_NO_RESULT = "the worker wrote no result"


def _read_result(path: str) -> tuple[Any, str | None]:
    """(value, None) or (None, why) from a function worker's result file
    (:mod:`elastic.real._fn_runner`'s tagged JSON)."""
    try:
        size = os.stat(path).st_size
        if size > _fn_runner.MAX_RESULT_BYTES + 64:
            return None, f"result file is {size} bytes (limit {_fn_runner.MAX_RESULT_BYTES})"
        with open(path, "rb") as f:
            data = json.loads(f.read(), object_hook=_fn_runner.decode)
    except FileNotFoundError:
        return None, _NO_RESULT
    except (OSError, ValueError, RecursionError) as e:
        return None, f"unreadable result file: {e}"
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
    if not isinstance(data, dict):
        return None, "malformed result file"
    if "value" in data:
        return data["value"], None
    if "unserialisable" in data:
        return None, (
            f"a {data['unserialisable']} cannot be sent back as data; return JSON values "
            "(dict, list, str, int, float, bool, None), tuples, bytes, dataclasses or "
            "torch tensors from worker functions"
        )
    if "too_large" in data:
        return None, (
            f"the return value is {data['too_large']} bytes encoded, over the "
            f"{_fn_runner.MAX_RESULT_BYTES}-byte limit"
        )
    return None, "malformed result file"


def _record_result_error(error_file: str | None, problem: str) -> None:
    """Say in the worker's error file (when it wrote none) why its exit counts as failed,
    so the failure report shows the reason."""
    if not error_file or os.path.exists(error_file):
        return
    body = json.dumps({"message": f"ReturnValueError: {problem}", "timestamp": int(time.time())})
    with contextlib.suppress(OSError), open(error_file, "x", encoding="utf-8") as f:
        f.write(body)


class ProcessWorkers:
    """Starts groups of real worker processes on this node (see the module docstring).

    One instance per agent: it owns the agent's marker and its reaper sidecar.  Call
    :meth:`aclose` (or use ``async with``) when done; the sidecar then leaves quietly.
    """

    def __init__(
        self,
        logs_specs: LogsSpecs | None = None,
        *,
        role: str = "default",
        start_method: str = "spawn",
        log_line_prefix_template: str | None = None,
        console_out: IO[str] | IO[bytes] | None = None,
        console_err: IO[str] | IO[bytes] | None = None,
        subreaper: bool = True,
        reaper: bool | ReaperSidecar = True,
        kill_timeout: float = 10.0,
        cgroups: bool = True,
    ) -> None:
        """``reaper``: True to start a sidecar with the first group, False for none, or a
        sidecar already started (``elastic run`` starts one first thing) to send the
        marker to before the first worker is spawned; it is this object's from then on
        (:meth:`aclose` lets it go).  ``cgroups``: put the workers in a cgroup of the
        agent's where cgroup v2 allows (:mod:`elastic.real.cgroup`); False: never."""
        if start_method not in ("spawn", "fork"):
            raise ConfigError(
                "--start-method", f"{start_method!r} is not supported: use spawn or fork"
            )
        if not hasattr(os, "pidfd_open"):
            raise ElasticError("real workers need Linux ≥ 5.3 (pidfd_open) and Python ≥ 3.9")
        self._logs_specs = logs_specs
        self.role = role
        self.start_method: StartMethod = "fork" if start_method == "fork" else "spawn"
        self._template = log_line_prefix_template
        self._console_out = console_out
        self._console_err = console_err
        self._subreaper = subreaper
        self._kill_timeout = kill_timeout
        self.instance = uuid4_hex()
        self._reaper = reaper
        self._agent_marker: proctree.Marker | None = None
        self._sidecar: ReaperSidecar | None = None
        self._became_subreaper = False
        self._orphans_since: int | None = None
        self._cgroups = cgroups
        #: the agent's cgroup (elastic.real.cgroup), made at the first start; None
        #: before, or where cgroup v2 is unavailable
        self.cgroup: AgentCgroup | None = None
        self._groups: list[ProcessGroup] = []  # started and not yet cleanly stopped
        #: set by the agent for ``--preload`` (:mod:`elastic.real.zygote`)
        self.zygote: Zygote | None = None

    @property
    def logs_specs(self) -> LogsSpecs:
        if self._logs_specs is None:
            self._logs_specs = DefaultLogsSpecs()
        return self._logs_specs

    @property
    def agent_marker(self) -> proctree.Marker | None:
        """What every process this agent started carries (None before the first start)."""
        return self._agent_marker

    def _markers(self, dest: LogsDest) -> tuple[proctree.Marker, dict[str, str]]:
        """The group's marker and the variables to add to its workers' env for it.

        The agent's marker is chosen at the first start and kept: its run directory (the
        parent of the logs' attempt directory, unique per agent: ``mkdtemp``) when the
        logs have one, else the fallback variables.  See :mod:`elastic.real.proctree`.
        """
        attempt = dest.attempt_dir
        if self._agent_marker is None:
            self._agent_marker = (
                proctree.Marker(proctree.AGENT_MARKER, self.instance)
                if attempt is None
                else proctree.Marker(
                    proctree.ERROR_FILE, os.path.join(os.path.dirname(attempt), ""), prefix=True
                )
            )
        agent = self._agent_marker
        if not agent.prefix:
            group_id = uuid4_hex()
            env = {proctree.AGENT_MARKER: self.instance, proctree.GROUP_MARKER: group_id}
            return proctree.Marker(proctree.GROUP_MARKER, group_id), env
        if attempt is None or not attempt.startswith(agent.value):
            raise ElasticError(
                f"the logs put this group's attempt directory ({attempt}) outside the "
                f"agent's run directory {agent.value}"
            )
        return proctree.Marker(proctree.ERROR_FILE, os.path.join(attempt, ""), prefix=True), {}

    def _kill_orphans(self) -> None:
        """SIGKILL, best effort, every process of this agent's tree still alive."""
        if self.cgroup is not None:
            self.cgroup.kill_now()
        if self._agent_marker is None:
            return
        try:
            found = proctree.tree_handles(
                (),
                self._agent_marker,
                exclude=_excluded(),
                orphans_since=self._orphans_since,
            )
        except OSError as e:  # out of fds, say: the sidecar's sweep remains
            logger.error("cannot scan for this agent's processes: %s", e)
            return
        for h in found.values():
            h.send(signal.SIGKILL)
            h.close()

    @property
    def reaper_pid(self) -> int | None:
        return self._sidecar.pid if self._sidecar is not None else None

    async def __aenter__(self) -> ProcessWorkers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, sweep: bool = False) -> None:
        """Let the sidecar go (after the agent stopped its groups) and reap it.

        With ``sweep`` (the agent is failing), or when a group's stop did not finish
        cleanly, the sidecar kills every marked process before it leaves, and the
        agent SIGKILLs its own orphans (those no marker finds): a failing agent leaves
        nothing behind either.
        """
        sweep = sweep or any(not g.stopped_cleanly() for g in self._groups)
        self._groups.clear()
        if sweep:
            self._kill_orphans()
        if self.cgroup is not None:
            # before the sidecar is let go: it would remove the cgroup if we died here
            cgroup, self.cgroup = self.cgroup, None
            await cgroup.close(self._kill_timeout)
        sidecar = self._sidecar
        if sidecar is None or sidecar.pid is None:
            return
        sidecar.request_exit(sweep)
        # wait for its exit on the loop (other coroutines may share it), then let the
        # sidecar's own close() reap it — SIGKILL first if it is still there
        try:
            fd = os.pidfd_open(sidecar.pid)
        except OSError:
            fd = -1  # reaped already
        if fd >= 0:
            loop = asyncio.get_running_loop()
            gone: asyncio.Future[None] = loop.create_future()

            def _gone() -> None:
                if not gone.done():
                    gone.set_result(None)

            loop.add_reader(fd, _gone)
            try:
                await asyncio.wait_for(gone, _SIDECAR_GRACE)
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(fd)
                os.close(fd)
        sidecar.close(timeout=0.0)

    async def start(self, launches: Sequence[WorkerLaunch]) -> ProcessGroup:
        """Start one worker per launch (local ranks must be 0..n-1); return the group.

        Raises :class:`ConfigError` for an entrypoint that cannot be started (missing
        executable, a function spawn cannot find by name, arguments that are not JSON).
        If a later worker fails to start, those already started are killed first.
        """
        loop = asyncio.get_running_loop()
        ranks = sorted(la.local_rank for la in launches)
        if ranks != list(range(len(launches))):
            raise ValueError(f"local ranks must be 0..{len(launches) - 1}, got {ranks}")
        by_rank = {la.local_rank: la for la in launches}
        if self._subreaper and not self._became_subreaper:
            self._became_subreaper = proctree.become_subreaper()
            if self._became_subreaper:
                # a tick early: /proc counts start times in whole ticks, rounded down
                self._orphans_since = proctree.start_ticks() - 1
        if self._cgroups is True:
            self._cgroups = False  # tried once: the fallback's debug line is logged once
            self.cgroup = _agent_cgroup()

        # the logs specs read run id and attempt from the env; they may only add
        # TORCHELASTIC_ERROR_FILE to what the worker gets
        reify_envs = {r: dict(la.env) for r, la in by_rank.items()}
        for r, la in by_rank.items():
            reify_envs[r].setdefault("TORCHELASTIC_RESTART_COUNT", str(la.attempt))
        dest = self.logs_specs.reify(reify_envs)

        marker, marker_env = self._markers(dest)
        if isinstance(self._reaper, ReaperSidecar) and self._sidecar is None:
            # a sidecar started before us learns the marker before anything carries it
            assert self._agent_marker is not None  # chosen by _markers above
            self._sidecar = self._reaper
            self._sidecar.start()  # idempotent: normally it is up already
            self._sidecar.set_marker(self._agent_marker.argv())
            if self.cgroup is not None:
                self._sidecar.set_cgroup(self.cgroup.path)
        self._groups = [g for g in self._groups if not g.stopped_cleanly()]
        private_dir = tempfile.mkdtemp(prefix=PRIVATE_DIR_PREFIX)
        if self._sidecar is not None:
            self._sidecar.add_dir(private_dir)  # removed by the sidecar if the agent dies
        group = ProcessGroup(
            loop,
            marker,
            dest,
            private_dir,
            read_oom_counters(),
            self._kill_timeout,
            self._orphans_since,
            self.cgroup.group() if self.cgroup is not None else None,
        )
        self._groups.append(group)
        try:
            for r in range(len(launches)):
                la = by_rank[r]
                env = {**os.environ, **la.env, **marker_env}
                env[proctree.ERROR_FILE] = reify_envs[r].get(proctree.ERROR_FILE, "")
                w = self._start_one(loop, group, la, env, dest, private_dir)
                group._workers[r] = w
                group._watch(w)
        except BaseException:
            await group.stop(0.0, signal.SIGKILL)
            raise
        # after the workers (its interpreter start must not delay theirs) and before any
        # await, so before any worker could have started a descendant; see the module
        # docstring
        if self._reaper is True and self._sidecar is None:
            assert self._agent_marker is not None  # chosen by _markers above
            self._sidecar = ReaperSidecar(self._agent_marker.argv())
            self._sidecar.start()
            if self.cgroup is not None:
                self._sidecar.set_cgroup(self.cgroup.path)
            self._sidecar.add_dir(private_dir)
        return group

    # -- one worker ----------------------------------------------------------------------

    def _header(self, la: WorkerLaunch) -> str:
        if self._template:
            return Template(self._template).safe_substitute(
                role_name=self.role, rank=la.global_rank, local_rank=la.local_rank
            )
        return default_header(self.role, la.local_rank)

    def _console(self, which: int) -> _Console:
        if which == 1:
            stream = self._console_out if self._console_out is not None else sys.stdout
        else:
            stream = self._console_err if self._console_err is not None else sys.stderr
        return _Console(stream)

    def _streams(
        self, group: ProcessGroup, la: WorkerLaunch, dest: LogsDest
    ) -> tuple[list[tuple[int, int]], list[int], list[int]]:
        """(child fd → agent fd to dup2, fds to close after the spawn, tee read fds)."""
        r = la.local_rank
        dups: list[tuple[int, int]] = []
        to_close: list[int] = []
        tee_fds: list[int] = []
        for target, files, tees in (
            (1, dest.stdouts, dest.tee_stdouts),
            (2, dest.stderrs, dest.tee_stderrs),
        ):
            path = files.get(r, "")
            tee_path = tees.get(r)
            if tee_path is not None and tee_path != os.devnull:
                read_fd, write_fd = os.pipe()
                file = open(tee_path, "wb")  # noqa: SIM115  # owned by the TeeSink
                group._tee(read_fd, TeeSink(file, self._console(target), self._header(la)))
                dups.append((write_fd, target))
                to_close.append(write_fd)
                tee_fds.append(read_fd)
            elif path:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                dups.append((fd, target))
                to_close.append(fd)
        return dups, to_close, tee_fds

    def _start_one(
        self,
        loop: asyncio.AbstractEventLoop,
        group: ProcessGroup,
        la: WorkerLaunch,
        env: dict[str, str],
        dest: LogsDest,
        private_dir: str,
    ) -> _Worker:
        r = la.local_rank
        args = substitute_local_rank(la.args, r)
        result_path: str | None = None
        fork_fn: Callable[..., Any] | None = None
        if isinstance(la.entrypoint, str):
            argv = [_resolve_executable(la.entrypoint, env), la.entrypoint, *map(str, args)]
        else:
            result_path = os.path.join(private_dir, f"result_{r}.json")
            if self.start_method == "fork":
                # the child inherits the arguments as they are (torch's fork does the
                # same): nothing is written down or read back, so any object will do
                fork_fn = la.entrypoint
                argv = []
            else:
                data_args = _check_json_args(args)
                spec = _function_spec(la.entrypoint)
                spec.update(args=data_args, result_path=result_path, sys_path=list(sys.path))
                spec_path = os.path.join(private_dir, f"spec_{r}.json")
                with open(spec_path, "w", encoding="utf-8") as f:
                    json.dump(spec, f)
                argv = [sys.executable, sys.executable, _RUNNER, spec_path]
        dups, to_close, tee_fds = self._streams(group, la, dest)
        cgroup = group.cgroup.path if group.cgroup is not None else None
        try:
            if fork_fn is not None:
                assert result_path is not None
                pid = self._fork(fork_fn, args, env, dups, result_path, cgroup)
            else:
                # --preload: forked from the zygote when it can (None: start cold)
                # an exec'd worker gets the exit hook from PYTHONPATH (its sitecustomize
                # takes it out again); a zygote's fork does not (the zygote's interpreter
                # starts with the workers' environment, which must match theirs)
                zygote_pid = self.zygote.spawn(argv, env, dups, cgroup) if self.zygote else None
                if zygote_pid is None:
                    pid = _spawn(argv, with_exit_hook(dict(env)), dups, cgroup)
                else:
                    pid = zygote_pid
        finally:
            for fd in to_close:
                os.close(fd)
        _WORKER_PIDS.add(pid)
        handle = proctree.ProcHandle.open(pid)
        if handle is None:  # cannot happen for an unreaped child; keep mypy and us honest
            raise ElasticError(f"worker pid {pid} vanished before it could be watched")
        return _Worker(
            launch=la,
            pid=pid,
            handle=handle,
            result_path=result_path,
            error_file=env.get("TORCHELASTIC_ERROR_FILE") or None,
            done=loop.create_future(),
            tee_fds=tee_fds,
            signals_sent=set(),
        )

    def _fork(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        env: dict[str, str],
        dups: list[tuple[int, int]],
        result_path: str,
        cgroup: str | None = None,
    ) -> int:
        agent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            with contextlib.suppress(OSError):  # the child may have done it already
                os.setpgid(pid, pid)
            return pid
        code = 1
        try:  # the child: never return into the agent's event loop
            if cgroup is not None:
                join_cgroup(cgroup)  # before it can fork (see elastic.real.cgroup)
            os.setpgid(0, 0)
            import ctypes  # here: ~2 ms of the agent's start-up otherwise

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != agent:
                os.kill(os.getpid(), signal.SIGKILL)
            signal.set_wakeup_fd(-1)
            for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
                signal.signal(s, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if self._sidecar is not None and self._sidecar.pipe_fd is not None:
                os.close(self._sidecar.pipe_fd)  # the sidecar must see the agent's pipe close
            for fd, target in dups:
                os.dup2(fd, target)
            os.environ.clear()
            os.environ.update(env)
            code = _fn_runner.run_function(fn, args, result_path)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
        finally:
            os._exit(code)


def _spawn(
    argv: list[str],
    env: Mapping[str, str],
    dups: list[tuple[int, int]],
    cgroup: str | None = None,
) -> int:
    """Start ``argv[0]`` (a path) as ``argv[1:]``, tied to the agent; return its pid.

    In its own session (so its own process group, whose id is its pid), as torch starts
    its workers (``start_new_session=True``), with ``dups`` (agent fd, child fd) applied
    and ``PR_SET_PDEATHSIG=SIGKILL`` set before it runs.  A session of its own also gives
    it its own scheduling autogroup, as torch's workers have, where the kernel groups by
    session.  ``argv`` is the executable
    followed by the worker's ``argv`` (``argv[1]`` is its ``argv[0]``).  ``cgroup``: a
    cgroup v2 directory it joins before its program runs (:mod:`elastic.real.cgroup`).
    """
    agent = os.getpid()
    if _cspawn is None:
        shim = [_SHIM, "--cgroup", cgroup] if cgroup is not None else [_SHIM]
        return os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-S", *shim, str(agent), *argv],
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in dups],
            setsid=True,
        )
    path = argv[0]
    try:
        cgroup_fd = -1 if cgroup is None else GroupCgroup(cgroup).open_procs()
    except OSError as e:
        raise ElasticError(f"cannot start worker {path!r} in the cgroup {cgroup}: {e}") from None
    # an extension built before cgroup support has no cgroup_fd argument: workers then
    # start without a cgroup (_agent_cgroup said so), not with a TypeError
    extra = {"cgroup_fd": cgroup_fd} if cgroup_fd >= 0 else {}
    try:
        return _cspawn.spawn(
            os.fsencode(path),
            [os.fsencode(a) for a in argv[1:]],
            [os.fsencode(f"{k}={v}") for k, v in env.items()],
            dups,
            pdeathsig=signal.SIGKILL,
            parent_pid=agent,
            setsid=True,
            **extra,
        )
    except OSError as e:
        # only execve's failure names the file; a step before it (joining the cgroup, say)
        # is the launcher's failure, not the entrypoint's, whatever its errno
        if isinstance(e, (FileNotFoundError, PermissionError)) and e.filename is not None:
            raise ConfigError("entrypoint", f"cannot execute {path!r}: {e.strerror}") from None
        if e.errno == errno.ENOEXEC:
            raise ConfigError(
                "entrypoint", f"cannot execute {path!r}: not a program or script ({e.strerror})"
            ) from None
        raise ElasticError(f"cannot start worker {path!r}: {e}") from None
    finally:
        if cgroup_fd >= 0:
            os.close(cgroup_fd)


def _agent_cgroup() -> AgentCgroup | None:
    """The agent's cgroup, or None (one debug line: see elastic.real.cgroup)."""
    if _cspawn is not None and not hasattr(_cspawn, "CGROUP_FD"):
        logger.debug(
            "the spawn extension predates cgroup support (reinstall: pip install -e .): "
            "workers are tracked without a cgroup"
        )
        return None
    return AgentCgroup.create()


def _resolve_executable(entrypoint: str, env: Mapping[str, str]) -> str:
    if os.sep in entrypoint:
        if os.path.isfile(entrypoint) and os.access(entrypoint, os.X_OK):
            return os.path.abspath(entrypoint)
        missing = not os.path.exists(entrypoint)
        error = EntrypointNotFoundError if missing else EntrypointNotExecutableError
        raise error("entrypoint", f"{entrypoint!r} is not an executable file; give a program path")
    found = shutil.which(entrypoint, path=env.get("PATH", os.defpath))
    if found is None:
        raise EntrypointNotFoundError(
            "entrypoint",
            f"{entrypoint!r} was not found on the workers' PATH; give a program path or install it",
        )
    return found


def _check_json_args(args: Sequence[Any]) -> list[Any]:
    """``args`` as data for the spawn spec (:func:`_fn_runner.to_data`); ConfigError if
    an argument is not data."""
    try:
        data = _fn_runner.to_data(list(args), "args")
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            "args",
            f"function worker arguments must be JSON values (str, int, float, bool, None, "
            f"list, dict), tuples, bytes, dataclasses or torch tensors, not pickled objects: {e}",
        ) from None
    assert isinstance(data, list)
    return data


def _function_spec(fn: Callable[..., Any]) -> dict[str, Any]:
    """How a spawned child finds ``fn`` again by name; ConfigError if it cannot."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    where = "entrypoint"
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ConfigError(
            where,
            f"{fn!r} has no module-level name; with start method 'spawn' the entrypoint "
            "must be a function defined at the top level of a module",
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise ConfigError(
            where,
            f"{module}.{qualname} is a lambda or a local function, which a spawned worker "
            "cannot import; define it at the top level of a module (or use start method "
            "'fork')",
        )
    spec: dict[str, Any] = {"module": module, "qualname": qualname}
    owner: Any = sys.modules.get(module)
    if module == "__main__":
        main_path = getattr(owner, "__file__", None)
        if not main_path:
            raise ConfigError(
                where,
                f"__main__.{qualname} lives in an interactive session, which a spawned "
                "worker cannot import; put it in a module (or use start method 'fork')",
            )
        spec["main_path"] = os.path.abspath(main_path)
    obj = owner
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn:
        raise ConfigError(
            where,
            f"{module}.{qualname} does not name this function (was it rebound or "
            "decorated without functools.wraps?); a spawned worker finds it by name",
        )
    return spec
