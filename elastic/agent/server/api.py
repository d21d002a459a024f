"""The agent API of torch (``WorkerSpec``, ``WorkerState``, ``Worker``, ``WorkerGroup``,
``RunResult``, ``ElasticAgent``, ``SimpleElasticAgent``) and the agent loop, written
once against the ports.

Theory of operation
-------------------
``SimpleElasticAgent.run_async()`` is torch's ``_invoke_run`` made event-driven:

1. rendezvous (``spec.rdzv_handler.next_rendezvous_async``, told the agent's role and
   local world size first) → ranks: carried by the round (``info.assignment``: the
   dynamic rendezvous computes them when it decides the round), else exchanged through
   the round's store (:func:`elastic.agent.ranks.exchange_ranks_in_round`) → start workers
   through the workers port;
2. wait for the **first** of: the group's exits until they settle it (a failure, or
   every worker exited), a membership change (``rdzv_handler.watch_async()``), or a
   health verdict (each configured :class:`HealthWatch`).  Nothing is sampled: each is
   a task that wakes on its own event;
3. hand that outcome, the group's state and the remaining restarts to the pure
   :func:`elastic.agent.server._decide.decide`, and apply its decision: SUCCEEDED → exit
   barrier (``exit_barrier_timeout``, default 300 s) and finish; a failure or an
   unhealthy group → restart, spending one restart, or stop the workers and finish
   FAILED when none remain; membership change → restart **without** spending.  Every
   rule is written (and tested) there; ``_invoke_run`` only awaits and applies.

Invariants (checked over event logs by ``sim.checks``): a node's old group is stopped
before its new one starts; ``remaining_restarts`` never goes below zero; every run
ends with exactly one ``agent.finish`` event.

The same code runs in the simulator (simulated ports) and for real (``run()`` wraps
``run_async()`` in an event loop through the ``sync_runner``).
"""

from __future__ import annotations

import abc
import inspect
import json
import math
import os
import warnings
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from elastic.agent.ranks import AgentAssignment, exchange_ranks_in_round
from elastic.agent.server._decide import (
    Decision,
    GroupAction,
    Outcome,
    WorkerState,
    decide,
    settled,
)
from elastic.agent.server.role_info import RoleInstanceInfo as _RoleInstanceInfo  # noqa: F401 (torch's private name, imported by its tests)
from elastic.clock import Cancelled, Clock, OneShot, Task, Waitable
from elastic.errors import ConfigError, ElasticError
from elastic.events import (
    AgentEvent,
    EventSink,
    NullSink,
    PartsSink,
    WorkerEvents,
    kinds,
    parts_sink,
)
from elastic.metrics.api import put_metric  # noqa: F401 (torch's name here: its tests patch it)
from elastic.metrics.core import AgentMetrics, MetricHandler, NullMetricHandler
from elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
)
from elastic.store import Store
from elastic.workers import (
    ExitCause,
    ExitList,
    GroupLaunch,
    RunningGroup,
    WorkerExit,
    WorkerLaunch,
    WorkersPort,
)
from elastic.workers import worker_env as _env_from_base

if TYPE_CHECKING:
    from elastic.events.api import Event

__all__ = [
    "DEFAULT_ROLE",
    "ElasticAgent",
    "HealthWatch",
    "RunResult",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerStartRefused",
    "WorkerState",
]

DEFAULT_ROLE = "default"


def _get_fq_hostname() -> str:
    """torch's name for this host's FQDN (real mode: imported inside the call)."""
    from elastic.launcher.api import fqdn

    return fqdn()


_TERMINAL_STATE_SYNC_ID = "torchelastic/agent/terminal_state"
#: the exit barrier's count of agents checked in (torch's key)
_EXIT_BARRIER_COUNT = f"{_TERMINAL_STATE_SYNC_ID}/num_members"
#: how long the agent asks the round's store whether a peer reached the exit barrier when
#: the rendezvous closes under a running group (seconds)
_CLOSED_READ_TIMEOUT = 5.0


@dataclass
class WorkerSpec:
    """Blueprint information about a particular type of worker (torch's fields and defaults)."""

    role: str
    local_world_size: int
    rdzv_handler: RendezvousHandler
    fn: Callable[..., Any] | None = None
    entrypoint: Callable[..., Any] | str | None = None
    args: tuple[Any, ...] = ()
    max_restarts: int = 3
    monitor_interval: float = 0.1
    master_port: int | None = None
    master_addr: str | None = None
    local_addr: str | None = None
    event_log_handler: str = "null"
    numa_options: Any = None
    duplicate_stdout_filters: list[str] | None = None
    duplicate_stderr_filters: list[str] | None = None
    virtual_local_rank: bool = False

    def __post_init__(self) -> None:
        assert self.local_world_size > 0
        assert self.monitor_interval > 0
        if self.fn:
            warnings.warn(
                "WorkerSpec.fn will be deprecated, please use WorkerSpec.entrypoint instead",
                category=DeprecationWarning,
                stacklevel=2,
            )
            self.entrypoint = self.fn
        assert self.entrypoint

    def get_entrypoint_name(self) -> str:
        """The name of the entrypoint: the basename of a command, else ``__qualname__``."""
        if isinstance(self.entrypoint, str):
            return self.entrypoint.rsplit("/", 1)[-1]
        assert self.entrypoint is not None
        return str(self.entrypoint.__qualname__)


class Worker:
    """A worker instance; ranks are not stable across re-rendezvous."""

    __slots__ = ["global_rank", "id", "local_rank", "role_rank", "role_world_size", "world_size"]

    def __init__(
        self,
        local_rank: int,
        global_rank: int = -1,
        role_rank: int = -1,
        world_size: int = -1,
        role_world_size: int = -1,
    ) -> None:
        self.id: Any = None
        self.local_rank = local_rank
        self.global_rank = global_rank
        self.role_rank = role_rank
        self.world_size = world_size
        self.role_world_size = role_world_size

    def __str__(self) -> str:
        return (
            f"local_rank={self.local_rank},global_rank={self.global_rank}"
            f",role_rank={self.role_rank},world_size={self.world_size}"
            f",role_world_size={self.role_world_size}"
        )

    def __repr__(self) -> str:
        return str(self)


