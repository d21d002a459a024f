"""torch's synchronous ``SimpleElasticAgent`` driver, for subclasses written against it.

torch's ``SimpleElasticAgent`` is abstract: a subclass implements ``_start_workers``,
``_stop_workers``, ``_monitor_workers`` and ``_shutdown``, synchronously, and ``run()``
polls ``_monitor_workers`` every ``monitor_interval`` (seed 001, torch 2.13's
``_invoke_run``).  elastic's own agent is event-driven (DESIGN §2): it awaits worker exits
and membership changes and never calls ``_monitor_workers``.  A subclass that defines
``_monitor_workers`` is therefore one written for torch, and it gets torch's driver,
step for step:

* ``run``, ``_invoke_run``, ``_initialize_workers``, ``_restart_workers``,
  ``_rendezvous``, ``_assign_worker_ranks``, ``_exit_barrier``, the metric and event
  recorders (``_record_metrics``, ``_record_flakiness_metric``,
  ``_record_worker_events``, ``_construct_event``, ``record_duration``) and the
  master address helpers are torch's, synchronous, with torch's names, arguments,
  messages, metrics (``put_metric``, looked up in ``elastic.agent.server.api`` at each
  call, where torch's tests patch it) and events (``elastic.events.record``);
* what the subclass defines itself wins, as with any subclass; the rest comes from here
  (:func:`adopt`, called when the class is created);
* the rendezvous is the handler's synchronous ``next_rendezvous()`` and ranks are
  exchanged through the round's store as torch 2.13 does (``torchelastic/role_info/<r>``,
  ``torchelastic/assigned_ranks/<r>``).

The polling is the subclass's own hook's: ``_monitor_workers`` is a poll, so it can only
be polled.  Such an agent runs in real mode through ``run()``; the event-driven entry
points (``run_async``: the simulator, ``elastic run``) refuse it in one line.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import time
import traceback
from collections import defaultdict
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Any

from elastic.events import kinds

if TYPE_CHECKING:
    from elastic.agent.server.api import RunResult, Worker, WorkerGroup, WorkerSpec
    from elastic.events.api import Event, EventSource

__all__ = ["adopt", "is_torch_style"]

logger = logging.getLogger("elastic.agent.server.api")

#: the hook only a torch-style subclass defines (elastic's agent has no such method)
MARK = "_monitor_workers"
#: torch 2.13's key prefixes of the rank exchange
ROLE_INFO_PREFIX = "torchelastic/role_info/"
ASSIGNED_RANKS_PREFIX = "torchelastic/assigned_ranks/"
#: hooks torch's driver calls synchronously
_SYNC_HOOKS = (
    "_start_workers",
    "_stop_workers",
    "_monitor_workers",
    "_shutdown",
    "_rendezvous",
    "_initialize_workers",
    "_restart_workers",
    "_exit_barrier",
    "_assign_worker_ranks",
)


def _api() -> Any:
    from elastic.agent.server import api

    return api


def _put_metric(name: str, value: int) -> None:
    _api().put_metric(name, value)  # looked up now: torch's tests patch it there


def is_torch_style(cls: type) -> bool:
    """True for an agent class written against torch's synchronous hooks."""
    return bool(getattr(cls, "_torch_style", False))


