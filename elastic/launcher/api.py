"""torch's launcher API: ``elastic_launch(config, entrypoint)(*args)`` and ``launch_agent``.

``launch_agent`` builds the rendezvous on this process's ports (an
:class:`~elastic.real.clock.AsyncioClock` and the store described below, both created
inside the running loop), the :class:`~elastic.agent.server.api.WorkerSpec` and a
:class:`~elastic.agent.server.local_elastic_agent.LocalElasticAgent`, runs it, and

* returns the workers' return values by global rank on success (``{}`` when the node
  left the rendezvous gracefully — torch crashes there);
* raises :class:`~elastic.multiprocessing.errors.ChildFailedError` (torch's report,
  root cause = earliest failure) when the workers failed and restarts ran out;
* raises :class:`LaunchError` when the group failed without a worker failure to report
  (it stayed hung or unhealthy, or a pre-start check refused the node) — where torch
  returns ``{}`` and exits 0;
* lets :class:`~elastic.agent.server.local_elastic_agent.SignalException` through
  after the workers were stopped with the same signal.

The store the rendezvous runs on is opened by :mod:`elastic.real.rdzv_store`: in the
agent's own process for one node, else the agent-hosted network store (``c10d``,
``static``) or etcd.  A store host keeps serving, after its own agent finished, until
the other agents left (at most the close timeout).  An agent stopped by a signal
revokes its lease on the way out, so the others re-form at once instead of a lease's
time-to-live later.

As in torch, ``LocalElasticAgent`` and ``events`` are names of this module, looked up
when a launch needs them (imported on first use, so that ``fqdn`` costs no agent
import), which is where torch's tests patch them.  The agent runs as
``await agent.run_async()`` while its ``run`` is elastic's own; an agent whose ``run``
was overridden or patched, or that is written against torch's synchronous hooks, is run
the way torch runs it, ``agent.run()`` on the thread that called :func:`launch_agent`,
while the launch itself (the store, a store this node hosts, the handler, whose
synchronous calls go to it) runs on a loop thread of its own.  Likewise the rendezvous is
closed with ``await shutdown_async()`` unless the handler's ``shutdown`` is someone
else's, which is then called as torch calls it, in a thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import queue
import shutil
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import IO, TYPE_CHECKING, Any

from elastic.errors import ConfigError, ElasticError, StoreError
from elastic.ids import uuid4_int
from elastic.run_args import LaunchConfig

__all__ = ["LaunchConfig", "LaunchError", "elastic_launch", "fqdn", "free_port", "launch_agent"]

if TYPE_CHECKING:
    from elastic.agent.server.api import RunResult, WorkerSpec
    from elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from elastic.events import EventSink
    from elastic.multiprocessing.api import LogsSpecs
    from elastic.real.loop_thread import LoopThread
    from elastic.real.rdzv_store import RendezvousStore
    from elastic.real.reaper import ReaperSidecar
    from elastic.rendezvous.api import RendezvousHandler, RendezvousParameters

logger = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    """``LocalElasticAgent`` and ``events``, imported and kept as module globals on first
    use; a test's ``mock.patch`` replaces the global and, on exit, this brings it back."""
    value: Any
    if name == "LocalElasticAgent":
        from elastic.agent.server import local_elastic_agent

        value = local_elastic_agent.LocalElasticAgent
    elif name == "events":
        import elastic.events

        value = elastic.events
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _module_name(name: str) -> Any:
    """The current value of a lazy name of this module (a patch, if one is in place).

    A function's global lookup never reaches the module's ``__getattr__``, hence this.
    """
    return globals()[name] if name in globals() else __getattr__(name)


def _elastics_own(method: Any) -> bool:
    """Whether a bound method is one elastic defines (not a subclass's, nor a mock)."""
    func = getattr(method, "__func__", None)
    module = getattr(func, "__module__", None)
    return isinstance(module, str) and module.startswith("elastic.")


class LaunchError(ElasticError):
    """The job failed and no worker failure explains it (hung, unhealthy, refused)."""


