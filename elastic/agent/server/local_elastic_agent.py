"""torch's ``LocalElasticAgent``: the agent loop of :mod:`.api` on real processes.

Theory of operation
-------------------
:class:`LocalElasticAgent` is a :class:`~elastic.agent.server.api.SimpleElasticAgent`
whose ports are real: the clock is :class:`~elastic.real.clock.AsyncioClock`, the
workers are :class:`~elastic.real.workers.ProcessWorkers` (pidfd-watched processes,
torch's log layout, tree kill, a reaper sidecar).  What it adds around the loop, all
set up once per :meth:`run_async` and torn down in its ``finally``:

* **signals** — each signal named in ``TORCHELASTIC_SIGNALS_TO_HANDLE`` (torchrun's
  ``--signals-to-handle``; default ``SIGTERM,SIGINT,SIGHUP,SIGQUIT``; ``SIGCHLD`` is
  refused with a :class:`~elastic.errors.ConfigError`, unknown names skipped) cancels the run;
  the workers get the *same* signal, then SIGKILL after ``shutdown_timeout`` seconds,
  and :meth:`run_async` raises :class:`SignalException` — torchrun's semantics (the
  launcher exits 1).  Handlers go through the event loop (``add_signal_handler``), so
  the exception is raised at an ``await``, never inside a store call;
* **worker environment** — torch's table (``worker_env`` of the base class) plus
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (inherited or ``"1"``), ``CUDA_VISIBLE_DEVICES``
  (virtual local rank: the local rank's entry of the agent's list), the launcher's
  ``extra_env`` (``OMP_NUM_THREADS``, ``TORCHELASTIC_SIGNALS_TO_HANDLE``),
  ``TORCHELASTIC_TIMER_FILE`` and ``ELASTIC_PROGRESS_FILE`` when in use;
* **file timers** — ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` starts a
  :class:`~elastic.timer.FileTimerServer` on ``TORCHELASTIC_TIMER_FILE`` (generated if
  unset; an existing file that is not a stale timer pipe of this user, or a path where
  no pipe can be made, is refused in one line, exit 2, and never deleted).  It may
  signal only the pids of the running group (updated at every start).
  A reaped worker is an ordinary worker failure: the group restarts if restarts
  remain.  Unlike torch, the agent never kills itself;
* **hangs** — with ``hang_timeout``, each worker gets a progress pipe
  (:mod:`elastic.progress`); a rank that beat once and then stays silent for
  ``hang_timeout`` seconds makes the group UNHEALTHY (an ``agent.hang`` event names the
  stuck local and global ranks), which restarts it like a failure;
* **GPU health** — before every (re)start, :func:`elastic.gpu.check_node_health` when
  NVML is present and sees GPUs; an unhealthy GPU refuses the start.  While the group
  runs the same check is sampled every ``spec.monitor_interval`` seconds (torch's flag:
  the period of the checks that must be sampled, DESIGN §2): a GPU that turns unhealthy
  makes the group UNHEALTHY (an ``agent.gpu_check`` event says why).  Without NVML the CPU
  path runs, samples nothing, and says so once;
* **health endpoint** — ``TORCHELASTIC_HEALTH_CHECK_PORT`` (0..65535; a bad value or a
  port in use is one logged line and the job runs without it) serves ``/health`` and
  ``/metrics`` (:mod:`elastic.agent.server.health_check_server`, which bounds its
  connections and request time); ``/health`` is 503
  once the last progress (:meth:`LocalElasticAgent.get_last_progress_time`) is older
  than 60 s, or ``ELASTIC_HEALTH_CHECK_TIMEOUT`` seconds; where NVML sees GPUs its body
  carries the last GPU check's verdict (``"gpu": {"healthy": ..., "message": ...}``).

Failures are recorded as :class:`~elastic.multiprocessing.errors.ProcessFailure`
(with the error file the worker's ``@record`` wrote), keyed by global rank.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from elastic.agent.server.api import (
    DEFAULT_ROLE,
    RunResult,
    SimpleElasticAgent,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from elastic.errors import ConfigError
from elastic.events import EventSink, kinds
from elastic.ids import uuid4_str
from elastic.metrics.core import MetricHandler
from elastic.multiprocessing.api import LogsSpecs
from elastic.once import say_once
from elastic.utils.process_state import is_uninterruptible_state, read_proc_state
from elastic.workers import RunningGroup, WorkerExit

if TYPE_CHECKING:
    from elastic.real.reaper import ReaperSidecar

__all__ = [
    "DEFAULT_SIGNALS_TO_HANDLE",
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_HEALTH_CHECK_PORT",
    "TORCHELASTIC_TIMER_FILE",
    "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT",
    "LocalElasticAgent",
    "SignalException",
    "parse_signals",
]

logger = logging.getLogger(__name__)

TORCHELASTIC_ENABLE_FILE_TIMER = "TORCHELASTIC_ENABLE_FILE_TIMER"
TORCHELASTIC_TIMER_FILE = "TORCHELASTIC_TIMER_FILE"
TORCHELASTIC_HEALTH_CHECK_PORT = "TORCHELASTIC_HEALTH_CHECK_PORT"
#: seconds a worker may spend in uninterruptible sleep (D-state) before the group is
#: unhealthy and restarts are off (torch 2.13); unset or non-positive: no check
TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT = "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"
DEFAULT_SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
#: The NVIDIA driver's control device: without it NVML cannot start.
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"

# torch defines it in elastic.multiprocessing.api; the agent raises it
from elastic.multiprocessing.api import SignalException  # noqa: E402


def parse_signals(names: str) -> list[signal.Signals]:
    """``"SIGTERM,SIGINT"`` → signals; unknown names are logged and skipped (as torch).

    ``SIGCHLD`` is refused (:class:`ConfigError`): each worker exit sends it to the agent.
    """
    out: list[signal.Signals] = []
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        try:
            sig = signal.Signals[name]
        except KeyError:
            logger.warning("Signal %s is not supported on this platform; not handling it", name)
            continue
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            logger.warning("Signal %s cannot be handled; ignoring it", name)
            continue
        if sig == signal.SIGCHLD:
            # every worker exit raises it: the agent would stop itself at the first one
            raise ConfigError(
                "--signals-to-handle",
                "SIGCHLD cannot be a termination signal (every worker exit sends it); remove it",
            )
        out.append(sig)
    return out


class _HangWatch:
    """A :class:`~elastic.agent.server.api.HealthWatch` on the workers' progress beats."""

    def __init__(self, agent: LocalElasticAgent, hang_timeout: float) -> None:
        self._agent = agent
        self.hang_timeout = hang_timeout

    async def wait_unhealthy(self, group: WorkerGroup) -> str:
        monitor = self._agent._progress_monitor
        assert monitor is not None
        stuck = await monitor.wait_stalled()
        by_local = {w.local_rank: w for w in group.workers}
        ranks = [by_local[r].global_rank for r in stuck if r in by_local]
        self._agent._emit(
            kinds.AGENT_HANG, local_ranks=stuck, ranks=ranks, hang_timeout=self.hang_timeout
        )
        return (
            f"no progress for {self.hang_timeout:g}s from local rank(s) "
            f"{', '.join(map(str, stuck))} (global rank(s) {', '.join(map(str, ranks))})"
        )