class _TorchStyle:
    """torch 2.13's synchronous ``SimpleElasticAgent`` methods (``self`` is the agent)."""

    # -- running ---------------------------------------------------------------------
    def run(self: Any, role: str = "default") -> RunResult | None:
        _check_sync_hooks(type(self))
        start_time = time.monotonic()
        shutdown_called = False
        try:
            result = self._invoke_run(role)
            self._total_execution_time = int(time.monotonic() - start_time)
            self._record_metrics(result)
            self._record_worker_events(result)
            return result  # type: ignore[no-any-return]
        except _api().RendezvousGracefulExitError as e:
            logger.info("Rendezvous gracefully exited: %s", e)
            return None
        except _signal_exception() as e:
            logger.warning("Received %s death signal, shutting down workers", e.sigval)
            _call_shutdown(self, e.sigval)
            shutdown_called = True
            raise
        finally:
            if not shutdown_called:
                _call_shutdown(self)
            self._total_execution_time = int(time.monotonic() - start_time)

    async def run_async(self: Any, role: str = "default") -> RunResult | None:
        raise TypeError(
            f"{type(self).__qualname__} is written against torch's synchronous hooks (it "
            f"defines {MARK}): run it with run(), which drives them as torch does; the "
            "event-driven agent (the simulator, elastic run) cannot poll them"
        )

    def _invoke_run(self: Any, role: str = "default") -> RunResult:
        api = _api()
        wg = self._worker_group
        spec = wg.spec
        role = spec.role
        logger.info("[%s] starting workers for entrypoint: %s", role, spec.get_entrypoint_name())
        self._initialize_workers(wg)
        monitor_interval = spec.monitor_interval
        rdzv_handler = spec.rdzv_handler
        while True:
            assert wg.state != api.WorkerState.INIT
            time.sleep(monitor_interval)
            run_result = self._monitor_workers(wg)
            state = run_result.state
            wg.state = state
            _put_metric(f"workers.{role}.remaining_restarts", self._remaining_restarts)
            _put_metric(f"workers.{role}.{state.name.lower()}", 1)
            if state == api.WorkerState.SUCCEEDED:
                logger.info(
                    "[%s] worker group successfully finished. Waiting %s seconds for other "
                    "agents to finish.",
                    role,
                    self._exit_barrier_timeout,
                )
                self._exit_barrier()
                return run_result  # type: ignore[no-any-return]
            if state in {api.WorkerState.UNHEALTHY, api.WorkerState.FAILED}:
                if self._remaining_restarts > 0:
                    logger.info(
                        "[%s] Worker group %s. %s/%s attempts left; will restart worker group",
                        role,
                        state.name,
                        self._remaining_restarts,
                        spec.max_restarts,
                    )
                    self._remaining_restarts -= 1
                    self._restart_workers(wg)
                else:
                    self._stop_workers(wg)
                    wg.state = api.WorkerState.FAILED
                    return run_result  # type: ignore[no-any-return]
            elif state == api.WorkerState.HEALTHY:
                num_nodes_waiting = rdzv_handler.num_nodes_waiting()
                if num_nodes_waiting > 0:
                    logger.info(
                        "[%s] Detected %s new nodes from group_rank=%s; will restart worker group",
                        role,
                        num_nodes_waiting,
                        wg.group_rank,
                    )
                    self._restart_workers(wg)
            else:
                raise Exception(f"[{role}] Worker group in {state.name} state")

    def _initialize_workers(self: Any, worker_group: WorkerGroup) -> None:
        from elastic.events.api import EventSource, record

        role = worker_group.spec.role
        logger.info("[%s] Rendezvous'ing worker group", role)
        self._rendezvous(worker_group)
        logger.info("[%s] Starting worker group", role)
        worker_ids = self._start_workers(worker_group)
        for local_rank, w_id in worker_ids.items():
            worker = worker_group.workers[local_rank]
            worker.id = w_id
            record(self._construct_event("START", EventSource.WORKER, worker))
        worker_group.state = _api().WorkerState.HEALTHY

    def _restart_workers(self: Any, worker_group: WorkerGroup) -> None:
        role = worker_group.spec.role
        logger.info("[%s] Stopping worker group", role)
        if _takes_is_restart(type(self)._stop_workers):
            self._stop_workers(worker_group, is_restart=True)
        else:  # a subclass written before torch added the argument
            self._stop_workers(worker_group)
        worker_group.state = _api().WorkerState.STOPPED
        self._initialize_workers(worker_group)

    # -- the rendezvous ----------------------------------------------------------------
    def _rendezvous(self: Any, worker_group: WorkerGroup) -> None:
        spec = worker_group.spec
        with self.record_duration(kinds.RENDEZVOUS):
            rdzv_info = spec.rdzv_handler.next_rendezvous()
        store = rdzv_info.store
        group_rank = rdzv_info.rank
        group_world_size = rdzv_info.world_size
        # spec.master_addr/master_port override the rendezvous' (torch 2.13)
        master_addr = spec.master_addr or rdzv_info.bootstrap_store_info.master_addr
        master_port = spec.master_port or rdzv_info.bootstrap_store_info.master_port
        self._store = store
        with self.record_duration(kinds.ASSIGN_WORKER_RANKS):
            workers = self._assign_worker_ranks(store, group_rank, group_world_size, spec)
        worker_group.workers = workers
        worker_group.store = store
        worker_group.group_rank = group_rank
        worker_group.group_world_size = group_world_size
        worker_group.master_addr = master_addr
        worker_group.master_port = master_port
        restart_count = spec.max_restarts - self._remaining_restarts
        logger.info(
            "[%(role)s] Rendezvous complete for workers. Result:\n"
            "  restart_count=%(restart_count)s\n"
            "  master_addr=%(master_addr)s\n"
            "  master_port=%(master_port)s\n"
            "  group_rank=%(group_rank)s\n"
            "  group_world_size=%(group_world_size)s\n"
            "  local_ranks=%(local_ranks)s\n"
            "  role_ranks=%(role_ranks)s\n"
            "  global_ranks=%(global_ranks)s\n"
            "  role_world_sizes=%(role_world_sizes)s\n"
            "  global_world_sizes=%(global_world_sizes)s\n",
            {
                "role": spec.role,
                "restart_count": restart_count,
                "master_addr": master_addr,
                "master_port": master_port,
                "group_rank": group_rank,
                "group_world_size": group_world_size,
                "local_ranks": [w.local_rank for w in workers],
                "role_ranks": [w.role_rank for w in workers],
                "global_ranks": [w.global_rank for w in workers],
                "role_world_sizes": [w.role_world_size for w in workers],
                "global_world_sizes": [w.world_size for w in workers],
            },
        )

    def _assign_worker_ranks(
        self: Any, store: Any, group_rank: int, group_world_size: int, spec: WorkerSpec
    ) -> list[Worker]:
        """torch 2.13's exchange: every agent writes its role info; rank 0 (beside the
        store) computes every agent's ranks and writes them; each agent reads its own."""
        api = _api()
        info = api._RoleInstanceInfo(spec.role, group_rank, spec.local_world_size)
        store.set(f"{ROLE_INFO_PREFIX}{group_rank}", info.serialize())
        if group_rank == 0:
            raw = store.multi_get([f"{ROLE_INFO_PREFIX}{i}" for i in range(group_world_size)])
            infos = [api._RoleInstanceInfo.deserialize(b) for b in raw]
            role_sizes: defaultdict[str, int] = defaultdict(int)
            global_size = 0
            for ri in infos:
                role_sizes[ri.role] += ri.local_world_size
                global_size += ri.local_world_size
            base_global_rank = 0
            role_ranks: defaultdict[str, int] = defaultdict(int)
            keys: list[str] = []
            values: list[str] = []
            for i, ri in enumerate(infos):
                keys.append(f"{ASSIGNED_RANKS_PREFIX}{i}")
                values.append(
                    json.dumps(
                        [base_global_rank, global_size, role_ranks[ri.role], role_sizes[ri.role]]
                    )
                )
                base_global_rank += ri.local_world_size
                role_ranks[ri.role] += ri.local_world_size
            store.multi_set(keys, values)
        base_global_rank, global_world_size, base_role_rank, role_world_size = json.loads(
            store.get(f"{ASSIGNED_RANKS_PREFIX}{group_rank}")
        )
        return [
            api.Worker(
                local_rank=local_rank,
                global_rank=base_global_rank + local_rank,
                role_rank=base_role_rank + local_rank,
                world_size=global_world_size,
                role_world_size=role_world_size,
            )
            for local_rank in range(spec.local_world_size)
        ]

    @staticmethod
    def _set_master_addr_port(
        store: Any, master_addr: str | None, master_port: int | None, local_addr: str | None
    ) -> None:
        from elastic.utils.distributed import get_socket_with_port

        if master_port is None:
            sock = get_socket_with_port()
            with closing(sock):
                master_port = int(sock.getsockname()[1])
        if master_addr is None:
            master_addr = local_addr or _api()._get_fq_hostname()
        store.set("MASTER_ADDR", master_addr.encode(encoding="UTF-8"))
        store.set("MASTER_PORT", str(master_port).encode(encoding="UTF-8"))

    @staticmethod
    def _get_master_addr_port(store: Any) -> tuple[str, int]:
        master_addr = store.get("MASTER_ADDR").decode(encoding="UTF-8")
        master_port = int(store.get("MASTER_PORT").decode(encoding="UTF-8"))
        return master_addr, master_port

    def _exit_barrier(self: Any) -> None:
        from elastic.utils.store import barrier

        logger.info(
            "Local worker group finished (%s). Waiting %s seconds for other agents to finish",
            self._worker_group.state,
            self._exit_barrier_timeout,
        )
        start = time.time()
        try:
            barrier(
                store=self._store,
                world_size=self._worker_group.group_world_size,
                key_prefix=_api()._TERMINAL_STATE_SYNC_ID,
                barrier_timeout=self._exit_barrier_timeout,
            )
            logger.debug("Done waiting for other agents. Elapsed: %s seconds", time.time() - start)
        except _signal_exception() as e:
            logger.warning("Got termination signal: %s", e.sigval)
            raise
        except Exception:
            logger.exception(
                "Error waiting on exit barrier. Elapsed: %s seconds", time.time() - start
            )

    # -- metrics and events ----------------------------------------------------------
    def _record_metrics(self: Any, group_results: RunResult) -> None:
        is_failed = group_results.is_failed()
        self._record_flakiness_metric(is_failed)
        spec = self._worker_group.spec
        restarts_happened = self._remaining_restarts != spec.max_restarts
        _put_metric(f"workers.{spec.role}.run_total", 1)
        self._record_metric_with_condition(
            "run_success_with_retries", not is_failed and restarts_happened
        )
        self._record_metric_with_condition(
            "run_success_no_retries", not is_failed and not restarts_happened
        )
        self._record_metric_with_condition(
            "run_failed_with_retries", is_failed and restarts_happened
        )
        self._record_metric_with_condition(
            "run_failed_no_retries", is_failed and not restarts_happened
        )

    def _record_metric_with_condition(self: Any, metric_name: str, condition: bool) -> None:
        spec = self._worker_group.spec
        _put_metric(f"workers.{spec.role}.{metric_name}", 1 if condition else 0)

    def _record_flakiness_metric(self: Any, is_failed: bool = False) -> None:
        spec = self._worker_group.spec
        if is_failed:
            flakiness = 100.0
        else:
            flakiness = 100.0 - 100.0 * (self._remaining_restarts + 1) / (spec.max_restarts + 1)
        _put_metric(f"workers.{spec.role}.flakiness", int(flakiness))

    def _record_worker_events(self: Any, result: RunResult) -> None:
        from elastic.events.api import EventSource, record

        for worker in self._worker_group.workers:
            failure = result.failures.get(worker.global_rank)
            state = self._get_worker_state(worker, result)
            raw_error = json.dumps(getattr(failure, "error_file_data", None)) if failure else None
            record(self._construct_event(state, EventSource.WORKER, worker, raw_error))

    def _get_worker_state(self: Any, worker: Worker, result: RunResult) -> str:
        api = _api()
        failure = result.failures.get(worker.global_rank)
        if result.state in {api.WorkerState.UNHEALTHY, api.WorkerState.FAILED} and not failure:
            # the agent terminated the worker (SIGTERM)
            return "TERMINATED"
        if failure or worker.global_rank in result.return_values:
            return str(result.state.value)
        raise ValueError(f"Unknown worker: {worker.global_rank}")

    @contextmanager
    def record_duration(self: Any, state: str) -> Iterator[None]:
        from elastic.events.api import EventSource, record

        start = time.perf_counter()
        try:
            yield
        finally:
            duration_ms = (time.perf_counter() - start) * 1000
            record(self._construct_event(state, EventSource.AGENT, duration_ms=duration_ms))

    def _construct_event(
        self: Any,
        state: str,
        source: EventSource,
        worker: Worker | None = None,
        raw_error: str | None = None,
        duration_ms: float | None = None,
    ) -> Event:
        from elastic.events.api import Event

        wg = self._worker_group
        spec = wg.spec
        md: dict[str, Any] = {
            "group_world_size": wg.group_world_size,
            "entry_point": spec.get_entrypoint_name(),
        }
        if worker:
            # (torch's one-element tuples, kept: its event readers see the same JSON)
            md["local_rank"] = (worker.local_rank,)
            md["role_rank"] = (worker.role_rank,)
            md["role_world_size"] = (worker.role_world_size,)
            global_rank: int | None = worker.global_rank
            worker_id: str | None = str(worker.id)
        else:
            global_rank = None
            worker_id = None
        metadata: dict[str, Any] = {
            "run_id": spec.rdzv_handler.get_run_id(),
            "global_rank": global_rank,
            "group_rank": wg.group_rank,
            "worker_id": worker_id,
            "role": spec.role,
            "hostname": _api()._get_fq_hostname(),
            "state": state,
            "total_run_time": self._total_execution_time,
            "rdzv_backend": spec.rdzv_handler.get_backend(),
            "raw_error": raw_error,
            "metadata": json.dumps(md),
            "agent_restarts": spec.max_restarts - self._remaining_restarts,
            "duration_ms": duration_ms,
        }
        return Event(kinds.WORKER_STATUS + state, source=source, metadata=metadata)

    def get_event_failed(self: Any) -> Event:
        from elastic.events.api import EventSource

        return self._construct_event(  # type: ignore[no-any-return]
            state="FAILED", source=EventSource.AGENT, raw_error=traceback.format_exc()
        )

    def get_event_succeeded(self: Any) -> Event:
        from elastic.events.api import EventSource

        return self._construct_event(state="SUCCEEDED", source=EventSource.AGENT)  # type: ignore[no-any-return]