class elastic_launch:  # torch's name
    """``elastic_launch(config, entrypoint)(*args)`` → return values by global rank."""

    def __init__(
        self,
        config: LaunchConfig,
        entrypoint: Callable[..., Any] | str | None,
        health_check_server: Any = None,
        *,
        reaper: bool | ReaperSidecar = True,
    ) -> None:
        self._config = config
        self._entrypoint = entrypoint
        self._health_check_server = health_check_server
        self._reaper = reaper

    def __call__(self, *args: Any) -> dict[int, Any]:
        return launch_agent(
            self._config,
            self._entrypoint,
            list(args),
            self._health_check_server,
            reaper=self._reaper,
        )


def _get_entrypoint_name(entrypoint: Callable[..., Any] | str | None, args: list[Any]) -> str:
    """torch's rule: a function's name; for the Python executable, the script; else the command."""
    if callable(entrypoint):
        return str(getattr(entrypoint, "__name__", entrypoint))
    if isinstance(entrypoint, str):
        if entrypoint == sys.executable:
            return next((a for a in args if isinstance(a, str) and not a.startswith("-")), "")
        return entrypoint
    return ""


def _mp_std(value: Any) -> Any:
    """The command line's ``Std`` (or per-rank map) as the log specs' ``Std``."""
    from elastic.multiprocessing.api import Std

    if isinstance(value, dict):
        return {int(k): Std(int(v)) for k, v in value.items()}
    return Std(int(value))