class _GpuWatch:
    """A :class:`~elastic.agent.server.api.HealthWatch` sampling NVML health every
    ``monitor_interval`` seconds while the group runs (NVML has no event to await)."""

    def __init__(self, agent: LocalElasticAgent) -> None:
        self._agent = agent

    async def wait_unhealthy(self, group: WorkerGroup) -> str:
        agent = self._agent
        clock = agent.clock
        while not agent._nvml_absent:
            await clock.sleep(group.spec.monitor_interval)
            verdict = await agent._check_gpus(sampled=True)
            if verdict is not None:
                return verdict
        await clock.event().wait()  # no NVML on this host: never unhealthy by GPU
        raise AssertionError("unreachable")  # pragma: no cover


class _UninterruptibleWatch:
    """A :class:`~elastic.agent.server.api.HealthWatch` on workers stuck in Linux's
    uninterruptible sleep (D-state) for ``uninterruptible_state_timeout`` seconds, torch
    2.13's check: ``/proc`` has no event to await, so it samples every
    ``monitor_interval`` while the group runs (only when the timeout is set)."""

    def __init__(self, agent: LocalElasticAgent) -> None:
        self._agent = agent

    async def wait_unhealthy(self, group: WorkerGroup) -> str:
        agent = self._agent
        timeout = agent._uninterruptible_state_timeout
        agent._uninterruptible_state_first_seen.clear()
        while True:
            await agent.clock.sleep(group.spec.monitor_interval)
            if agent._check_uninterruptible_state_timeout(group, timeout) is not None:
                return (
                    f"a worker stayed in uninterruptible sleep (D-state) for {timeout:g}s "
                    "or more; restarts are disabled (a new worker would contend for what "
                    "it holds)"
                )