#: what a torch-style class gets (unless it, or a class between it and elastic's agent,
#: defines the name itself)
_PROVIDED = tuple(n for n in vars(_TorchStyle) if not n.startswith("__"))


def _signal_exception() -> type[Any]:
    from elastic.multiprocessing.api import SignalException

    return SignalException


def _call_shutdown(agent: Any, *death_sig: Any) -> None:
    """torch's ``_shutdown(death_sig, timeout=shutdown_timeout)``; a subclass's
    ``_shutdown`` written without ``timeout`` (older torch's) is called without it."""
    if _takes(type(agent)._shutdown, "timeout"):
        agent._shutdown(*death_sig, timeout=agent._shutdown_timeout)
    else:
        agent._shutdown(*death_sig)


@functools.lru_cache(maxsize=256)
def _takes(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@functools.lru_cache(maxsize=256)
def _takes_is_restart(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return "is_restart" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _check_sync_hooks(cls: type) -> None:
    """torch's driver calls its hooks synchronously: refuse, in one line, a hook that is a
    coroutine function (an async hook of elastic's agent inherited, or written so)."""
    for name in _SYNC_HOOKS:
        fn = getattr(cls, name, None)
        if fn is not None and inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"{cls.__qualname__}.{name} is a coroutine function, but {cls.__qualname__} "
                f"defines {MARK} and so runs under torch's synchronous driver, which calls "
                f"{name} synchronously: make it a plain method (torch's signature)"
            )


def adopt(cls: type, base: type) -> None:
    """Give ``cls`` torch's synchronous driver if it defines ``_monitor_workers`` (and no
    torch-style class above it already has it).  ``base`` is elastic's agent class: the
    names ``cls`` or a class between the two define are left alone."""
    if is_torch_style(cls) or vars(cls).get("_torch_local_base"):
        return  # (LocalElasticAgent itself defines torch's hooks for the driver)
    if any(vars(klass).get("_torch_local_base") for klass in cls.__mro__[1:]):
        # a LocalElasticAgent subclass: torch's LocalElasticAgent hooks come with the driver
        from elastic.agent.server._torch_local import adopt_local

        adopt_local(cls)
        return
    if getattr(cls, MARK, None) is None:
        return
    own: set[str] = set()
    for klass in cls.__mro__:
        if klass is base:
            break
        own.update(vars(klass))
    for name in _PROVIDED:
        if name not in own:
            setattr(cls, name, vars(_TorchStyle)[name])
    cls._torch_style = True  # type: ignore[attr-defined]