def free_port() -> int:
    """A TCP port free at this instant on every interface (for rank 0's TCPStore).

    Races like torch's ``get_free_port``: another process may take it before rank 0
    binds it.  The window is the worker's start-up time.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def fqdn() -> str:
    """``socket.getfqdn()``: the first dotted name of this host, else its primary name.

    Torch's ``MASTER_ADDR`` and node address.  Without the ``idna`` codec: ``getfqdn``
    passes the name to ``gethostbyaddr`` as text, which encodes it with ``idna`` and so
    imports ``encodings.idna``, ``stringprep`` and ``unicodedata`` (≈2 ms of a launch);
    an ASCII host name passed as bytes is the same query.
    """
    name = socket.gethostname()
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:  # an internationalised host name: the codec is needed
        return socket.getfqdn(name)
    try:
        # CPython parses the argument with "et": bytes are taken as they are (typeshed says str)
        hostname, aliases, _ = socket.gethostbyaddr(raw)  # type: ignore[arg-type]
    except OSError:
        return name
    return next((n for n in [hostname, *aliases] if "." in n), hostname)


async def _shutdown(handler: Any) -> None:
    """torch's ``shutdown()``: close the rendezvous for every node (best effort).

    Elastic's own ``shutdown`` is the face of ``shutdown_async``, awaited here; any other
    (a torch-style handler's, a subclass's, a mock's) is called as torch calls it, in a
    thread so that a store hosted on this loop can answer it.
    """
    try:
        shutdown = getattr(handler, "shutdown", None)
        if shutdown is None or _elastics_own(shutdown):
            await handler.shutdown_async()
        else:
            await asyncio.to_thread(shutdown)
    except (StoreError, TimeoutError, OSError) as e:
        logger.warning("Could not close the rendezvous (its store failed): %s", e)


async def _leave(handler: Any) -> None:
    """Leave the rendezvous without closing it (elastic's handlers; torch's have no such
    method, and a handler whose ``leave_async`` gives nothing to await is left alone)."""
    leave = getattr(handler, "leave_async", None)
    if leave is None:
        return
    try:
        left = leave()
        if inspect.isawaitable(left):
            await left
    except Exception as e:  # the store may be gone too; leaving is best effort
        logger.warning("Could not leave the rendezvous cleanly: %s", e)


def launch_agent(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str | None,
    args: list[Any],
    health_check_server: Any = None,
    *,
    reaper: bool | ReaperSidecar = True,
) -> dict[int, Any]:
    """Run one agent on this node until the job ends (see the module docstring).

    ``reaper``: as for :class:`~elastic.agent.server.local_elastic_agent.LocalElasticAgent`
    — True (the workers start a reaper sidecar, see :mod:`elastic.real.reaper`), False
    (none), or a sidecar already started (``elastic run`` starts it first thing).
    """
    from elastic.real.clock import run_sync

    def launch() -> Coroutine[Any, Any, dict[int, Any]]:
        return launch_agent_async(
            config, entrypoint, args, health_check_server=health_check_server, reaper=reaper
        )

    if _runs_async(_module_name("LocalElasticAgent")):
        result: dict[int, Any] = run_sync(launch())
        return result
    return _launch_with_run_on_this_thread(launch)


def _runs_async(agent_class: Any) -> bool:
    """Whether the agent class runs as elastic's event-driven agent (``run_async``): its
    ``run`` is elastic's own and it is not written against torch's synchronous hooks."""
    from elastic.agent.server._torch_style import is_torch_style

    run = getattr(agent_class, "run", None)
    func = getattr(run, "__func__", run)
    module = getattr(func, "__module__", None)
    own = isinstance(module, str) and module.startswith("elastic.")
    return own and isinstance(agent_class, type) and not is_torch_style(agent_class)


class _MainThread:
    """Calls made on the launching thread for a launch running on a loop thread."""

    def __init__(self, loop_thread: LoopThread) -> None:
        self.loop_thread = loop_thread
        self.calls: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = (
            queue.SimpleQueue()
        )

    async def call(self, fn: Callable[[], Any]) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls.put((fn, fut))
        return await fut


#: set while a launch runs on a loop thread: the agent's ``run()`` goes to the launching
#: thread (see :func:`_launch_with_run_on_this_thread`)
_MAIN_THREAD: contextvars.ContextVar[_MainThread | None] = contextvars.ContextVar(
    "elastic_launch_main_thread", default=None
)


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def _launch_with_run_on_this_thread(
    launch: Callable[[], Coroutine[Any, Any, dict[int, Any]]],
) -> dict[int, Any]:
    """torch's launch for an agent whose ``run()`` is its own (overridden, patched, or
    torch's synchronous driver): ``run()`` is called on this thread, as torch calls it
    (signal handlers, a ``SignalException``, ``asyncio.run`` inside it all work), while
    the launch's own work -- the store, a store this node hosts, the handler -- runs on
    a loop thread, free while ``run()`` blocks; the handler's synchronous calls go to it.
    A ``KeyboardInterrupt`` in ``run()`` cancels the launch (the store is closed) and
    is raised here."""
    from elastic.real.loop_thread import LoopThread

    with LoopThread("elastic-launch") as lt:
        main = _MainThread(lt)

        async def on_loop() -> dict[int, Any]:
            _MAIN_THREAD.set(main)  # this task's own context
            return await launch()

        done = asyncio.run_coroutine_threadsafe(on_loop(), lt.loop)
        done.add_done_callback(lambda _: main.calls.put(None))
        while (item := main.calls.get()) is not None:
            fn, fut = item
            try:
                value = fn()
            except Exception as e:
                lt.loop.call_soon_threadsafe(_settle, fut, None, e)
            except BaseException:
                done.cancel()
                raise
            else:
                lt.loop.call_soon_threadsafe(_settle, fut, value, None)
        return done.result()


async def launch_agent_async(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str | None,
    args: list[Any],
    *,
    health_check_server: Any = None,
    reaper: bool | ReaperSidecar = True,
) -> dict[int, Any]:
    """:func:`launch_agent` on the running event loop: check the configuration, open the
    rendezvous store, run the agent on it, and close the store (a host lingers for the
    other agents, unless a signal stopped this one)."""
    from elastic.agent.server.local_elastic_agent import SignalException
    from elastic.real.clock import AsyncioClock
    from elastic.real.rdzv_store import open_rendezvous_store

    if entrypoint is None:
        raise ConfigError("entrypoint", "got None; expected a program or a function")
    params = _rendezvous_parameters(config)
    clock = AsyncioClock()
    node_id = f"{socket.gethostname()}_{os.getpid()}"
    opened = await open_rendezvous_store(
        config.rdzv_backend,
        config.rdzv_endpoint,
        config.max_nodes,
        config.rdzv_configs,
        clock,
    )
    if opened.hosting:
        logger.info("This agent hosts the rendezvous: %s", opened.where)
    linger = _linger(config)
    try:
        return await _run_on_store(
            config,
            entrypoint,
            args,
            params,
            opened,
            clock,
            node_id,
            health_check_server=health_check_server,
            reaper=reaper,
        )
    except SignalException:
        linger = 0.0  # told to stop: the others lose the store now, as they would on a kill
        raise
    finally:
        await opened.aclose(linger=linger)
        # a background task's failure nobody retrieved: reported, never swallowed
        for name, err in clock.unobserved:
            logger.error(
                "a background task failed and nothing awaited it: %s: %s: %s",
                name or "(unnamed)",
                type(err).__name__,
                err,
            )
        if clock.unobserved_dropped:
            logger.error(
                "%d more background tasks failed and nothing awaited them (not kept)",
                clock.unobserved_dropped,
            )


def _rendezvous_parameters(config: LaunchConfig) -> RendezvousParameters:
    """The rendezvous parameters of ``config`` (a random run id if it has none), checked."""
    from elastic.rendezvous.api import RendezvousParameters
    from elastic.rendezvous.conf import check_rdzv_conf

    run_id = config.run_id
    if not run_id:
        run_id = str(uuid4_int())
        logger.warning("config has no run_id, generated a random run_id: %s", run_id)
    why = check_rdzv_conf(config.rdzv_backend, config.rdzv_configs)
    if why is not None:
        raise ConfigError("--rdzv-conf", why)
    # the token reaches the store and nothing else (parameters are printed in logs)
    rdzv_configs = {k: v for k, v in config.rdzv_configs.items() if k != "token"}
    try:
        return RendezvousParameters(
            backend=config.rdzv_backend,
            endpoint=config.rdzv_endpoint,
            run_id=run_id,
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            local_addr=config.local_addr,
            **rdzv_configs,
        )
    except ValueError as e:
        raise ConfigError("--nnodes", str(e)) from None


def _linger(config: LaunchConfig) -> float:
    """How long a store host waits for the other agents to leave (the close timeout)."""
    from elastic.real.rdzv_store import linger

    return linger(config.rdzv_configs)


async def _run_on_store(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str,
    args: list[Any],
    params: RendezvousParameters,
    opened: RendezvousStore,
    clock: Any,
    node_id: str,
    *,
    health_check_server: Any,
    reaper: bool | ReaperSidecar,
) -> dict[int, Any]:
    """Build the handler and the agent on the opened store, run the agent, and turn its
    result into the workers' return values or the error to raise."""
    agent_class = _module_name("LocalElasticAgent")
    handler = _rendezvous_handler(config, params, opened, clock, node_id)
    spec = _worker_spec(config, entrypoint, args, handler)
    logs_specs = _logs_specs(config)
    # the handler is checked first: a refused name must not leave the event file open
    recorder = _recorder(config, params.run_id, spec.get_entrypoint_name())
    event_file, events = _event_log(config, recorder)
    extra_env = dict(config.extra_env)
    # torch puts this in the agent's os.environ, whence every worker inherits it
    extra_env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
    try:
        agent = agent_class(
            spec,
            logs_specs,
            start_method=config.start_method,
            log_line_prefix_template=config.log_line_prefix_template,
            shutdown_timeout=float(config.shutdown_timeout or 0),
            exit_barrier_timeout=config.exit_barrier_timeout,
            health_check_server=health_check_server,
            events=events,
            extra_env=extra_env,
            hang_timeout=config.hang_timeout,
            signals_to_handle=config.signals_to_handle,
            node=node_id,
            reaper=reaper,
            preload=config.preload,
        )
        try:
            result = await _run_agent(agent, handler)
        except Exception:
            _record_agent_status(config, agent.get_event_failed, quiet=True)
            raise
        # torch records SUCCEEDED once the agent returns, whatever its workers' outcome
        _record_agent_status(config, agent.get_event_succeeded, quiet=False)
    finally:
        if event_file is not None:
            event_file.close()
    return _outcome(config, agent, result, logs_specs, _get_entrypoint_name(entrypoint, args))


def _rendezvous_handler(
    config: LaunchConfig,
    params: RendezvousParameters,
    opened: RendezvousStore,
    clock: Any,
    node_id: str,
) -> RendezvousHandler:
    """This node's rendezvous handler on the opened store, from the registry."""
    from elastic.rendezvous.api import RendezvousContext
    from elastic.rendezvous.registry import get_rendezvous_handler

    ctx = RendezvousContext(
        store=opened.store,
        clock=clock,
        node_addr=config.local_addr or fqdn(),
        node_id=node_id.replace("/", "_"),
        port_chooser=free_port,
        # torch's synchronous handler calls, from an agent run on the launching thread
        sync_runner=main.loop_thread.run if (main := _MAIN_THREAD.get()) else None,
    )
    try:
        return get_rendezvous_handler(params, ctx)
    except ConfigError:
        raise  # it names its flag (a bad --rdzv-conf value the handler read) already
    except ValueError as e:
        from elastic.rendezvous.registry import rendezvous_handler_registry

        known = sorted(rendezvous_handler_registry._registry)
        if params.backend in known:
            raise ConfigError("--rdzv-backend", f"{params.backend}: {e}") from None
        raise ConfigError(
            "--rdzv-backend",
            f"got {params.backend!r}; expected one of {', '.join(known)} (or a backend an "
            "installed package registers)",
        ) from None


def _worker_spec(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str,
    args: list[Any],
    handler: RendezvousHandler,
) -> WorkerSpec:
    from elastic.agent.server.api import WorkerSpec

    return WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=tuple(args),
        rdzv_handler=handler,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        local_addr=config.local_addr,
        event_log_handler=config.event_log_handler,
        numa_options=config.numa_options,
        duplicate_stdout_filters=config.duplicate_stdout_filters,
        duplicate_stderr_filters=config.duplicate_stderr_filters,
        virtual_local_rank=config.virtual_local_rank,
    )