class LocalElasticAgent(SimpleElasticAgent):
    """The single-node agent on real processes (torch's constructor, plus keywords).

    Keywords beyond torch's: ``events`` (where agent events go), ``extra_env`` (added to
    every worker's environment), ``hang_timeout`` (seconds; None: no hang detection),
    ``signals_to_handle`` (default: ``TORCHELASTIC_SIGNALS_TO_HANDLE`` or torch's
    default), ``gpu_check`` (False: skip the NVML pre-start check), ``node``,
    ``metrics_handler`` (where the agent's metrics go; default: the handler set with
    ``elastic.metrics.configure``, as in torch).
    """

    #: a direct subclass that overrides torch's hooks synchronously gets torch's own
    #: (elastic.agent.server._torch_local.TorchLocalElasticAgent) as its base instead
    _torch_local_base = True

    def __init__(
        self,
        spec: WorkerSpec,
        logs_specs: LogsSpecs | None = None,
        start_method: str = "spawn",
        exit_barrier_timeout: float | None = None,
        log_line_prefix_template: str | None = None,
        shutdown_timeout: float = 30,
        health_check_server: Any = None,
        uninterruptible_state_timeout: float | None = None,
        *,
        events: EventSink | None = None,
        extra_env: Mapping[str, str] | None = None,
        hang_timeout: float | None = None,
        signals_to_handle: str | None = None,
        gpu_check: bool = True,
        node: int | str | None = None,
        reaper: bool | ReaperSidecar = True,
        preload: Sequence[str] = (),
        metrics_handler: MetricHandler | None = None,
    ) -> None:
        from elastic.metrics.api import ConfiguredMetricHandler
        from elastic.real.workers import ProcessWorkers

        if start_method not in ("spawn", "fork", "forkserver"):
            raise ConfigError(
                "--start-method", f"got {start_method!r}; expected spawn, fork or forkserver"
            )
        if hang_timeout is not None and not hang_timeout > 0:
            raise ConfigError("--hang-timeout", f"got {hang_timeout}; expected seconds > 0")
        # forkserver has no meaning without torch.multiprocessing: a spawned child is the
        # same guarantee (a fresh interpreter) for function entrypoints
        method = "fork" if start_method == "fork" else "spawn"
        # the role is read from the group's spec at each start, as torch's agent reads
        # the spec only when it runs (its constructor takes any spec-like object)
        filters = (
            _filters_of(getattr(spec, "duplicate_stdout_filters", None)),
            _filters_of(getattr(spec, "duplicate_stderr_filters", None)),
        )
        options: dict[str, Any] = {
            "start_method": method,
            "log_line_prefix_template": log_line_prefix_template,
            "reaper": reaper,
        }
        workers: ProcessWorkers
        if any(filters):
            # torch's --duplicate-std{out,err}-filters: matching lines of the tee'd
            # streams are copied to the attempt's filtered_std{out,err}.log
            from elastic.multiprocessing.pcontext import FilteringWorkers

            workers = FilteringWorkers(logs_specs, prefixes=None, filters=filters, **options)
        else:
            workers = ProcessWorkers(logs_specs, **options)
        self._hang = _HangWatch(self, hang_timeout) if hang_timeout is not None else None
        #: torch 2.13: the argument, else TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, else
        #: 0 (off); non-positive or unparsable values turn the check off
        self._uninterruptible_state_timeout = _resolve_uninterruptible_state_timeout(
            uninterruptible_state_timeout
        )
        self._uninterruptible_state_first_seen: dict[int, float] = {}
        super().__init__(
            spec,
            exit_barrier_timeout,
            shutdown_timeout,
            workers=workers,
            events=events,
            node=node if node is not None else _default_node(),
            health_watches=[
                *([self._hang] if self._hang is not None else []),
                *([_GpuWatch(self)] if gpu_check else []),
                *([_UninterruptibleWatch(self)] if self._uninterruptible_state_timeout else []),
            ],
            pre_start_checks=[self._check_gpus] if gpu_check else None,
            env_hooks=[self._torch_env],
            # torch's agent reports to the handlers set with metrics.configure()
            metrics_handler=metrics_handler or ConfiguredMetricHandler(),
        )
        self._process_workers = workers
        self._logs_specs = workers.logs_specs
        self._start_method = start_method
        self._log_line_prefix_template = log_line_prefix_template
        self._health_check_server = health_check_server
        self._extra_env = dict(extra_env or {})
        self._signals = parse_signals(
            signals_to_handle
            if signals_to_handle is not None
            else os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", DEFAULT_SIGNALS_TO_HANDLE)
        )
        self._timer_server: Any = None
        self._timer_file: str | None = os.environ.get(TORCHELASTIC_TIMER_FILE) or None
        self._progress_source: Any = None
        self._progress_monitor: Any = None
        self._private_dir: str | None = None
        self._groups: list[RunningGroup] = []
        self._nvml_absent = False
        # the last GPU check's verdict, for /health (None: NVML absent or no check yet)
        self._gpu_verdict: dict[str, Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if spec.numa_options:
            logger.warning("--numa-binding is not supported yet; workers are not bound")
        self._preload = list(preload)
        #: torch's process context, used only by a subclass written against torch's
        #: synchronous hooks (elastic.agent.server._torch_local)
        self._pcontext: Any = None

    # -- torch's API -------------------------------------------------------------------
    @property
    def logs_specs(self) -> LogsSpecs:
        return self._logs_specs

    @property
    def reaper_pid(self) -> int | None:
        """The pid of the sidecar that kills the workers if this agent dies."""
        return self._process_workers.reaper_pid

    @property
    def timer_file(self) -> str | None:
        """The file-timer pipe given to workers (None when timers are off and unset)."""
        return self._timer_file

    def get_last_progress_time(self) -> int:
        """What ``/health`` reports (wall-clock seconds): the older of the file-timer
        watchdog's last progress and, with hang detection, the stalest rank's last
        beat (the group's start while a rank has not beaten yet); else now."""
        wall_now = _wall_time()
        times = [wall_now]
        if self._timer_server is not None:
            times.append(float(self._timer_server.get_last_progress_time()))
        monitor = self._progress_monitor
        if monitor is not None and self._clock is not None:
            beats = list(monitor.watcher._last.values())
            if beats:
                times.append(wall_now - (self._clock.now() - min(beats)))
        return int(min(times))

    def _health_status(self) -> dict[str, Any]:
        wg = self._worker_group
        return {
            "state": wg.state.value,
            "restart_count": self.restart_count,
            "remaining_restarts": self.remaining_restarts,
            "run_id": wg.spec.rdzv_handler.get_run_id(),
            "worker_pids": sorted(self.running_pids().values()),
            **({"gpu": dict(self._gpu_verdict)} if self._gpu_verdict is not None else {}),
        }

    def _health_metrics(self) -> dict[str, float | int | bool]:
        wg = self._worker_group
        return {
            "elastic_restarts_total": self.restart_count,
            "elastic_remaining_restarts": self.remaining_restarts,
            "elastic_workers_running": len(self.running_pids()),
            "elastic_group_healthy": wg.state.value == "HEALTHY",
        }

    # -- the run -----------------------------------------------------------------------
    async def run_async(self, role: str = DEFAULT_ROLE) -> RunResult | None:
        """Run with signal handlers, timers, progress pipes and health endpoint set up."""
        self._refuse_torch_hooks()
        if self._clock is None:
            from elastic.real.clock import AsyncioClock

            self._clock = AsyncioClock()
        loop = asyncio.get_running_loop()
        self._loop = loop
        me = asyncio.current_task()
        received: list[signal.Signals] = []

        def on_signal(sig: signal.Signals) -> None:
            if received:
                return  # already shutting down; the grace period still applies
            received.append(sig)
            logger.info("Received %s death signal, shutting down workers", sig.name)
            self.set_death_signal(int(sig))
            if me is not None:
                me.cancel()

        installed: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in self._signals:
                try:
                    loop.add_signal_handler(sig, on_signal, sig)
                except (ValueError, RuntimeError, OSError) as e:
                    logger.warning("cannot handle %s: %s", sig.name, e)
                else:
                    installed.append(sig)
        else:
            logger.warning(
                "the agent is not on the main thread: it cannot handle termination signals "
                "(its workers still die with it)"
            )
        failed = True  # until the run returns or stops by a signal: see _tear_down
        try:
            self._set_up()
            self._start_zygote()
            result = await super().run_async(role)
            failed = False
            return result
        except asyncio.CancelledError:
            if received:
                failed = False
                sig = received[0]
                raise SignalException(
                    f"Process {os.getpid()} got signal: {int(sig)}", sigval=sig
                ) from None
            raise
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self._tear_down(sweep=failed)

    def run(self, role: str = DEFAULT_ROLE) -> RunResult | None:
        """Run the agent to the end on a fresh event loop; raises SignalException."""
        from elastic.real.clock import run_sync

        if type(self) is LocalElasticAgent and any(h in vars(self) for h in _TORCH_HOOKS):
            # one of torch's synchronous hooks patched on this agent (as torch's tests do:
            # patch.object(agent, "_monitor_workers")): it is driven by torch's loop
            from elastic.agent.server._torch_local import TorchLocalElasticAgent

            self.__class__ = TorchLocalElasticAgent
            result_: RunResult | None = self.run(role)
            return result_

        result: RunResult | None = run_sync(self.run_async(role))
        return result

    def _start_timer_server(self) -> None:
        """torch's file-timer watchdog, when ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` and it
        is not running already."""
        if os.environ.get(TORCHELASTIC_ENABLE_FILE_TIMER) != "1" or self._timer_server:
            return
        from elastic.timer.file_based_local_timer import FileTimerServer

        if self._timer_file is None:
            self._timer_file = os.path.join(tempfile.gettempdir(), f"watchdog_timer_{uuid4_str()}")
        self._timer_server = FileTimerServer(
            self._timer_file,
            self._worker_group.spec.rdzv_handler.get_run_id(),
            max_interval=0.1,
            log_event=self._log_watchdog_event,
        )
        self._timer_server.start()

    def _set_up(self) -> None:
        spec = self._worker_group.spec
        self._start_timer_server()
        if self._hang is not None:
            from elastic.progress import FifoProgressSource, ProgressMonitor, ProgressWatcher

            self._private_dir = tempfile.mkdtemp(prefix="elastic_agent_")
            ranks = range(spec.local_world_size)
            self._progress_source = FifoProgressSource(self._private_dir, ranks)
            self._progress_monitor = ProgressMonitor(
                self.clock, ProgressWatcher(self._hang.hang_timeout, ranks, self.clock.now())
            )
            assert self._loop is not None
            self._progress_source.start(
                self._progress_monitor.beat, self._loop.call_soon_threadsafe
            )
        self._start_health_check_server()

    def _start_health_check_server(self) -> None:
        port = os.environ.get(TORCHELASTIC_HEALTH_CHECK_PORT)
        if self._health_check_server is None and port is not None:
            port_number = health_port(port)
            if port_number is None:
                return
            try:
                from elastic.agent.server import health_check_server as hcs
            except ImportError:
                logger.warning("the health check server is not available; not serving /health")
                return
            timeout = _health_timeout()
            if timeout is None:
                return
            server = hcs.create_healthcheck_server(
                alive_callback=self.get_last_progress_time, port=port_number, timeout=timeout
            )
            server.status_callback = self._health_status
            server.metrics_callback = self._health_metrics
            self._health_check_server = server
        if self._health_check_server is not None:
            try:
                self._health_check_server.start()
            except (OSError, OverflowError, ValueError) as e:
                # the job runs without its health endpoint (as for a bad port value)
                logger.error(
                    "%s: cannot serve /health on port %s: %s. Not serving /health",
                    TORCHELASTIC_HEALTH_CHECK_PORT,
                    _shown(port),
                    getattr(e, "strerror", None) or e,
                )
                self._health_check_server = None
                return
            self._emit(
                kinds.AGENT_HEALTH_SERVER,
                port=getattr(self._health_check_server, "port", None),
            )

    async def _tear_down(self, sweep: bool = False) -> None:
        """Stop what the run set up; ``sweep``: the agent is failing (an exception of
        its own), so the reaper sidecar also kills every marked process before it goes
        (issue 15: a crashing agent used to tell it to quit without a sweep)."""
        try:
            # a stop cut short by a signal is finished here: no worker outlives the run
            for group in self._groups:
                try:
                    await group.stop(self._shutdown_timeout, self._death_sig)
                except Exception as e:  # logged; the sweep below covers it
                    logger.error("stopping the workers failed: %s", e)
                    sweep = True
            self._groups.clear()
            if self._health_check_server is not None:
                with contextlib.suppress(Exception):
                    self._health_check_server.stop()
            if self._timer_server is not None:
                with contextlib.suppress(Exception):
                    self._timer_server.stop()
                self._timer_server = None
            if self._progress_source is not None:
                with contextlib.suppress(Exception):
                    self._progress_source.stop()
                self._progress_source = None
            if self._private_dir is not None:
                shutil.rmtree(self._private_dir, ignore_errors=True)
                self._private_dir = None
            if self._process_workers.zygote is not None:
                self._process_workers.zygote.close()
        finally:
            await self._process_workers.aclose(sweep=sweep)

    def _start_zygote(self) -> None:
        """``--preload``: start the zygote now, so that its imports overlap the rendezvous."""
        if not self._preload or self._process_workers.zygote is not None:
            return
        spec = self._worker_group.spec
        if not isinstance(spec.entrypoint, str):
            logger.warning("--preload: ignored for a function entrypoint")
            return
        from elastic.real.zygote import Zygote

        env = {**os.environ, **self._extra_env}
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = os.environ.get(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"
        )
        zygote = Zygote(self._preload, spec.entrypoint, [str(a) for a in spec.args], env)
        self._process_workers.zygote = zygote
        zygote.start()

    # -- hooks of the loop ---------------------------------------------------------------
    def _emit_fields(self, kind: str, rank: int | None, fields: dict[str, Any]) -> None:
        super()._emit_fields(kind, rank, fields)
        _log_event(self._worker_group.spec, kind, rank, fields)

    async def _start_workers(self, wg: WorkerGroup) -> None:
        zygote = self._process_workers.zygote
        if zygote is not None:
            # it started with the run: a cold worker would import the same modules,
            # later and once per worker
            await zygote.ready()
        if self._progress_monitor is not None:
            self._progress_monitor.reset(range(wg.spec.local_world_size))
        self._process_workers.role = wg.spec.role  # the console prefix's role
        await super()._start_workers(wg)
        if self._group is not None:
            self._groups = [g for g in self._groups if g.running()] + [self._group]
            if self._timer_server is not None:
                self._timer_server.set_worker_pids(self._group.pids().values())

    async def _exit_barrier(self) -> None:
        """elastic's event-driven barrier, unless ``elastic.utils.store.barrier`` was
        replaced (patched or wrapped, where torch's agent looks it up at each exit, as
        torch's tests and users' hooks do): then the replacement is called as torch
        calls it, over a blocking view of the round's store, in a thread (errors logged,
        never raised: the job's result stands)."""
        from elastic.utils import store as store_util

        barrier = store_util.barrier
        size = self._worker_group.group_world_size
        if barrier is _OWN_BARRIER or self._store is None or self._loop is None or not size:
            await super()._exit_barrier()
            return
        from elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
        from elastic.rendezvous.api import SyncStore

        loop = self._loop

        def runner(coro: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(coro, loop).result()

        store = SyncStore(self._store, runner)
        self._in_exit_barrier = True
        t0 = self.clock.now()
        try:
            await asyncio.to_thread(
                lambda: barrier(
                    store=store,
                    world_size=size,
                    key_prefix=_TERMINAL_STATE_SYNC_ID,
                    barrier_timeout=self._exit_barrier_timeout,
                )
            )
            self._emit(kinds.AGENT_EXIT_BARRIER, duration_s=round(self.clock.now() - t0, 6))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.exception("Error waiting on exit barrier")
            self._emit(kinds.AGENT_EXIT_BARRIER_ERROR, error=f"{type(e).__name__}: {e}")
        finally:
            self._in_exit_barrier = False

    def _failure(self, ex: WorkerExit) -> Any:
        # only for the result the agent returns (a restart needs no record): the report's
        # modules are imported then, off the launch's and the restarts' paths
        from elastic.multiprocessing.errors.report import failure_from_exit

        # the exit's wall time, for a worker that wrote no error file (the record may be
        # made after the group was stopped, up to the shutdown timeout later)
        when = time.time() - (time.monotonic() - ex.time)
        return failure_from_exit(ex, fallback_timestamp=when)

    def _torch_env(self, wg: WorkerGroup, worker: Worker, env: dict[str, str]) -> None:
        spec = wg.spec
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = os.environ.get(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"
        )
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if spec.virtual_local_rank:
            if visible is not None:
                devices = visible.split(",")
                if worker.local_rank >= len(devices):
                    raise ConfigError(
                        "CUDA_VISIBLE_DEVICES",
                        f"got {visible!r}: no entry for local rank {worker.local_rank}; "
                        "expected one device per worker with --virtual-local-rank",
                    )
                env["CUDA_VISIBLE_DEVICES"] = devices[worker.local_rank]
            else:
                env["CUDA_VISIBLE_DEVICES"] = str(worker.local_rank)
        elif visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        for key, value in self._extra_env.items():
            env.setdefault(key, value)
        if self._timer_file is not None:
            env[TORCHELASTIC_TIMER_FILE] = self._timer_file
        if self._progress_source is not None:
            env.update(self._progress_source.env_for(worker.local_rank))

    async def _check_gpus(self, *, sampled: bool = False) -> str | None:
        """Refuse to start on unhealthy GPUs; None (go) without NVML or without GPUs.

        ``sampled``: the periodic check while the group runs, which records an event only
        when it finds a GPU unhealthy (not every ``monitor_interval``)."""
        if self._nvml_absent:
            return None  # NVML does not appear while the agent runs
        if not os.path.exists(NVIDIA_CONTROL_DEVICE):
            # no NVIDIA driver on this host: skip importing pynvml (~25 ms of every launch),
            # and elastic.gpu too (≈1 ms before the first spawn)
            self._nvml_absent = True
            say_once(
                f"NVML not available: CPU only (no {NVIDIA_CONTROL_DEVICE}); "
                "GPU health checks are off",
                logger.info,
            )
            return None
        from elastic.gpu import check_node_health

        report = check_node_health()
        if not report.nvml_available:
            self._nvml_absent = True
            say_once(f"{report.message}; GPU health checks are off", logger.info)
            return None
        if not report.gpus:
            return None
        self._gpu_verdict = {"healthy": report.healthy, "message": report.message}
        if not sampled or not report.healthy:
            self._emit(kinds.AGENT_GPU_CHECK, healthy=report.healthy, message=report.message)
        return None if report.healthy else report.message

    # -- torch's synchronous hooks (its driver calls them: elastic.agent.server._torch_local;
    # elastic's own run never does) ---------------------------------------------------------
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        role = worker_group.spec.role
        pcontext = self._pcontext
        if pcontext is None:
            raise AssertionError("no workers were started")
        worker_pids = {w.id for w in worker_group.workers}
        pc_pids = set(pcontext.pids().values())
        if worker_pids != pc_pids:
            logger.error(
                "[%s] worker pids do not match process_context pids. Expected: %s, actual: %s",
                role,
                worker_pids,
                pc_pids,
            )
            return RunResult(state=WorkerState.UNKNOWN)
        result = pcontext.wait(0)
        if not result:
            timeout = self._uninterruptible_state_timeout
            if timeout > 0:
                stuck = self._check_uninterruptible_state_timeout(worker_group, timeout)
                if stuck is not None:
                    return stuck
            return RunResult(state=WorkerState.HEALTHY)
        workers = worker_group.workers
        if result.is_failed():
            return RunResult(
                state=WorkerState.FAILED,
                failures={workers[r].global_rank: f for r, f in result.failures.items()},
            )
        return RunResult(
            state=WorkerState.SUCCEEDED,
            return_values={workers[r].global_rank: v for r, v in result.return_values.items()},
        )

    def _stop_workers(self, worker_group: WorkerGroup, is_restart: bool = False) -> None:
        # torch 2.13 takes no ``is_restart``; a subclass written for the torch versions
        # that passed it may still give it
        self._shutdown()

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        if self._timer_server is not None:
            self._timer_server.stop()
            self._timer_server = None
        if self._health_check_server is not None:
            self._health_check_server.stop()
            self._health_check_server = None
        if self._pcontext is not None:
            self._pcontext.close(death_sig, timeout)

    def _check_uninterruptible_state_timeout(
        self, worker_group: WorkerGroup, timeout: float
    ) -> RunResult | None:
        """torch 2.13's check: ``UNHEALTHY`` (and no restarts left) when a worker has
        been in uninterruptible sleep for ``timeout`` seconds or more, else ``None``
        (the dwell times updated)."""
        if self._pcontext is not None:
            pids = set(self._pcontext.pids().values())
        elif self._group is not None:
            pids = set(self._group.pids().values())
        else:
            return None
        role = worker_group.spec.role
        seen = self._uninterruptible_state_first_seen
        for pid in list(seen):
            if pid not in pids:
                del seen[pid]
        timed_out = []
        for pid in pids:
            elapsed = self._update_uninterruptible_dwell(pid, role, timeout)
            if elapsed is not None and elapsed >= timeout:
                timed_out.append((pid, elapsed))
        if not timed_out:
            return None
        for pid, elapsed in timed_out:
            logger.error(
                "[%s] Worker pid=%s stuck in uninterruptible sleep (D-state) for %.1fs "
                "(>= %.1fs); marking worker group UNHEALTHY and disabling restarts.",
                role,
                pid,
                elapsed,
                timeout,
            )
        # a wedged worker holds a kernel resource (GPU, NIC) a new worker would contend
        # for: no restart, the agent ends
        self._remaining_restarts = 0
        return RunResult(state=WorkerState.UNHEALTHY)

    def _update_uninterruptible_dwell(self, pid: int, role: str, timeout: float) -> float | None:
        """How long ``pid`` has been in uninterruptible sleep without a break (seconds),
        or ``None`` if it is not (or its state cannot be read)."""
        state = read_proc_state(pid)
        if state is None:
            return None
        seen = self._uninterruptible_state_first_seen
        if not is_uninterruptible_state(state):
            seen.pop(pid, None)
            return None
        first = seen.get(pid)
        if first is None:
            seen[pid] = time.monotonic()
            logger.warning(
                "[%s] Worker pid=%s entered uninterruptible sleep (D-state); will mark "
                "UNHEALTHY if it remains for %.1fs.",
                role,
                pid,
                timeout,
            )
            return 0.0
        return time.monotonic() - first

    def _log_watchdog_event(self, name: str, request: Any) -> None:
        """torch's watchdog events, as ``agent.watchdog`` events (from any thread)."""
        fields: dict[str, Any] = {"watchdog_event": name}
        if request is not None:
            fields.update(
                worker_pid=request.worker_pid,
                scope_id=request.scope_id,
                expiration_time=request.expiration_time,
                signal=request.signal,
            )
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        emit: Callable[[], None] = lambda: self._emit(kinds.AGENT_WATCHDOG, **fields)  # noqa: E731
        try:
            if _on_loop_thread(loop):
                emit()
            else:
                loop.call_soon_threadsafe(emit)
        except RuntimeError:
            pass  # the loop closed meanwhile: the run is over


def _own_barrier() -> Any:
    from elastic.utils.store import barrier

    return barrier


#: elastic's own store barrier (a different one found there was put there by someone)
_OWN_BARRIER = _own_barrier()

#: the hooks torch's driver calls (a patch of one on an agent means that driver)
_TORCH_HOOKS = ("_start_workers", "_monitor_workers", "_stop_workers", "_shutdown")


def __getattr__(name: str) -> Any:
    """``start_processes``, imported on first use: the name torch's tests patch here (the
    workers of an agent driven by torch's hooks are started through it)."""
    if name == "start_processes":
        from elastic.multiprocessing import start_processes

        globals()[name] = start_processes
        return start_processes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _filters_of(value: Any) -> tuple[str, ...]:
    """A spec's output filters (a list of strings; anything else, as a spec-like object's
    attribute torch would not read here, is none)."""
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return ()


def _resolve_uninterruptible_state_timeout(explicit: float | None) -> float:
    """The argument, else ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``, else 0 (off);
    non-positive or unparsable values are 0, as in torch 2.13."""
    if explicit is not None:
        return max(0.0, float(explicit))
    raw = os.environ.get(TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, "")
    try:
        return max(0.0, float(raw)) if raw else 0.0
    except ValueError:
        return 0.0


def _log_event(spec: WorkerSpec, kind: str, rank: int | None, fields: dict[str, Any]) -> None:
    """What torchrun logs of a failure, a restart and a new round, in its words and levels.

    Real mode only: the simulator's agents do not log (a simulation has thousands of
    failures; its report and event log say what happened).
    """
    role = spec.role
    if kind == kinds.WORKER_FAILED:
        code = int(fields.get("exit_code", 0))
        how = ""
        if code < 0:
            try:
                how = f", signal {signal.Signals(-code).name}"
            except ValueError:
                how = f", signal {-code}"
        logger.error(
            "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s (rank %s%s, %s)",
            code,
            fields.get("local_rank"),
            fields.get("worker_pid"),
            spec.get_entrypoint_name(),
            rank,
            how,
            fields.get("cause", "exited"),
        )
    elif kind == kinds.AGENT_RESTART:
        reason = fields.get("reason")
        if reason == kinds.RESTART_MEMBERSHIP:
            logger.info(
                "[%s] Detected a membership change (%s); will restart worker group",
                role,
                fields.get("detail") or kinds.RESTART_MEMBERSHIP,
            )
        else:
            # torch logs the budget before spending one restart; the event has it after
            logger.info(
                "[%s] Worker group %s. %s/%s attempts left; will restart worker group",
                role,
                "UNHEALTHY" if reason == kinds.RESTART_UNHEALTHY else "FAILED",
                int(fields.get("remaining_restarts", 0)) + 1,
                spec.max_restarts,
            )
    elif kind == kinds.AGENT_RENDEZVOUS_CLOSED:
        if fields.get("reason") == kinds.MEMBERSHIP_CLOSED_AFTER_SUCCESS:
            logger.info(
                "[%s] The rendezvous was closed after a peer's workers succeeded (it "
                "reached the exit barrier); the workers of this node run on until they exit",
                role,
            )
        else:
            logger.warning(
                "[%s] The rendezvous was closed by another node (the job ended there); "
                "this node stops",
                role,
            )
    elif kind == kinds.AGENT_GROUP_STARTED:
        logger.info(
            "[%s] Rendezvous complete for workers. Result: restart_count=%s group_rank=%s "
            "group_world_size=%s world_size=%s attempt=%s",
            role,
            fields.get("restart_count"),
            fields.get("group_rank"),
            fields.get("group_world_size"),
            fields.get("world_size"),
            fields.get("attempt"),
        )


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _shown(raw: str | None) -> str:
    """``raw`` for a log line: repr, at most 60 characters (an environment value may be
    megabytes long)."""
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "..."


def health_port(raw: str) -> int | None:
    """``TORCHELASTIC_HEALTH_CHECK_PORT`` as a port number 0..65535, or None (one line is
    logged, naming the variable, the value and what was expected: the job then runs
    without /health, as torch does for a bad value).  Accepts at most 100 characters."""
    try:
        number = int(raw) if len(raw) <= 100 else -1
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        logger.error(
            "%s: got %s; expected a port number 0..65535. Not serving /health",
            TORCHELASTIC_HEALTH_CHECK_PORT,
            _shown(raw),
        )
        return None
    return number


def _health_timeout() -> float | None:
    """Seconds without progress before ``/health`` says 503 (torch: 60).

    ``ELASTIC_HEALTH_CHECK_TIMEOUT`` (ours) changes it; a bad value is logged and the
    server is not started (like torch's bad port).
    """
    raw = os.environ.get("ELASTIC_HEALTH_CHECK_TIMEOUT", "60")
    try:
        value = float(raw) if len(raw) <= 100 else -1.0
    except ValueError:
        value = -1.0
    if not 0 < value < math.inf:
        logger.error(
            "ELASTIC_HEALTH_CHECK_TIMEOUT: got %s; expected seconds > 0 (finite). "
            "Not serving /health",
            _shown(raw),
        )
        return None
    return value


def _default_node() -> str:
    import socket

    return f"{socket.gethostname()}_{os.getpid()}"


def _wall_time() -> float:
    import time

    return time.time()