class WorkerGroup:
    """A set of Worker instances managed by the agent, with its rendezvous facts.

    Performance: after a rendezvous the agent gives the group its workers as one block
    (:meth:`_set_block`: local ranks ``0..n-1`` with consecutive global and role ranks,
    one world size), and ``workers`` makes the :class:`Worker` objects only when first
    read (the simulator restarts every node's group ~20 times a simulated day, and the
    agent's own path reads the block: eight objects per node per job restart)."""

    __slots__ = [
        "_block",
        "_ids",
        "_workers",
        "group_rank",
        "group_world_size",
        "master_addr",
        "master_port",
        "spec",
        "state",
        "store",
    ]

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        # (local world size, base global rank, base role rank, world size, role world
        # size) while ``_workers`` is not made yet; ``_ids``: their ids (pids) once started
        self._block: tuple[int, int, int, int, int] | None = None
        self._ids: dict[int, int] | None = None
        self._workers: list[Worker] | None = [
            Worker(local_rank=i) for i in range(self.spec.local_world_size)
        ]
        self.store: Store | None = None
        self.group_rank: int | None = None
        self.group_world_size: int | None = None
        self.master_addr: str | None = None
        self.master_port: int | None = None
        self.state = WorkerState.INIT

    @property
    def workers(self) -> list[Worker]:
        workers = self._workers
        if workers is None:
            assert self._block is not None
            lws, base_global, base_role, world_size, role_world_size = self._block
            workers = self._workers = [
                Worker(r, base_global + r, base_role + r, world_size, role_world_size)
                for r in range(lws)
            ]
            ids = self._ids
            if ids is not None:
                for w in workers:
                    w.id = ids.get(w.local_rank)
        return workers

    @workers.setter
    def workers(self, workers: list[Worker]) -> None:
        self._workers = workers
        self._block = self._ids = None

    def _set_block(
        self, lws: int, base_global: int, base_role: int, world_size: int, role_world_size: int
    ) -> None:
        """The workers are ``lws`` of local ranks ``0..lws-1``, global ranks from
        ``base_global``, role ranks from ``base_role`` (made when first read)."""
        self._workers = None
        self._block = (lws, base_global, base_role, world_size, role_world_size)
        self._ids = None

    def _size(self) -> int:
        """``len(self.workers)``, without making them."""
        workers = self._workers
        if workers is not None:
            return len(workers)
        assert self._block is not None
        return self._block[0]

    def _columns(self) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        """The workers' local ranks, global ranks, role ranks, world sizes and role world
        sizes, in order, without making them (Performance: from the block, in C)."""
        block = self._block if self._workers is None else None
        if block is not None:
            lws, base_global, base_role, world_size, role_world_size = block
            return (
                list(range(lws)),
                list(range(base_global, base_global + lws)),
                list(range(base_role, base_role + lws)),
                [world_size] * lws,
                [role_world_size] * lws,
            )
        workers = self.workers
        return (
            [w.local_rank for w in workers],
            [w.global_rank for w in workers],
            [w.role_rank for w in workers],
            [w.world_size for w in workers],
            [w.role_world_size for w in workers],
        )

    def _set_ids(self, ids: dict[int, int]) -> list[int | None]:
        """Give each worker its id (pid) by local rank; their ids in order (the workers
        not made: each gets its id when it is)."""
        if self._workers is None:
            assert self._block is not None
            self._ids = ids
            return list(map(ids.get, range(self._block[0])))
        workers = self._workers
        for w in workers:
            w.id = ids.get(w.local_rank)
        return [w.id for w in workers]

    def _global_ranks(self, local_ranks: list[int]) -> list[int]:
        """The global ranks of the workers of these local ranks, without making them."""
        block = self._block if self._workers is None else None
        if block is not None:  # worker i of the block has global rank base + i
            return list(map(block[1].__add__, local_ranks))
        workers = self.workers
        return [workers[lr].global_rank for lr in local_ranks]


@dataclass
class RunResult:
    """Return values/failures of the workers, by global rank (torch's semantics)."""

    state: WorkerState
    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, Any] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return self.state == WorkerState.FAILED


class ElasticAgent(abc.ABC):
    """An agent process responsible for managing one or more worker processes."""

    @abc.abstractmethod
    def run(self, role: str = DEFAULT_ROLE) -> RunResult | None:
        """Run the agent; return the result of the run."""

    @abc.abstractmethod
    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        """The WorkerGroup for ``role``."""


class HealthWatch(Protocol):
    """Something that can declare the running group unhealthy (NVML, hangs, …)."""

    async def wait_unhealthy(self, group: WorkerGroup) -> str:
        """Return a reason once the group is unhealthy; never returns while it is healthy."""
        ...


PreStartCheck = Callable[[], Awaitable[str | None]]
EnvHook = Callable[[WorkerGroup, Worker, dict[str, str]], None]


#: torch's documented ``SimpleElasticAgent`` hooks (seed 001).  Ours that exist are
#: coroutines; the others have no counterpart in the event-driven loop (worker exits are
#: awaited, not monitored; stopping is the workers port's), so an override would never
#: be called.  A subclass overriding one the wrong way is refused when it is run (it can
#: be built, as torch's tests and users' subclasses do, and its other methods used).
TORCH_HOOKS = (
    "_assign_worker_ranks",
    "_exit_barrier",
    "_get_master_addr_port",
    "_initialize_workers",
    "_monitor_workers",
    "_rendezvous",
    "_restart_workers",
    "_set_master_addr_port",
    "_share_and_gather",
    "_shutdown",
    "_start_workers",
    "_stop_workers",
)


def torch_hook_refusal(cls: type) -> str | None:
    """Why an agent class overriding torch's hooks cannot run, or ``None`` if it can."""
    local = next((k for k in cls.__mro__ if vars(k).get("_torch_local_base")), None)
    for name in TORCH_HOOKS:
        mine = getattr(cls, name, None)
        ours = getattr(SimpleElasticAgent, name, None)
        if mine is None or mine is ours or (local and mine is getattr(local, name, None)):
            continue  # (LocalElasticAgent's own torch hooks are for torch's driver only)
        if local is not None and not inspect.iscoroutinefunction(mine):
            # a direct subclass would have been given torch's LocalElasticAgent
            # (elastic.agent.server._torch_local); this one derives through another class
            return (
                f"{cls.__qualname__}.{name} overrides torch's synchronous hook, which runs "
                f"under torch's driver only for a direct subclass of {local.__name__} "
                f"({cls.__qualname__} derives from it through "
                f"{cls.__mro__[1].__qualname__}): subclass {local.__name__} directly, or "
                f"declare it `async def {name}` for elastic's event-driven agent"
            )
        if ours is None:
            return (
                f"{cls.__qualname__}.{name} overrides torch's hook, which elastic's "
                "event-driven agent never calls (worker exits are awaited and the workers "
                "port stops the group): subclass LocalElasticAgent or override the "
                "async hooks _rendezvous, _start_workers, _initialize_workers, "
                "_restart_workers or _exit_barrier instead"
            )
        if inspect.iscoroutinefunction(ours) and not inspect.iscoroutinefunction(mine):
            return (
                f"{cls.__qualname__}.{name} is synchronous (torch's signature), but "
                f"elastic's agent awaits it on its event loop: declare it `async def {name}` "
                "(call blocking code in it with `await self.clock.run_in_thread(fn)` in "
                "real mode)"
            )
    return None