def _logs_specs(config: LaunchConfig) -> LogsSpecs:
    """Where the workers' output goes: the config's own, else the ``--logs-specs``
    plugin's (torch's entry point group ``torchrun.logs_specs``; default: ours)."""
    if config.logs_specs is not None:
        given: LogsSpecs = config.logs_specs
        return given
    from elastic.run_args import _get_logs_specs_class

    cls = _get_logs_specs_class(config.logs_specs_name)
    try:
        return cls(
            log_dir=config.log_dir,
            redirects=_mp_std(config.redirects),
            tee=_mp_std(config.tee),
            local_ranks_filter=(
                set(config.local_ranks_filter) if config.local_ranks_filter else None
            ),
        )
    except (NotADirectoryError, OSError) as e:
        raise ConfigError("--log-dir", f"got {config.log_dir!r}; {e}") from None
    except Exception as e:  # a plugin's own constructor
        if config.logs_specs_name in (None, "default"):
            raise
        raise ConfigError(
            "--logs-specs", f"{config.logs_specs_name!r} could not be made: {e}"
        ) from None


def _recorder(config: LaunchConfig, run_id: str, entry_point: str) -> EventSink | None:
    """torch's ``--event-log-handler``: where its worker-status and rendezvous events go."""
    if config.event_log_handler == "null":
        return None
    from elastic.events.api import RecordSink, handler_names

    try:
        return RecordSink(
            config.event_log_handler, run_id, config.rdzv_backend, fqdn(), entry_point
        )
    except KeyError:
        raise ConfigError(
            "--event-log-handler",
            f"got {config.event_log_handler!r}; expected one of {', '.join(handler_names())}",
        ) from None


