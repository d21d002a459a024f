"""torch's process contexts: ``start_processes``, ``PContext``, ``RunProcsResult``.

A :class:`PContext` starts one process per local rank — a function (by its importable
name) or a binary — and is waited on and closed from ordinary blocking code, as torch's.
Underneath it is the real workers port (:class:`elastic.real.workers.ProcessWorkers`):
the same launcher, log layout (``logs_specs``), error files and process-tree cleanup the
agent uses, driven on a private event loop thread.

Differences from torch, on purpose:

* a function entrypoint is started by name in a fresh interpreter and its ``args`` must
  be JSON values (str, int, float, bool, None, lists, dicts): nothing is pickled across
  the process boundary (torch pickles through ``multiprocessing``); its return value
  comes back as JSON too.  ``start_method`` may be ``spawn`` or ``fork`` (fork still
  execs a fresh interpreter), not ``forkserver``;
* :meth:`PContext.wait` is woken by the kernel when a process exits; ``period`` is
  accepted and unused (torch sleeps ``period`` between polls);
* the calling process is not made a child subreaper and no reaper sidecar is started
  (both are the agent's, not a library call's).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elastic.multiprocessing.api import LogsDest, LogsSpecs
from elastic.multiprocessing.errors import ProcessFailure
from elastic.real.loop_thread import LoopThread
from elastic.real.workers import ProcessGroup, ProcessWorkers
from elastic.workers import WorkerExit, WorkerLaunch

__all__ = [
    "MultiprocessContext",
    "PContext",
    "RunProcsResult",
    "SubprocessContext",
    "start_processes",
]


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


class PContext:
    """The base class that standardizes operations over a set of processes (torch's)."""

    def __init__(
        self,
        name: str,
        entrypoint: Callable[..., Any] | str,
        args: dict[int, tuple[Any, ...]],
        envs: dict[int, dict[str, str]],
        logs_specs: LogsSpecs,
        log_line_prefixes: dict[int, str] | None = None,
        start_method: str = "spawn",
    ) -> None:
        self.name = name
        nprocs = len(args)
        for what, d in (("args", args), ("envs", envs)):
            if set(d) != set(range(nprocs)):  # torch's _validate_full_rank
                raise RuntimeError(
                    f"{what}, local rank mapping mismatch, expected: {set(range(nprocs))}, "
                    f"actual: {set(d)}"
                )
        if start_method not in ("spawn", "fork", "forkserver"):
            raise ValueError(f"start_method {start_method!r} is not one of spawn, fork, forkserver")
        self.entrypoint = entrypoint
        self.args = args
        self.envs = envs
        self.nprocs = nprocs
        self.logs_specs = logs_specs
        self._prefixes = log_line_prefixes
        self._start_method = start_method
        self._loop: LoopThread | None = None
        self._workers: ProcessWorkers | None = None
        self._group: ProcessGroup | None = None
        self._exits: dict[int, WorkerExit] = {}
        self._result: RunProcsResult | None = None
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

    def start(self) -> None:
        """Start the processes (once)."""
        if self._group is not None or self._closed:
            raise RuntimeError(f"{type(self).__name__}.start() may be called once")
        prefixes = self._prefixes
        workers = _Workers(
            self.logs_specs,
            role=self.name,
            # every worker is a fresh interpreter (exec): forkserver's isolation is spawn's
            start_method="spawn" if self._start_method == "forkserver" else self._start_method,
            subreaper=False,
            reaper=False,
            prefixes=prefixes,
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
        try:
            self._group = self._loop.run(workers.start(launches))
        except BaseException:
            self.close()
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
        and the result carries the failures.  ``period`` is unused (see the module).
        """
        if self._result is not None:
            return self._result
        if self._group is None or self._loop is None:
            raise RuntimeError(f"{type(self).__name__}.start() has not been called")
        deadline = None if timeout < 0 else time.monotonic() + timeout
        done = self._loop.run(self._collect(deadline))
        if not done:
            return None
        failed = {r: ex for r, ex in self._exits.items() if ex.failed}
        if failed:
            self._loop.run(self._group.stop(30.0, signal.SIGTERM))
        self._result = self._make_result(failed)
        return self._result

    async def _collect(self, deadline: float | None) -> bool:
        group = self._group
        assert group is not None
        while len(self._exits) < self.nprocs and not any(e.failed for e in self._exits.values()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                ex = await asyncio.wait_for(group.next_exit(), left)
            except TimeoutError:
                return False
            self._exits[ex.local_rank] = ex
        return True

    def _make_result(self, failed: dict[int, WorkerExit]) -> RunProcsResult:
        from elastic.multiprocessing.errors.report import failure_from_exit

        dest = self._dest()
        result = RunProcsResult(stdouts=dict(dest.stdouts), stderrs=dict(dest.stderrs))
        if failed:
            for r, ex in failed.items():
                when = time.time() - (time.monotonic() - ex.time)
                result.failures[r] = failure_from_exit(ex, fallback_timestamp=when)
        else:
            result.return_values = {r: ex.return_value for r, ex in sorted(self._exits.items())}
        return result

    def close(self, death_sig: signal.Signals | None = None, timeout: int = 30) -> None:
        """Stop every process still running (``death_sig``, default SIGTERM, then SIGKILL
        ``timeout`` seconds later) and release the context (idempotent)."""
        if self._closed:
            return
        self._closed = True
        loop, group, workers = self._loop, self._group, self._workers
        if loop is None:
            return
        try:
            if group is not None:
                loop.run(group.stop(float(timeout), int(death_sig or signal.SIGTERM)))
            if workers is not None:
                loop.run(workers.aclose())
        finally:
            loop.close()


class MultiprocessContext(PContext):
    """A :class:`PContext` whose entrypoint is a function (started by its name)."""


class SubprocessContext(PContext):
    """A :class:`PContext` whose entrypoint is a binary."""


class _Workers(ProcessWorkers):
    """The workers port with torch's per-rank ``log_line_prefixes``."""

    def __init__(self, *a: Any, prefixes: dict[int, str] | None, **k: Any) -> None:
        super().__init__(*a, **k)
        self._prefixes = prefixes

    def _header(self, la: WorkerLaunch) -> str:
        if self._prefixes is not None and la.local_rank in self._prefixes:
            return self._prefixes[la.local_rank]
        return super()._header(la)


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

    torch's signature.  A ``str`` entrypoint is a binary (``args`` are its arguments);
    a function is started by its importable name with JSON ``args`` (see the module
    docstring).  ``envs[r]`` is added to this process's environment for local rank
    ``r``; ``logs_specs`` decides where output and error files go.  ``numa_options`` and
    the ``duplicate_*_filters`` are not supported here: given, they are refused with a
    ``ValueError`` rather than ignored.
    """
    for what, value in (
        ("numa_options", numa_options),
        ("duplicate_stdout_filters", duplicate_stdout_filters),
        ("duplicate_stderr_filters", duplicate_stderr_filters),
    ):
        if value:
            raise ValueError(f"start_processes: {what}={value!r} is not supported by elastic")
    cls: type[PContext] = SubprocessContext if isinstance(entrypoint, str) else MultiprocessContext
    context = cls(name, entrypoint, args, envs, logs_specs, log_line_prefixes, start_method)
    try:
        context.start()
    except BaseException:
        context.close()
        raise
    return context