#: the variable torch's newer releases read for the exit barrier's timeout when none is
#: given (users set it to skip the 5-minute wait between short jobs); else 300 s
TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT = "TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT"
DEFAULT_EXIT_BARRIER_TIMEOUT = 300.0


def resolve_exit_barrier_timeout(value: float | None, where: str = "exit_barrier_timeout") -> float:
    """``value`` in seconds, else ``TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT``, else 300.

    A negative, infinite or unparsable value is a :class:`ConfigError` (a ``ValueError``)
    naming where it came from (torch's words: "exit_barrier_timeout must be non-negative").
    """
    if value is None:
        raw = os.environ.get(TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT)
        if raw is None:
            return DEFAULT_EXIT_BARRIER_TIMEOUT
        where = TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(where, f"got {raw!r}; expected seconds >= 0") from None
    seconds = float(value)
    if seconds < 0:
        raise ConfigError(where, f"exit_barrier_timeout must be non-negative, got {seconds:g}")
    if not math.isfinite(seconds):
        raise ConfigError(where, f"got {seconds:g}; expected a finite number of seconds >= 0")
    return seconds


class SimpleElasticAgent(ElasticAgent):
    """The elastic agent, event-driven, over the clock, store and workers ports.

    A subclass may override the asynchronous hooks (``_rendezvous``, ``_start_workers``,
    ``_initialize_workers``, ``_restart_workers``, ``_exit_barrier``).  One that
    overrides torch's synchronous hooks (as every subclass of torch's abstract class
    does) can be constructed, but :meth:`run` refuses it with a ``TypeError`` naming the
    hook, before anything starts (see :func:`torch_hook_refusal`).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a subclass written against torch's synchronous hooks gets torch's driver
        from elastic.agent.server._torch_style import adopt

        adopt(cls, SimpleElasticAgent)

    def __init__(
        self,
        spec: WorkerSpec,
        exit_barrier_timeout: float | None = None,
        shutdown_timeout: float = 30,
        *,
        clock: Clock | None = None,
        workers: WorkersPort | None = None,
        events: EventSink | None = None,
        node: int | str = "",
        health_watches: list[HealthWatch] | None = None,
        pre_start_checks: list[PreStartCheck] | None = None,
        env_hooks: list[EnvHook] | None = None,
        rank_exchange_timeout: float = 600,
        metrics_handler: MetricHandler | None = None,
    ) -> None:
        self._worker_group = WorkerGroup(spec)
        self._remaining_restarts = spec.max_restarts
        self._store: Store | None = None
        self._exit_barrier_timeout = resolve_exit_barrier_timeout(exit_barrier_timeout)
        self._shutdown_timeout = shutdown_timeout
        self._total_execution_time = 0
        self._in_exit_barrier = False
        self._clock = clock
        self._workers_port = workers
        #: this agent's metrics (torch's names, group ``torchelastic``), on its clock
        # read through a weak reference: a bound method would make a cycle (agent ->
        # metrics -> method -> agent), and a cycle frees an agent only at a full collection,
        # rare in a long simulation (each crashed node's agent stayed with its last round's
        # member list: the 54-day 2,048-node run's memory grew with every crash)
        agent = weakref.ref(self)

        def now() -> float:
            alive = agent()
            if alive is None:
                raise RuntimeError("these metrics' agent is gone")
            return alive.clock.now()

        self.metrics = AgentMetrics(metrics_handler or NullMetricHandler(), now)
        self._metrics_handler_given = metrics_handler is not None
        self._events: EventSink = events if events is not None else NullSink()
        self._parts: PartsSink | None = parts_sink(self._events)  # see _emit_fields
        self._node = node
        self._health_watches = list(health_watches or [])
        self._pre_start_checks = list(pre_start_checks or [])
        self._env_hooks = list(env_hooks or [])
        self._rank_exchange_timeout = rank_exchange_timeout
        self._group: RunningGroup | None = None
        self._seen_exits: dict[int, WorkerExit] = {}  # local rank -> exit, this group's
        # the current round's rdzv_handler.watch_async(), started before the rank exchange
        self._membership_watch: Task[str] | None = None
        #: the rendezvous closed after a peer succeeded: the group runs on unwatched
        self._detached = False
        self._attempt = 0
        self._rounds = 0
        self._round = 0
        self._death_sig = 15
        # (what it was made of, the env) of the last _env_base
        self._last_env: tuple[tuple[Any, ...], dict[str, str]] | None = None
        self.refused_start: str | None = None
        self.last_event_time: float = 0.0

    # -- properties the launcher and health server read -------------------------------
    @property
    def remaining_restarts(self) -> int:
        return self._remaining_restarts

    @property
    def restart_count(self) -> int:
        return self._worker_group.spec.max_restarts - self._remaining_restarts

    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        return self._worker_group

    def running_pids(self) -> dict[int, int]:
        """local rank → pid of the running group (empty when none)."""
        return self._group.pids() if self._group is not None else {}

    def detach_events(self) -> None:
        """Send no more events (the simulator's node died under this agent)."""
        self._events = self._parts = NullSink()

    def set_death_signal(self, sig: int) -> None:
        """The signal the workers get when the agent is told to stop (SIGTERM by default)."""
        self._death_sig = sig

    # -- ports ------------------------------------------------------------------------
    @property
    def clock(self) -> Clock:
        if self._clock is None:
            raise RuntimeError("this agent has no clock: pass clock= (run() supplies one)")
        return self._clock

    @property
    def workers_port(self) -> WorkersPort:
        if self._workers_port is None:
            raise RuntimeError("this agent has no workers port: pass workers=")
        return self._workers_port

    def _emit(self, kind: str, rank: int | None = None, **fields: Any) -> None:
        self._emit_fields(kind, rank, fields)

    def _emit_fields(self, kind: str, rank: int | None, fields: dict[str, Any]) -> None:
        """Emit one event whose fields are ``fields``, which the event keeps (not copied:
        the caller hands over a dict of its own).  Every event of the agent comes here; a
        subclass that observes them overrides this method (and then sees every event).
        Only while it is not overridden, a group of workers' START or TERMINATED events
        may go to a sink that takes records as one record instead (:meth:`_group_sink`).

        Performance: ~21 events per node per job restart in a large simulation, 16 of them
        per worker (sent as two records where the sink takes them); the others are emitted
        with a dict display, not keyword arguments (an eighth of a microsecond each); the
        clock is read without the property and the event is made positionally, or not at
        all for a sink that takes its parts (``emit_parts``: the simulator's report)."""
        clock = self._clock
        now = (clock if clock is not None else self.clock).now()
        self.last_event_time = now
        parts = self._parts
        if parts is not None:
            parts.emit_parts(now, self._node, kind, self._worker_group.spec.role, rank, fields)
            return
        self._events.emit(
            AgentEvent(now, self._node, kind, self._worker_group.spec.role, rank, fields)
        )

    def _group_sink(self) -> Callable[[WorkerEvents], None] | None:
        """Where to send a group of workers' events as one record, or ``None`` to emit
        them one by one through :meth:`_emit_fields`.

        A record goes only to a sink that takes records (its ``emit_group``), and only
        while :meth:`_emit_fields` is this class's own: a subclass (or an instance) that
        overrides it observes every event, so it gets each per-worker event one by one, as
        before records existed.  Per group, not per worker: the bound method's
        ``__func__`` is compared, which also sees an override set on the instance."""
        if getattr(self._emit_fields, "__func__", None) is not _BASE_EMIT_FIELDS:
            return None
        take: Callable[[WorkerEvents], None] | None = getattr(self._events, "emit_group", None)
        return take

    def _emit_group(
        self,
        take: Callable[[WorkerEvents], None],
        kind: str,
        ranks: list[int],
        keys: tuple[str, ...],
        shared: dict[str, Any],
        columns: dict[str, list[Any]],
    ) -> None:
        """Emit ``kind`` for the workers of ``ranks`` as one record: what one
        :meth:`_emit_fields` call per worker would emit, at this instant (``keys``: each
        event's field order; ``shared``: the values common to all; ``columns``: one value
        per worker)."""
        if not ranks:
            return
        clock = self._clock
        now = (clock if clock is not None else self.clock).now()
        self.last_event_time = now
        role = self._worker_group.spec.role
        parts = self._parts
        if parts is not None:  # a sink that takes parts: no record made (see _emit_fields)
            parts.emit_group_parts(now, self._node, kind, role, ranks, keys, shared, columns)
            return
        take(WorkerEvents.unchecked(now, self._node, kind, role, ranks, keys, shared, columns))

    # -- the synchronous API (real mode) ------------------------------------------------
    def run(self, role: str = DEFAULT_ROLE) -> RunResult | None:
        """Run the agent to the end on a fresh event loop (real mode)."""
        self._refuse_torch_hooks()
        from elastic.metrics.api import ConfiguredMetricHandler
        from elastic.real.clock import AsyncioClock, run_sync

        if not self._metrics_handler_given:
            # torch's agent reports to the handlers set with metrics.configure()
            self.metrics.handler = ConfiguredMetricHandler()

        async def main() -> RunResult | None:
            if self._clock is None:
                self._clock = AsyncioClock()
            return await self.run_async(role)

        result: RunResult | None = run_sync(main())
        return result

    def _refuse_torch_hooks(self) -> None:
        """Raise ``TypeError`` if this agent's class overrides a torch hook it cannot run."""
        refusal = torch_hook_refusal(type(self))
        if refusal is not None:
            raise TypeError(refusal)

    # -- torch's agent-level status events (launch_agent records them) -----------------------
    def get_event_succeeded(self) -> Event:
        """torch's ``SUCCEEDED`` event of this agent (source ``AGENT``)."""
        return self._agent_status_event("SUCCEEDED", None)

    def get_event_failed(self) -> Event:
        """torch's ``FAILED`` event of this agent; ``raw_error`` is the traceback of the
        exception being handled (call it in an ``except`` block)."""
        import traceback

        return self._agent_status_event("FAILED", traceback.format_exc())

    def _agent_status_event(self, state: str, raw_error: str | None) -> Event:
        from elastic.events.api import Event, EventSource

        wg = self._worker_group
        spec = wg.spec
        detail = {
            "group_world_size": wg.group_world_size,
            "entry_point": spec.get_entrypoint_name(),
        }
        metadata: dict[str, str | int | float | bool | None] = {
            "run_id": spec.rdzv_handler.get_run_id(),
            "global_rank": None,
            "group_rank": wg.group_rank,
            "worker_id": None,
            "role": spec.role,
            "hostname": _get_fq_hostname(),
            "state": state,
            "total_run_time": self._total_execution_time,
            "rdzv_backend": spec.rdzv_handler.get_backend(),
            "raw_error": raw_error,
            "metadata": json.dumps(detail),
            "agent_restarts": self.restart_count,
            "duration_ms": None,
        }
        return Event(kinds.WORKER_STATUS + state, EventSource.AGENT, metadata=metadata)

    # -- the agent loop ---------------------------------------------------------------------
    async def run_async(self, role: str = DEFAULT_ROLE) -> RunResult | None:
        """Run the agent; ``None`` when this node exits gracefully from the rendezvous."""
        self._refuse_torch_hooks()
        start = self.clock.now()
        spec = self._worker_group.spec
        # a torch-style synchronous handler runs in threads (real) or is refused (sim)
        spec.rdzv_handler.bind_clock(self.clock, spec.monitor_interval)
        self._emit(kinds.AGENT_START, max_restarts=spec.max_restarts)
        result: RunResult | None = None
        try:
            result = await self._invoke_run(role)
            return result
        except RendezvousGracefulExitError:
            self._emit(kinds.AGENT_GRACEFUL_EXIT)
            return None
        except WorkerStartRefused as e:
            self.refused_start = str(e)
            self._worker_group.state = WorkerState.FAILED
            result = RunResult(state=WorkerState.FAILED, failures={-1: str(e)})
            return result
        except RendezvousClosedError:
            # another node ended the job while this one was between groups
            self._emit(kinds.AGENT_RENDEZVOUS_CLOSED)
            self._worker_group.state = WorkerState.FAILED
            result = RunResult(state=WorkerState.FAILED)
            return result
        except RendezvousError as e:
            # torch lets a rendezvous timeout/connection/state error escape run(); so do we,
            # after recording that this agent ended FAILED and why
            self._emit(kinds.AGENT_RENDEZVOUS_ERROR, error=f"{type(e).__name__}: {e}")
            self._worker_group.state = WorkerState.FAILED
            result = RunResult(state=WorkerState.FAILED)
            raise
        finally:
            await self._stop_group(kinds.STOP_SHUTDOWN)
            self._total_execution_time = int(self.clock.now() - start)
            if result is not None:
                self._record_metrics(result)
            self._emit(
                kinds.AGENT_FINISH,
                state=result.state.value if result is not None else "EXITED",
                restarts=self.restart_count,
                rounds=self._rounds,
            )

    async def _invoke_run(self, role: str) -> RunResult:
        """The driver: await an outcome, ask :func:`~._decide.decide`, apply the decision."""
        wg = self._worker_group
        await self._initialize_workers(wg)
        while True:
            assert wg.state != WorkerState.INIT, "the worker group is still INIT"
            group = self._group
            assert group is not None
            outcome = await self._wait_first(wg, group)
            self.metrics.put(f"workers.{role}.remaining_restarts", self._remaining_restarts)
            d = decide(wg.state, outcome, self._remaining_restarts)
            if d.state is not None:
                wg.state = d.state
                self.metrics.put(f"workers.{role}.{d.state.name.lower()}", 1)
            if d.notice is not None:
                self._emit_fields(d.notice, None, {"reason": d.detail})
            if d.action is GroupAction.DETACH:
                # the rendezvous is closed for good: only the workers' exits or a
                # health verdict can end this group now
                self._detached = True
                continue
            if d.action is GroupAction.RESTART:
                self._remaining_restarts = d.remaining
                if not self._restart_is_own():
                    await self._restart_workers(wg, d.reason, detail=d.detail)
                    continue
                # _restart_workers and _initialize_workers, inlined while neither is
                # overridden: every resumption of the agent in the next rendezvous (ten
                # per node per job restart) passes through each frame of its await chain
                await self._stop_for_restart(wg, d.reason, d.detail)
                try:
                    await self._check_pre_start()
                    await self._rendezvous(wg)
                    await self._start_workers(wg)
                except BaseException:
                    self._drop_membership_watch()
                    raise
                continue
            if d.action is GroupAction.SUCCEED:
                result = self._succeeded(wg, outcome)
                self._emit_worker_finals(result)
                await self._exit_barrier()
                # the group is stopped in run_async's finally: every worker exited, but
                # a daemon a worker left behind must not outlive the agent
                return result
            return await self._finish(wg, group, outcome, d)

    async def _finish(
        self, wg: WorkerGroup, group: RunningGroup, outcome: Outcome, d: Decision
    ) -> RunResult:
        """Apply FAIL or CLOSE: stop the group and return the run's result."""
        assert d.action in (GroupAction.FAIL, GroupAction.CLOSE) and d.result is not None, d
        await self._stop_group(d.reason)
        if d.action is GroupAction.CLOSE:
            self._emit(kinds.AGENT_RENDEZVOUS_CLOSED)
        by_local = {w.local_rank: w for w in wg.workers}
        exits = {ex.local_rank: ex for ex in outcome.exits}
        result = RunResult(
            state=d.result, failures={by_local[lr].global_rank: exits[lr] for lr in d.failed}
        )
        if d.failed:
            await self._add_other_failures(wg, group, result)
        wg.state = WorkerState.FAILED
        return self._with_failure_records(result)

    @staticmethod
    def _succeeded(wg: WorkerGroup, outcome: Outcome) -> RunResult:
        """The return values by global rank, in rank order (as torch's, whatever order
        the workers ended in: programs iterate over them)."""
        values = {ex.local_rank: ex.return_value for ex in outcome.exits}
        ranked = sorted(wg.workers, key=lambda w: w.global_rank)
        return RunResult(
            state=WorkerState.SUCCEEDED,
            return_values={
                w.global_rank: values[w.local_rank] for w in ranked if w.local_rank in values
            },
        )

    async def _wait_first(self, wg: WorkerGroup, group: RunningGroup) -> Outcome:
        """Wait, event-driven, for the group outcome, a membership change or a health verdict."""
        clock = self.clock
        listen = getattr(group, "listen", None)
        take = getattr(group, "take_exit", None)
        taker: _ExitTaker | None = None
        outcome_task: Task[Outcome] | None = None
        first: Waitable
        if listen is not None and take is not None and self._outcome_is_own():
            # the group's exits are taken where a task waiting for them would have
            # resumed (ListenedGroup), instead of by a task spawned and, when the
            # membership or a health watch wins (three times in four), cancelled
            exits: dict[int, WorkerExit] = {}
            self._seen_exits = exits
            taker = _ExitTaker(self, take, listen, exits, wg, clock.event())
            taker()
            first = taker.done
        else:
            first = outcome_task = clock.spawn(self._group_outcome(wg, group), name="group-outcome")
        tasks: list[Task[Any]] = []
        watching = not self._detached
        if watching:
            tasks.append(
                self._membership_watch
                or clock.spawn(wg.spec.rdzv_handler.watch_async(), name="membership-watch")
            )
            self._membership_watch = None  # cancelled below with the others
        tasks += [
            clock.spawn(h.wait_unhealthy(wg), name=f"health-{i}")
            for i, h in enumerate(self._health_watches)
        ]
        try:
            idx, value = await clock.first(first, *tasks)
        finally:
            if taker is not None:
                taker.stop()
            elif outcome_task is not None:
                outcome_task.cancel()
            for t in tasks:
                t.cancel()
        if idx == 0:
            if type(value) is _Raised:
                raise value.error
            outcome: Outcome = value
            return outcome
        if idx == 1 and watching:
            reason = str(value)
            if reason == kinds.MEMBERSHIP_CLOSED and await self._a_peer_succeeded():
                reason = kinds.MEMBERSHIP_CLOSED_AFTER_SUCCESS
            return Outcome.membership(reason)
        return Outcome.health(str(value))

    async def _a_peer_succeeded(self) -> bool:
        """Whether an agent of this round has reached the exit barrier (its workers all
        succeeded): the fact that tells a rendezvous closed by a finishing job from one
        closed by a failed node (see ``GroupAction.DETACH``).  The barrier's count is in
        the round's store; a store that cannot answer within
        :data:`_CLOSED_READ_TIMEOUT` counts as no (a store hosted by the node that closed
        may be gone with it)."""
        store = self._store
        if store is None:
            return False
        try:
            raw = await self.clock.timeout(_CLOSED_READ_TIMEOUT, store.try_get(_EXIT_BARRIER_COUNT))
            return raw is not None and int(raw) > 0
        except Cancelled:
            raise
        except Exception:
            return False

    def _outcome_is_own(self) -> bool:
        """True while how the group's exits are taken is this class's own."""
        cls = type(self)
        return (
            cls._group_outcome is SimpleElasticAgent._group_outcome
            and cls._took is SimpleElasticAgent._took
        )

    async def _group_outcome(self, wg: WorkerGroup, group: RunningGroup) -> Outcome:
        """Every exit of the group until they settle it (a failure, or all exited)."""
        exits: dict[int, WorkerExit] = {}
        self._seen_exits = exits
        by_local = {w.local_rank: w for w in wg.workers}
        size = len(wg.workers)
        while True:
            outcome = self._took(await group.next_exit(), exits, by_local, size)
            if outcome is not None:
                return outcome

    def _took(
        self, ex: WorkerExit, exits: dict[int, WorkerExit], by_local: dict[int, Worker], size: int
    ) -> Outcome | None:
        """Take one exit of the group: the outcome once the exits settle it, else ``None``."""
        exits[ex.local_rank] = ex
        if ex.failed:
            self._emit_failed(by_local[ex.local_rank], ex)
        seen = tuple(exits.values())
        if settled(seen, size):
            # the exits themselves: a restart discards them, and only the result
            # returned gets the failure records (see _with_failure_records)
            return Outcome.of_exits(seen, size)
        return None

    def _emit_failed(self, w: Worker, ex: WorkerExit) -> None:
        self._emit(
            kinds.WORKER_FAILED,
            rank=w.global_rank,
            local_rank=ex.local_rank,
            exit_code=ex.exit_code,
            cause=ex.cause.value,
            worker_pid=ex.pid,
            attempt=self._attempt,
        )

    async def _add_other_failures(
        self, wg: WorkerGroup, group: RunningGroup, result: RunResult
    ) -> None:
        """Add to ``result`` every other worker of the stopped ``group`` that did not exit 0.

        torch's report lists every failed rank, root cause first, not only the exit that
        decided the outcome: workers of a job often fail together, and torch records the
        siblings its stop ended too (exit code -15, here with the cause "stopped by the
        agent").  The group is stopped, so every exit the agent has not taken is queued
        and ``next_exit`` returns at once.
        """
        by_local = {w.local_rank: w for w in wg.workers}
        for _ in range(len(by_local) - len(self._seen_exits)):
            ex = await group.next_exit()
            self._seen_exits[ex.local_rank] = ex
            w = by_local.get(ex.local_rank)
            if ex.failed and w is not None:
                if ex.cause is not ExitCause.STOPPED_BY_AGENT:
                    self._emit_failed(w, ex)
                result.failures.setdefault(w.global_rank, ex)

    def _failure(self, ex: WorkerExit) -> Any:
        """The failure record kept in ``RunResult.failures`` (a ProcessFailure in real mode)."""
        return ex

    def _with_failure_records(self, result: RunResult) -> RunResult:
        """``result`` with each failed worker's exit turned into its failure record.

        Done only for the result the agent returns: a restart has no use for the record,
        and making it (in real mode: reading the worker's error file, importing the report
        machinery) would sit between the failure and the restart.
        """
        result.failures = {
            r: self._failure(f) if isinstance(f, WorkerExit) else f
            for r, f in result.failures.items()
        }
        return result

    def _emit_worker_finals(self, result: RunResult) -> None:
        if result.state == WorkerState.SUCCEEDED:
            for w in self._worker_group.workers:
                self._emit(
                    kinds.WORKER_SUCCEEDED,
                    rank=w.global_rank,
                    local_rank=w.local_rank,
                    attempt=self._attempt,
                )

    # -- rendezvous, ranks, start, stop ----------------------------------------------------
    async def _initialize_workers(self, wg: WorkerGroup) -> None:
        try:
            await self._check_pre_start()
            await self._rendezvous(wg)
            await self._start_workers(wg)
        except BaseException:
            self._drop_membership_watch()
            raise

    async def _check_pre_start(self) -> None:
        """Raise :class:`WorkerStartRefused` if a pre-start check refuses this node.

        Checked before joining, not after: a node that cannot start its workers must not
        be in the round, or every other node forms it, starts, and forms another without
        it (issue 16: three rounds per GPU failure)."""
        refusal = await self._pre_start_refusal()
        if refusal is not None:
            self._emit(kinds.AGENT_REFUSED_START, reason=refusal)
            raise WorkerStartRefused(refusal)

    def _restart_is_own(self) -> bool:
        """True while neither restart hook is overridden (by the class or the instance)."""
        restart = getattr(self._restart_workers, "__func__", None)
        init = getattr(self._initialize_workers, "__func__", None)
        return restart is _BASE_RESTART and init is _BASE_INITIALIZE

    def _drop_membership_watch(self) -> None:
        task, self._membership_watch = self._membership_watch, None
        if task is not None:
            task.cancel()

    async def _pre_start_refusal(self) -> str | None:
        for check in self._pre_start_checks:
            verdict = await check()
            if verdict is not None:
                return verdict
        return None

    async def _rendezvous(self, wg: WorkerGroup) -> None:
        spec = wg.spec
        clock = self.clock
        # what this node publishes when it joins, so that a handler that can (the dynamic
        # rendezvous) returns its ranks with the round; torch's own handlers lack it
        member_info = getattr(spec.rdzv_handler, "set_member_info", None)
        if member_info is not None:
            member_info(spec.role, spec.local_world_size)
        while True:
            t0 = clock.now()
            info: RendezvousInfo = await spec.rdzv_handler.next_rendezvous_async()
            self._rounds += 1
            self._round = info.round
            self._emit_fields(
                kinds.RENDEZVOUS,
                None,
                {
                    "duration_ms": round((clock.now() - t0) * 1000, 3),
                    "round": info.round,
                    "group_rank": info.rank,
                    "group_world_size": info.world_size,
                },
            )
            t1 = clock.now()
            # The round's membership watch starts now: it guards the rank exchange, if
            # any (a member whose lease expires meanwhile ends the round, so nobody waits
            # for a dead member's role info) and is then the watch of the running group.
            watch = clock.spawn(spec.rdzv_handler.watch_async(), name="membership-watch")
            carried = getattr(info, "assignment", None)
            if isinstance(carried, AgentAssignment):
                # the round's result carries the ranks (its decider computed them from
                # every member's role and local world size): no store exchange
                assignment = carried
                self._drop_membership_watch()
                self._membership_watch = watch
                break
            try:
                got = await exchange_ranks_in_round(
                    clock,
                    spec.rdzv_handler,
                    info,
                    spec.role,
                    spec.local_world_size,
                    timeout=self._rank_exchange_timeout,
                    watch=watch,
                )
            except BaseException as e:
                watch.cancel()
                if not isinstance(e, TimeoutError):
                    raise
                # a peer of this round vanished before the exchange finished: next round
                self._rejoin(wg, Outcome.timeout())
                continue
            if isinstance(got, str):
                watch.cancel()
                self._rejoin(wg, Outcome.membership(got))
                continue
            assignment = got
            self._drop_membership_watch()
            self._membership_watch = watch
            break
        wg.store = info.store
        self._store = info.store
        wg.group_rank = info.rank
        wg.group_world_size = info.world_size
        wg.master_addr = spec.master_addr or info.bootstrap_store_info.master_addr
        wg.master_port = spec.master_port or info.bootstrap_store_info.master_port
        # the workers as one block, made only if read (WorkerGroup: eight per node per
        # job restart in a large simulation)
        wg._set_block(
            spec.local_world_size,
            assignment.base_global_rank,
            assignment.base_role_rank,
            assignment.world_size,
            assignment.role_world_size,
        )
        self._emit_fields(
            kinds.ASSIGN_WORKER_RANKS,
            None,
            {
                "duration_ms": round((clock.now() - t1) * 1000, 3),
                "group_rank": info.rank,
                "world_size": assignment.world_size,
                "base_global_rank": assignment.base_global_rank,
            },
        )

    def _rejoin(self, wg: WorkerGroup, outcome: Outcome) -> None:
        """Apply the decision for a round lost before its group started (REJOIN)."""
        d = decide(wg.state, outcome, self._remaining_restarts)
        assert d.action is GroupAction.REJOIN and d.notice is not None, d
        self._emit(d.notice, reason=d.detail)

    def worker_env(self, wg: WorkerGroup, worker: Worker) -> dict[str, str]:
        """The environment of one worker, exactly torch's variables (without inherited ones)."""
        return self._env_of(self._env_base(wg), wg, worker)

    def _env_base(self, wg: WorkerGroup) -> dict[str, str]:
        """What every worker of ``wg`` shares, in torch's key order (the per-worker keys
        hold a placeholder, so each worker's copy keeps the order: :meth:`_env_of`).

        Performance: a copy of the last one made while what it is made of is the same
        but the group rank (a membership change keeps the master, the sizes and the restart
        count), with the group rank set: not fifteen keys and eight strings again."""
        spec = wg.spec
        handler = spec.rdzv_handler
        key = (
            wg.group_world_size,
            wg.master_addr,
            wg.master_port,
            self.restart_count,
            spec.role,
            spec.local_world_size,
            spec.max_restarts,
            handler.get_run_id(),
            handler.use_agent_store,
        )
        last = self._last_env
        if last is not None and last[0] == key:
            env = last[1].copy()
            env["GROUP_RANK"] = str(wg.group_rank)  # (in its place: the key is there)
            return env
        env = {
            "LOCAL_RANK": "0",
            "RANK": "",
            "GROUP_RANK": str(wg.group_rank),
            "ROLE_RANK": "",
            "ROLE_NAME": spec.role,
            "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "WORLD_SIZE": "",
            "GROUP_WORLD_SIZE": str(wg.group_world_size),
            "ROLE_WORLD_SIZE": "",
            "MASTER_ADDR": str(wg.master_addr),
            "MASTER_PORT": str(wg.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
            "TORCHELASTIC_RUN_ID": key[7],
            "TORCHELASTIC_USE_AGENT_STORE": str(key[8]),
        }
        self._last_env = (key, env.copy())  # a copy of its own: the caller may change env
        return env

    def _env_of(self, base: dict[str, str], wg: WorkerGroup, worker: Worker) -> dict[str, str]:
        """One worker's environment: a copy of the group's ``base`` with its own ranks."""
        env = _env_from_base(
            base,
            worker.local_rank,
            worker.global_rank,
            worker.role_rank,
            worker.world_size,
            worker.role_world_size,
            wg.spec.virtual_local_rank,
        )
        for hook in self._env_hooks:
            hook(wg, worker, env)
        return env

    def _worker_envs(self, wg: WorkerGroup) -> list[dict[str, str]]:
        """Every worker's environment, in ``wg.workers``' order.

        Performance: the group's shared part is built once and copied per worker (the
        simulator starts eight workers per node per job restart); a subclass that
        overrides :meth:`worker_env` gets it called per worker, as before.  (Made lazily,
        when a port first reads one, they cost 1.3 % fewer instructions at 2,048 nodes x 1
        simulated day: not kept, as a port would then get a mapping that is not a dict.)
        """
        if type(self).worker_env is not SimpleElasticAgent.worker_env:
            return [self.worker_env(wg, w) for w in wg.workers]
        base = self._env_base(wg)
        return [self._env_of(base, wg, w) for w in wg.workers]

    def _envs_are_own(self) -> bool:
        """True when every worker's environment is this class's own (no env hook, no
        override of how it is made): then a group's launches may go as one record."""
        cls = type(self)
        return (
            not self._env_hooks
            and cls.worker_env is SimpleElasticAgent.worker_env
            and cls._worker_envs is SimpleElasticAgent._worker_envs
            and cls._env_of is SimpleElasticAgent._env_of
        )

    def _worker_args(self, spec: WorkerSpec, local_rank: int) -> tuple[Any, ...]:
        """``spec.args`` with ``${local_rank}`` replaced in every string argument."""
        return tuple(
            str(a).replace("${local_rank}", str(local_rank)) if isinstance(a, str) else a
            for a in spec.args
        )

    async def _start_workers(self, wg: WorkerGroup) -> None:
        spec = wg.spec
        entrypoint: Any = spec.entrypoint
        attempt, round_ = self._attempt, self._round
        # the arguments are the same for every worker unless one names its local rank
        shared: tuple[Any, ...] | None = None
        if not spec.args:
            shared = ()  # Performance: no generator per check (the common case)
        elif not any(isinstance(a, str) and "${local_rank}" in a for a in spec.args):
            shared = tuple(str(a) if isinstance(a, str) else a for a in spec.args)
        # the columns of the group: its launch record and its workers' START events
        local_ranks, global_ranks, role_ranks, world_sizes, role_world_sizes = wg._columns()
        port = self.workers_port
        start_group = getattr(port, "start_group", None)
        if start_group is not None and shared is not None and self._envs_are_own():
            # one record for the group (elastic.workers.GroupLaunch): each worker's
            # environment is made from it only if the port asks for the launches
            self._group = await start_group(
                GroupLaunch(
                    self._env_base(wg),
                    local_ranks,
                    global_ranks,
                    role_ranks,
                    world_sizes,
                    role_world_sizes,
                    spec.virtual_local_rank,
                    entrypoint,
                    shared,
                    attempt,
                    round_,
                )
            )
        else:
            launches = [
                WorkerLaunch(
                    w.local_rank,
                    w.global_rank,
                    env,
                    entrypoint,
                    shared if shared is not None else self._worker_args(spec, w.local_rank),
                    attempt,
                    round_,
                )
                for w, env in zip(wg.workers, self._worker_envs(wg), strict=True)
            ]
            self._group = await port.start(launches)
        pids = self._group.pids()
        group_rank = wg.group_rank
        take = self._group_sink()
        if take is not None:
            worker_pids = wg._set_ids(pids)
            self._emit_group(
                take,
                kinds.WORKER_START,
                global_ranks,
                _START_KEYS,
                {"group_rank": group_rank, "attempt": attempt},
                {
                    "local_rank": local_ranks,
                    "role_rank": role_ranks,
                    "world_size": world_sizes,
                    "worker_pid": worker_pids,
                },
            )
        else:
            emit = self._emit_fields
            for w in wg.workers:
                w.id = pids.get(w.local_rank)
                emit(
                    kinds.WORKER_START,
                    w.global_rank,
                    {
                        "local_rank": w.local_rank,
                        "role_rank": w.role_rank,
                        "world_size": w.world_size,
                        "group_rank": group_rank,
                        "worker_pid": w.id,
                        "attempt": attempt,
                    },
                )
        wg.state = WorkerState.HEALTHY
        self._emit_fields(
            kinds.AGENT_GROUP_STARTED,
            None,
            {
                "attempt": attempt,
                "group_rank": group_rank,
                "group_world_size": wg.group_world_size,
                "world_size": world_sizes[0] if world_sizes else 0,
                "ranks": list(global_ranks),
                "restart_count": self.restart_count,
            },
        )

    async def _stop_group(self, reason: str) -> None:
        group = self._group
        if group is None:
            return
        self._group = None
        try:
            exits = await group.stop(self._shutdown_timeout, self._death_sig)
        except Cancelled:
            raise
        wg, emit, attempt = self._worker_group, self._emit_fields, self._attempt
        take = self._group_sink()
        if take is not None:
            # Performance: the stop's exits as columns (elastic.workers.ExitList): no
            # record per worker made or read (eight per node per job restart)
            if isinstance(exits, ExitList):
                local_ranks, codes = exits.local_ranks, exits.exit_codes
            else:
                local_ranks = [ex.local_rank for ex in exits]
                codes = [ex.exit_code for ex in exits]
            self._emit_group(
                take,
                kinds.WORKER_TERMINATED,
                wg._global_ranks(local_ranks),
                _TERMINATED_KEYS,
                {"attempt": attempt},
                {"local_rank": local_ranks, "exit_code": codes},
            )
        else:
            workers = wg.workers
            for ex in exits:
                emit(
                    kinds.WORKER_TERMINATED,
                    workers[ex.local_rank].global_rank,
                    {"local_rank": ex.local_rank, "exit_code": ex.exit_code, "attempt": attempt},
                )
        emit(kinds.AGENT_GROUP_STOPPED, None, {"reason": reason, "attempt": attempt})

    async def _restart_workers(self, wg: WorkerGroup, reason: str, detail: str = "") -> None:
        await self._stop_for_restart(wg, reason, detail)
        await self._initialize_workers(wg)

    async def _stop_for_restart(self, wg: WorkerGroup, reason: str, detail: str) -> None:
        """A restart's first half: announce it and stop the group (next: a new round)."""
        self._emit_fields(
            kinds.AGENT_RESTART,
            None,
            {"reason": reason, "detail": detail, "remaining_restarts": self._remaining_restarts},
        )
        await self._stop_group(reason)
        wg.state = WorkerState.STOPPED
        self._attempt += 1

    async def _exit_barrier(self) -> None:
        """Wait for every agent of the round to succeed too (errors are logged, not raised)."""
        store = self._store
        wg = self._worker_group
        if store is None or not wg.group_world_size or wg.group_world_size <= 1:
            return
        self._in_exit_barrier = True
        t0 = self.clock.now()
        try:
            # torch's keys and values (elastic.utils.store.barrier): an agent of either
            # kind meets the other at this barrier
            n = await store.add(_EXIT_BARRIER_COUNT, 1)
            if n >= wg.group_world_size:
                await store.set(f"{_TERMINAL_STATE_SYNC_ID}/last_member", b"<val_ignored>")
            await store.get(f"{_TERMINAL_STATE_SYNC_ID}/last_member", self._exit_barrier_timeout)
            self._emit(kinds.AGENT_EXIT_BARRIER, duration_s=round(self.clock.now() - t0, 6))
        except Cancelled:
            raise
        except Exception as e:
            self._emit(kinds.AGENT_EXIT_BARRIER_ERROR, error=f"{type(e).__name__}: {e}")
        finally:
            self._in_exit_barrier = False

    # -- metrics ---------------------------------------------------------------------------
    def _record_metrics(self, group_results: RunResult) -> None:
        spec = self._worker_group.spec
        role = spec.role
        with_retries = self._remaining_restarts != spec.max_restarts
        failed = group_results.is_failed()
        self.metrics.put(f"workers.{role}.run_total", 1)
        self.metrics.put(
            f"workers.{role}.run_success_with_retries", int(not failed and with_retries)
        )
        self.metrics.put(
            f"workers.{role}.run_success_no_retries", int(not failed and not with_retries)
        )
        self.metrics.put(f"workers.{role}.run_failed_with_retries", int(failed and with_retries))
        self.metrics.put(f"workers.{role}.run_failed_no_retries", int(failed and not with_retries))
        flakiness = (
            100.0
            if failed
            else 100.0 - 100.0 * (self._remaining_restarts + 1) / (spec.max_restarts + 1)
        )
        self.metrics.put(f"workers.{role}.flakiness", int(flakiness))


_BASE_EMIT_FIELDS = SimpleElasticAgent._emit_fields
_BASE_RESTART = SimpleElasticAgent._restart_workers
_BASE_INITIALIZE = SimpleElasticAgent._initialize_workers
#: the fields of a worker's START and TERMINATED events, in the order they are emitted
_START_KEYS = ("local_rank", "role_rank", "world_size", "group_rank", "worker_pid", "attempt")
_TERMINATED_KEYS = ("local_rank", "exit_code", "attempt")


class _ExitTaker:
    """Takes a group's exits as ``_group_outcome`` does, each time the group says they can
    be seen (``ListenedGroup.listen``), until they settle it; then fires ``done`` with
    the outcome.  An object, not a closure: a closure that listens with itself is a
    reference cycle, and its agent would be freed only by a full collection."""

    __slots__ = (
        "_agent",
        "_by_local",
        "_cancel",
        "_exits",
        "_listen",
        "_size",
        "_take",
        "_wg",
        "done",
    )

    def __init__(
        self,
        agent: SimpleElasticAgent,
        take: Callable[[], WorkerExit | None],
        listen: Callable[[Callable[[], None]], Callable[[], None]],
        exits: dict[int, WorkerExit],
        wg: WorkerGroup,
        done: OneShot,
    ) -> None:
        self._agent = agent
        self._take = take
        self._listen = listen
        self._exits = exits
        # Performance: the workers (and a map of them by local rank) are made when the
        # first exit is taken (most groups are stopped for a restart before any of their
        # workers exits)
        self._wg = wg
        self._by_local: dict[int, Worker] | None = None
        self._size = wg._size()
        self._cancel: Callable[[], None] | None = None
        self.done = done

    def __call__(self) -> None:
        self._cancel = None
        take, took = self._take, self._agent._took
        try:
            while (ex := take()) is not None:
                by_local = self._by_local
                if by_local is None:
                    by_local = self._by_local = {w.local_rank: w for w in self._wg.workers}
                outcome = took(ex, self._exits, by_local, self._size)
                if outcome is not None:
                    self.done.set(outcome)
                    return
        except Exception as e:
            self.done.set(_Raised(e))
            return
        self._cancel = self._listen(self)

    def stop(self) -> None:
        """Listen no more (and hold no canceller, which holds this object)."""
        cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()


class _Raised:
    """What the group's outcome event carries when taking an exit raised: the error,
    raised in ``_wait_first`` as a failed outcome task's would be."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class WorkerStartRefused(ElasticError):
    """A pre-start check (e.g. GPU health) refused to start workers on this node."""