def _record_agent_status(config: LaunchConfig, event: Callable[[], Any], *, quiet: bool) -> None:
    """torch's launch_agent records the agent's own status event to ``--event-log-handler``
    once per run, after it (the default handler, ``null``, drops it), through
    ``events.record`` of this module (``elastic.events``) -- where torch's tests and users'
    hooks look for it.

    A handler's error propagates after a run that returned, before the workers' outcome
    is looked at, as torch's does (torch's ``test_launch_elastic_agent_raise_exception``
    relies on it); after a run that raised (``quiet``) it is logged, and the run's own
    exception is the one raised (torch's would be replaced by the handler's)."""
    try:
        _module_name("events").record(event(), config.event_log_handler)
    except Exception:
        if not quiet:
            raise
        logger.exception("could not record the agent's status event")


def _event_log(
    config: LaunchConfig, recorder: EventSink | None
) -> tuple[IO[str] | None, EventSink | None]:
    """The agent's event sink: ``--event-log``'s file (returned to be closed), the
    recorder, both, or neither."""
    event_file: IO[str] | None = None
    events: EventSink | None = None
    if config.event_log:
        from elastic.events import StreamSink

        try:
            event_file = open(config.event_log, "a", encoding="utf-8")  # noqa: SIM115
        except OSError as e:
            raise ConfigError(
                "--event-log", f"got {config.event_log!r}; cannot write it: {e.strerror}"
            ) from None
        events = StreamSink(event_file)
    if recorder is not None:
        from elastic.events import FanOutSink

        events = recorder if events is None else FanOutSink(events, recorder)
    return event_file, events


