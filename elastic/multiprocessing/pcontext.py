"""torch's process contexts: ``start_processes``, ``PContext``, ``RunProcsResult``.

A :class:`PContext` starts one process per local rank — a function (by its importable
name) or a binary — and is waited on and closed from ordinary blocking code, as torch's.
Underneath it is the real workers port (:class:`elastic.real.workers.ProcessWorkers`):
the same launcher, log layout (``logs_specs``), error files and process-tree cleanup the
agent uses, driven on a private event loop thread.

As torch's:

* :meth:`PContext.start` (from the main thread) installs a handler for SIGTERM, SIGINT,
  SIGHUP and SIGQUIT (or the names in ``TORCHELASTIC_SIGNALS_TO_HANDLE``) that raises
  :class:`~elastic.multiprocessing.api.SignalException`; from another thread it logs a
  warning and installs nothing (the processes still die with this one: each has the
  launcher's parent-death signal);
* :meth:`PContext.wait` closes the context once it has a result; when a process fails
  the others are stopped, and a binary run (:class:`SubprocessContext`) also reports the
  peers stopped that way (exit code ``-15``, "Signal 15 (SIGTERM) received by PID …")
  while a function run (:class:`MultiprocessContext`) reports the failure it saw;
* ``duplicate_stdout_filters`` / ``duplicate_stderr_filters``: the lines of the tee'd
  streams (``logs_specs``'s ``tee``) that contain any of the strings are also written,
  with their rank's prefix, to ``filtered_stdout.log`` / ``filtered_stderr.log`` in the
  attempt's directory; ``filtered_stdout`` / ``filtered_stderr`` are those files (open
  text files, as torch 2.13's; None without filters).

Differences from torch, on purpose:

* a function entrypoint is started by name in a fresh interpreter and its ``args`` and
  return value travel as data (JSON with tags for tuples, bytes, non-str dict keys and
  tensors, see :mod:`elastic.real._fn_runner`), never pickled; a return value that
  cannot be sent back fails its rank.  ``start_method`` may be ``spawn`` or ``fork``
  (fork still runs the function in a fresh child), ``forkserver`` is spawn;
* :meth:`PContext.wait` is woken by the kernel when a process exits, it does not poll;
  the filtered files are written as the tee reads the pipes, not by polling threads
  (``_tail_logs`` is empty).  ``period`` keeps the meaning torch's polling gives it: a
  failure is acted on at the first multiple of ``period`` (counted from the start of
  the ``wait``) after it, as torch's next look would find it, so a peer that ends on
  its own before then is reported with its own exit, not as stopped; a run whose
  processes all succeed returns as soon as the last one exits;
* :meth:`PContext.close` holds the handled signals while it stops the processes and
  raises the first afterwards, and the last context to close puts back the handlers
  that were there before its start (torch leaves its handler installed);
* ``numa_options`` is accepted and ignored (a warning when given): elastic does not bind
  workers to NUMA nodes;
* the calling process is not made a child subreaper and no reaper sidecar is started
  (both are the agent's, not a library call's).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar, TextIO, TypeVar

from elastic.multiprocessing import api as _api
from elastic.multiprocessing.api import LogsDest, LogsSpecs, _signals_held, _validate_full_rank
from elastic.multiprocessing.errors import ProcessFailure
from elastic.multiprocessing.tail_log import TailLog
from elastic.real.loop_thread import LoopThread
from elastic.real.workers import ProcessGroup, ProcessWorkers, _Console
from elastic.workers import WorkerExit, WorkerLaunch

__all__ = [
    "MultiprocessContext",
    "PContext",
    "RunProcsResult",
    "SubprocessContext",
    "start_processes",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: torch's default for ``TORCHELASTIC_SIGNALS_TO_HANDLE``
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


@dataclass
class RunProcsResult:
    """Results of a completed run of processes started with ``start_processes()``.

    ``return_values`` and ``failures`` are mutually exclusive: the first is filled only
    when every process succeeded; ``stdouts``/``stderrs`` are the log files (``""``
    when a stream went to the console).
    """

    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)
    stdouts: dict[int, str] = field(default_factory=dict)
    stderrs: dict[int, str] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return len(self.failures) > 0


class _Handlers:
    """The signal handlers the open contexts installed, and those they replaced.

    Process-wide (signal handlers are): the first context to start saves what it
    replaces, the last to close puts it back — unless someone replaced ours meanwhile.
    """

    saved: ClassVar[dict[signal.Signals, Any]] = {}
    holders: ClassVar[int] = 0

    @classmethod
    def install(cls) -> bool:
        """Install the handler for the configured signals; False when not possible here.

        As torch's ``PContext.start``: through :mod:`elastic.multiprocessing.api`'s
        ``threading``, ``signal``, ``logger`` and ``IS_WINDOWS``; a name that is not a
        signal is a warning, a signal the platform cannot handle an info line on Windows.
        """
        threading_, signal_, log = _api.threading, _api.signal, _api.logger
        if threading_.current_thread() is not threading_.main_thread():
            log.warning(
                "Failed to register signal handlers since torchelastic is running on a child "
                "thread. This could lead to orphaned worker processes if the torchrun is "
                "terminated."
            )
            return False
        names = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", DEFAULT_SIGNALS)
        # the process's handlers are saved and put back only when the signal module
        # really installed ours (not a stand-in)
        real = signal_ is signal
        for name in names.split(","):
            name = name.strip()
            if not name:
                continue
            try:
                if not name.startswith("SIG") or name.startswith("SIG_"):
                    raise AttributeError(f"{name!r} is not the name of a signal")
                sig = getattr(signal_, name)
                previous = signal_.getsignal(sig)
                signal_.signal(sig, _api._terminate_process_handler)
            except RuntimeError as e:
                if _api.IS_WINDOWS and name in ("SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
                    log.info("Signal %s is not supported on Windows, skipping", name)
                else:
                    log.warning("Failed to register signal handler for %s: %s", name, e)
                continue
            except (AttributeError, ValueError, OSError, TypeError) as e:
                log.warning("Failed to register signal handler for %s: %s", name, e)
                continue
            if real and sig not in cls.saved and previous is not _api._terminate_process_handler:
                cls.saved[sig] = previous
            log.info("Registered signal handler for %s", name)
        if real:
            cls.holders += 1
        return real

    @classmethod
    def release(cls) -> None:
        cls.holders -= 1
        if cls.holders > 0 or threading.current_thread() is not threading.main_thread():
            return  # (another thread cannot set handlers: ours stay, as in torch)
        for sig, previous in cls.saved.items():
            if signal.getsignal(sig) is _api._terminate_process_handler:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        cls.saved.clear()


class PContext:
    """The base class that standardizes operations over a set of processes (torch's).

    torch's constructor order; ``start_method`` and ``numa_options`` are keywords here
    (torch's base class has neither; its subclasses do, see them).
    """

    def __init__(
        self,
        name: str,
        entrypoint: Callable[..., Any] | str,
        args: dict[int, tuple[Any, ...]],
        envs: dict[int, dict[str, str]],
        logs_specs: LogsSpecs,
        log_line_prefixes: dict[int, str] | None = None,
        duplicate_stdout_filters: list[str] | None = None,
        duplicate_stderr_filters: list[str] | None = None,
        *,
        start_method: str = "spawn",
        numa_options: Any = None,
    ) -> None:
        self.name = name
        nprocs = len(args)
        _validate_full_rank(args, nprocs, "args")
        _validate_full_rank(envs, nprocs, "envs")
        if start_method not in ("spawn", "fork", "forkserver"):
            raise ValueError(f"start_method {start_method!r} is not one of spawn, fork, forkserver")
        _api.warn_numa_ignored(numa_options, logger)
        self.entrypoint = entrypoint
        self.args = args
        self.envs = envs
        self.nprocs = nprocs
        self.logs_specs = logs_specs
        self.start_method = start_method
        #: the filtered copies of the tee'd streams (torch 2.13: open text files), set by
        #: :meth:`start` when filters were given; closed by :meth:`close`
        self.filtered_stdout: TextIO | None = None
        self.filtered_stderr: TextIO | None = None
        #: torch's log tailers; always empty here (the launcher tees without polling)
        self._tail_logs: list[TailLog] = []
        self._prefixes = log_line_prefixes
        self._filters = (
            tuple(duplicate_stdout_filters or ()),
            tuple(duplicate_stderr_filters or ()),
        )
        self._loop: LoopThread | None = None
        self._workers: FilteringWorkers | None = None
        self._group: ProcessGroup | None = None
        self._exits: dict[int, WorkerExit] = {}
        self._seen_failed: set[int] = set()
        self._result: RunProcsResult | None = None
        self._handlers_installed = False
        self._closed = False

    @property
    def stdouts(self) -> dict[int, str]:
        return dict(self._dest().stdouts)

    @property
    def stderrs(self) -> dict[int, str]:
        return dict(self._dest().stderrs)

    @property
    def error_files(self) -> dict[int, str]:
        return dict(self._dest().error_files)

    def _dest(self) -> LogsDest:
        if self._group is None:
            raise RuntimeError(f"{type(self).__name__}.start() has not been called")
        return self._group.logs

    def _reports_stopped_peers(self) -> bool:
        """torch's binaries report every non-zero exit after a stop; its functions, the
        failure that ended the run."""
        return isinstance(self.entrypoint, str)

    def start(self) -> None:
        """Install the signal handlers (see the module) and start the processes (once).

        torch's order: the handlers, then :meth:`_start`, then the log tailers."""
        self._check_startable()
        self._handlers_installed = _Handlers.install()
        self._start()
        for tail_log in self._tail_logs:
            tail_log.start()

    def _check_startable(self) -> None:
        if self._group is not None or self._closed:
            raise RuntimeError(f"{type(self).__name__}.start() may be called once")

    def _start(self) -> None:
        """Spawn the processes; on any error (a signal included) stop those started."""
        try:
            workers = FilteringWorkers(
                self.logs_specs,
                role=self.name,
                # every worker is a fresh interpreter (exec): forkserver's isolation is spawn's
                start_method="spawn" if self.start_method == "forkserver" else self.start_method,
                subreaper=False,
                reaper=False,
                prefixes=self._prefixes,
                filters=self._filters,
            )
            self._workers = workers
            self._loop = LoopThread(name=f"pcontext-{self.name}")
            launches = [
                WorkerLaunch(
                    local_rank=r,
                    global_rank=r,
                    env=dict(self.envs[r]),
                    entrypoint=self.entrypoint,
                    args=tuple(self.args[r]),
                )
                for r in range(self.nprocs)
            ]
            # a signal during the spawn is raised once the group exists, so that close()
            # can stop every process started
            with _signals_held():
                try:
                    self._group = self._run(workers.start(launches))
                finally:
                    self.filtered_stdout, self.filtered_stderr = workers.filtered
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop and wait; if this thread is interrupted (a
        SignalException, KeyboardInterrupt) the coroutine is cancelled, not left running."""
        assert self._loop is not None
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def pids(self) -> dict[int, int]:
        """local rank → pid of each process."""
        if self._group is None:
            return {}
        return self._group.pids()

    def wait(self, timeout: float = -1, period: float = 1) -> RunProcsResult | None:
        """Wait for the processes: a result once all succeeded or one failed, else ``None``.

        ``timeout < 0`` waits for as long as it takes; ``timeout == 0`` looks once.
        When a process fails, the others are stopped (SIGTERM, then SIGKILL after 30 s)
        and the result carries the failures (see the module for which).  With a result
        the context is closed, as torch's.  A failure is acted on at the next multiple of
        ``period`` after it, where torch's polling would see it (see the module); if the
        timeout ends first, ``None``, and the next ``wait`` acts on it at once.
        A handled signal raises :class:`~elastic.multiprocessing.api.SignalException`
        here; the processes are then still running until :meth:`close`.
        """
        if self._result is not None:
            return self._result
        if self._group is None or self._loop is None:
            raise RuntimeError(f"{type(self).__name__}.start() has not been called")
        start = time.monotonic()
        deadline = None if timeout < 0 else start + timeout
        if not self._run(self._collect(deadline, start, period if timeout != 0 else 0.0)):
            return None
        with _signals_held():
            self._seen_failed = {r for r, ex in self._exits.items() if ex.failed}
            if self._seen_failed:
                self._run(self._stop_and_drain(self._group))
            self._result = self._make_result()
            self.close()
        return self._result

    async def _collect(self, deadline: float | None, start: float, period: float) -> bool:
        """Record exits until every process exited or, after a failure, until the next
        look of torch's polling (``start`` + k x ``period``); False if ``deadline``
        comes first (the exits seen stay recorded for the next call)."""
        group = self._group
        assert group is not None
        # when this wait acts on a failure: at once for one seen before it (torch's
        # first look finds it), else at the look after it
        failed = any(e.failed for e in self._exits.values())
        look: float | None = start if failed else None
        while len(self._exits) < self.nprocs:
            if look is None:
                end, acts = deadline, False
            elif deadline is not None and deadline < look:
                end, acts = deadline, False  # torch's loop ends before its next look
            else:
                end, acts = look, True
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                if look is not None:
                    return acts
                # wait(0), torch's one look (its agent's _monitor_workers): the loop runs
                # only inside wait(), so it gets to look at the pidfds once first
                ex = await _exit_now(group)
                if ex is None:
                    return False
                self._exits[ex.local_rank] = ex
                if ex.failed:
                    return True  # found by this look
                continue
            try:
                ex = await asyncio.wait_for(group.next_exit(), left)
            except TimeoutError:
                return acts
            self._exits[ex.local_rank] = ex
            if ex.failed and look is None:
                look = _next_look(start, period, ex.time)
        return True

    async def _stop_and_drain(self, group: ProcessGroup) -> None:
        """Stop the group; record every exit not yet seen (the peers it stopped)."""
        await group.stop(30.0, signal.SIGTERM)
        while len(self._exits) < self.nprocs:
            try:
                # after the stop each exit is queued already; the timeout only matters
                # for a process the stop gave up on (stuck in the kernel)
                ex = await asyncio.wait_for(group.next_exit(), 1.0)
            except (RuntimeError, TimeoutError):
                break
            self._exits.setdefault(ex.local_rank, ex)

    def _make_result(self) -> RunProcsResult:
        from elastic.multiprocessing.errors.report import failure_from_exit

        dest = self._dest()
        result = RunProcsResult(stdouts=dict(dest.stdouts), stderrs=dict(dest.stderrs))
        if not self._seen_failed:
            result.return_values = {r: ex.return_value for r, ex in sorted(self._exits.items())}
            return result
        reported = (
            {r for r, ex in self._exits.items() if ex.failed}
            if self._reports_stopped_peers()
            else self._seen_failed
        )
        for r in sorted(reported):
            ex = self._exits[r]
            when = time.time() - (time.monotonic() - ex.time)
            result.failures[r] = failure_from_exit(ex, fallback_timestamp=when)
        return result

    def close(self, death_sig: signal.Signals | None = None, timeout: int = 30) -> None:
        """Stop every process still running (``death_sig``, default SIGTERM, then SIGKILL
        ``timeout`` seconds later) and release the context (idempotent).

        Signals handled by the context are held until the processes are gone, then the
        first is raised as :class:`~elastic.multiprocessing.api.SignalException`.
        """
        if self._closed:
            return
        self._closed = True
        loop, group, workers = self._loop, self._group, self._workers
        with _signals_held():
            try:
                if loop is not None:
                    try:
                        if group is not None:
                            loop.run(group.stop(float(timeout), int(death_sig or signal.SIGTERM)))
                        if workers is not None:
                            loop.run(workers.aclose())
                    finally:
                        loop.close()
            finally:
                for f in (self.filtered_stdout, self.filtered_stderr):
                    if f is not None:
                        f.close()
                if self._handlers_installed:
                    self._handlers_installed = False
                    _Handlers.release()


class MultiprocessContext(PContext):
    """A :class:`PContext` whose entrypoint is a function (started by its name).

    torch's constructor: ``start_method`` comes before ``logs_specs``.
    """

    def __init__(
        self,
        name: str,
        entrypoint: Callable[..., Any],
        args: dict[int, tuple[Any, ...]],
        envs: dict[int, dict[str, str]],
        start_method: str,
        logs_specs: LogsSpecs,
        log_line_prefixes: dict[int, str] | None = None,
        numa_options: Any = None,
        duplicate_stdout_filters: list[str] | None = None,
        duplicate_stderr_filters: list[str] | None = None,
    ) -> None:
        super().__init__(
            name,
            entrypoint,
            args,
            envs,
            logs_specs,
            log_line_prefixes,
            duplicate_stdout_filters,
            duplicate_stderr_filters,
            start_method=start_method,
            numa_options=numa_options,
        )


class SubprocessContext(PContext):
    """A :class:`PContext` whose entrypoint is a binary (torch's constructor)."""

    def __init__(
        self,
        name: str,
        entrypoint: str,
        args: dict[int, tuple[Any, ...]],
        envs: dict[int, dict[str, str]],
        logs_specs: LogsSpecs,
        log_line_prefixes: dict[int, str] | None = None,
        numa_options: Any = None,
        duplicate_stdout_filters: list[str] | None = None,
        duplicate_stderr_filters: list[str] | None = None,
    ) -> None:
        super().__init__(
            name,
            entrypoint,
            args,
            envs,
            logs_specs,
            log_line_prefixes,
            duplicate_stdout_filters,
            duplicate_stderr_filters,
            numa_options=numa_options,
        )

    def _reports_stopped_peers(self) -> bool:
        return True


class FilteringWorkers(ProcessWorkers):
    """The workers port with torch's per-rank ``log_line_prefixes`` and filtered copies.

    The filtered copies ride on the console tee: :meth:`_streams` notes which launch it
    sets up so that :meth:`_console` (which it calls) can wrap that rank's console.
    """

    def __init__(
        self,
        *a: Any,
        prefixes: dict[int, str] | None,
        filters: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
        **k: Any,
    ) -> None:
        super().__init__(*a, **k)
        self._prefixes = prefixes
        self._filters = filters
        self._files: list[TextIO | None] = [None, None]
        self._paths: list[str | None] = [None, None]
        self._launch: WorkerLaunch | None = None

    @property
    def filtered(self) -> tuple[TextIO | None, TextIO | None]:
        """The open filtered stdout and stderr files (None: no filters for that stream)."""
        return self._files[0], self._files[1]

    def _header(self, la: WorkerLaunch) -> str:
        if self._prefixes is not None and la.local_rank in self._prefixes:
            return self._prefixes[la.local_rank]
        return super()._header(la)

    def _streams(
        self, group: ProcessGroup, la: WorkerLaunch, dest: LogsDest
    ) -> tuple[list[tuple[int, int]], list[int], list[int]]:
        for i, path in enumerate((dest.filtered_stdout, dest.filtered_stderr)):
            if not self._filters[i]:
                continue
            if not path or os.path.dirname(path) == os.devnull:
                path = os.devnull  # no log directory: nothing to keep
            if self._paths[i] != path:
                # a new attempt's directory (an agent's restart): a new file, as torch's
                # new process context per attempt opens one
                old = self._files[i]
                if old is not None:
                    old.close()
                self._files[i] = open(path, "w", errors="replace", buffering=1)  # noqa: SIM115
                self._paths[i] = path
        self._launch = la
        try:
            return super()._streams(group, la, dest)
        finally:
            self._launch = None

    async def aclose(self, sweep: bool = False) -> None:
        try:
            await super().aclose(sweep=sweep)
        finally:
            for f in self._files:
                if f is not None:
                    f.close()

    def _console(self, which: int) -> _Console:
        console = super()._console(which)
        la, needles, out = self._launch, self._filters[which - 1], self._files[which - 1]
        if la is None or not needles or out is None:
            return console
        return _FilteringConsole(console, self._header(la), needles, out)


class _FilteringConsole(_Console):
    """The console tee of one rank's stream that also copies matching lines to ``out``.

    The tee writes whole lines, each with the rank's header; a line goes to ``out``
    (header and all) when its text after the header contains one of ``needles``.
    """

    def __init__(self, console: _Console, header: str, needles: tuple[str, ...], out: TextIO):
        super().__init__(console._stream)
        self._header = header
        self._raw_header = header.encode()
        self._needles = needles
        self._out = out

    def write(self, data: bytes, /) -> int:
        n = super().write(data)
        for line in data.split(b"\n"):
            if not line:
                continue
            text = line.removeprefix(self._raw_header).decode(errors="replace")
            if any(needle in text for needle in self._needles):
                self._out.write(f"{self._header}{text}\n")
        return n


def _next_look(start: float, period: float, seen: float) -> float:
    """The first of torch's looks (``start``, then every ``period``) at or after ``seen``."""
    if period <= 0 or seen <= start:
        return seen
    return start + math.ceil((seen - start) / period) * period


async def _exit_now(group: ProcessGroup) -> WorkerExit | None:
    """The group's next exit if the kernel has reported one, else ``None``, without
    waiting: three turns of the loop are its pidfds' select, the exit callback and the
    queue's wake-up.  A cancelled look loses no exit (``asyncio.Queue.get`` keeps it)."""
    task = asyncio.ensure_future(group.next_exit())
    for _ in range(3):
        await asyncio.sleep(0)
        if task.done():
            return task.result()
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return None


def start_processes(
    name: str,
    entrypoint: Callable[..., Any] | str,
    args: dict[int, tuple[Any, ...]],
    envs: dict[int, dict[str, str]],
    logs_specs: LogsSpecs,
    log_line_prefixes: dict[int, str] | None = None,
    start_method: str = "spawn",
    numa_options: Any = None,
    duplicate_stdout_filters: list[str] | None = None,
    duplicate_stderr_filters: list[str] | None = None,
) -> PContext:
    """Start ``len(args)`` copies of ``entrypoint``; return the started :class:`PContext`.

    torch's signature.  A ``str`` entrypoint is a binary (``args`` are its arguments,
    a :class:`SubprocessContext`); a function is started by its importable name with
    data ``args`` (a :class:`MultiprocessContext`; see the module docstring).
    ``envs[r]`` is added to this process's environment for local rank ``r``;
    ``logs_specs`` decides where output and error files go; the filters copy matching
    lines of the tee'd streams to the filtered files.  ``numa_options`` is ignored (a
    warning when given).
    """
    nprocs = len(args)
    _validate_full_rank(args, nprocs, "args")
    _validate_full_rank(envs, nprocs, "envs")
    context: PContext
    if isinstance(entrypoint, str):
        context = SubprocessContext(
            name,
            entrypoint,
            args,
            envs,
            logs_specs,
            log_line_prefixes,
            numa_options,
            duplicate_stdout_filters,
            duplicate_stderr_filters,
        )
    else:
        context = MultiprocessContext(
            name,
            entrypoint,
            args,
            envs,
            start_method,
            logs_specs,
            log_line_prefixes,
            numa_options,
            duplicate_stdout_filters,
            duplicate_stderr_filters,
        )
    try:
        context.start()
    except BaseException:
        context.close()
        raise
    return context