async def _run_agent(agent: LocalElasticAgent, handler: RendezvousHandler) -> RunResult | None:
    """Run the agent, then close the rendezvous for all, or only leave it when a signal
    stopped this node (or nothing, when the store itself failed)."""
    from elastic.agent.server.local_elastic_agent import SignalException

    try:
        run = getattr(agent, "run", None)
        if run is None or (_elastics_own(run) and _runs_async(type(agent))):
            result = await agent.run_async()
        else:  # overridden, patched or torch-style: torch's call, on the launching thread
            main = _MAIN_THREAD.get()
            if main is not None:
                result = await main.call(run)
            else:  # launch_agent_async awaited by the caller: a thread keeps the loop free
                logger.warning(
                    "%s.run() is not elastic's: it runs in a thread (termination signals "
                    "reach it only through launch_agent)",
                    type(agent).__qualname__,
                )
                result = await asyncio.to_thread(run)
    except SignalException:
        # torch keeps the rendezvous open for a restart of this node; the others
        # learn at once that this one left (its lease is revoked), not a ttl later
        await _leave(handler)
        raise
    except BaseException as e:
        if not isinstance(e, StoreError | TimeoutError | OSError):
            await _shutdown(handler)  # the store is up: close the rendezvous for all
        raise
    await _shutdown(handler)
    return result


def _outcome(
    config: LaunchConfig,
    agent: LocalElasticAgent,
    result: RunResult | None,
    logs_specs: LogsSpecs,
    name: str,
) -> dict[int, Any]:
    """The workers' return values by global rank, or the error that says why there are none."""
    from elastic.agent.server.api import WorkerState

    succeeded = result is None or result.state == WorkerState.SUCCEEDED
    if succeeded and config.logs_specs is None and not config.log_dir:
        # our own torchelastic_* temp dir (no --log-dir): nothing in it is wanted after a
        # run that did not fail; a failed run's is kept for the report's error files
        shutil.rmtree(logs_specs.root_log_dir, ignore_errors=True)
    if result is None:
        return {}
    if result.state == WorkerState.SUCCEEDED:
        return dict(result.return_values)
    from elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {r: f for r, f in result.failures.items() if isinstance(f, ProcessFailure)}
    if failures:
        raise ChildFailedError(name=name, failures=failures)
    if agent.refused_start is not None:
        raise LaunchError(f"{name}: this node refused to start its workers: {agent.refused_start}")
    raise LaunchError(
        f"{name}: the worker group ended {result.state.value} with no worker failure to "
        "report (it stayed hung or unhealthy and restarts ran out; see the agent's log "
        "and --event-log)"
    )
