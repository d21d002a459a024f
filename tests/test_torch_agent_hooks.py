"""A ``SimpleElasticAgent`` subclass written against torch's synchronous hooks runs under
torch's driver (``elastic/agent/server/_torch_style.py``), as torch's own agent tests
exercise it: the same calls, counts, states, metrics and events."""

from __future__ import annotations

import asyncio
import inspect
import json
import signal
import uuid
from multiprocessing.pool import ThreadPool
from typing import Any
from unittest.mock import call, patch

import pytest

import elastic.rendezvous.registry as rdzv_registry
from elastic.agent.server.api import (
    RunResult,
    SimpleElasticAgent,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
    _get_fq_hostname,
    _RoleInstanceInfo,
)
from elastic.events.api import EventSource
from elastic.memstore import MemoryStore
from elastic.multiprocessing import SignalException
from elastic.multiprocessing.errors import ProcessFailure
from elastic.real.clock import AsyncioClock
from elastic.real.loop_thread import LoopThread
from elastic.rendezvous import RendezvousHandler, RendezvousParameters
from elastic.rendezvous.api import RendezvousGracefulExitError, SyncStore
from elastic.utils.distributed import get_free_port

pytestmark = pytest.mark.timeout(60)


def do_nothing() -> None:
    pass


class TorchAgent(SimpleElasticAgent):
    """torch's test agent: fake workers whose ids are their global ranks."""

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(spec)
        self.stops = 0
        self.starts = 0
        self.shutdowns: list[Any] = []

    def _stop_workers(self, worker_group: WorkerGroup, is_restart: bool = False) -> None:
        worker_group.group_rank = None
        worker_group.group_world_size = None
        self.stops += 1

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:  # type: ignore[override]
        self.starts += 1
        return {w.local_rank: w.global_rank for w in worker_group.workers}

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        raise NotImplementedError("patched in each test")

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM) -> None:
        self.shutdowns.append(death_sig)


def result(state: WorkerState) -> RunResult:
    if state == WorkerState.SUCCEEDED:
        return RunResult(state=state, return_values={0: 0}, failures={})
    if state in {WorkerState.UNHEALTHY, WorkerState.FAILED}:
        failure = ProcessFailure(local_rank=0, pid=999, exitcode=1, error_file="<none>")
        return RunResult(state=state, return_values={}, failures={0: failure})
    return RunResult(state=state)


def spec(
    max_restarts: int = 1,
    role: str = "test_trainer",
    local_world_size: int = 8,
    local_addr: str | None = None,
) -> WorkerSpec:
    endpoint = f"{local_addr or '127.0.0.1'}:{get_free_port()}"
    params = RendezvousParameters(
        backend="static",
        endpoint=endpoint,
        run_id=str(uuid.uuid4().int),
        min_nodes=1,
        max_nodes=1,
        rank=0,
    )
    return WorkerSpec(
        role=role,
        local_world_size=local_world_size,
        entrypoint=do_nothing,
        args=(),
        rdzv_handler=rdzv_registry.get_rendezvous_handler(params),
        max_restarts=max_restarts,
        monitor_interval=0.01,
        local_addr=local_addr,
    )


def test_a_healthy_group_that_succeeds_spends_no_restart() -> None:
    agent = TorchAgent(spec(max_restarts=10))
    states = [WorkerState.HEALTHY, WorkerState.HEALTHY, WorkerState.SUCCEEDED]
    with (
        patch.object(TorchAgent, "_monitor_workers", side_effect=[result(s) for s in states]),
        patch.object(TorchAgent, "_record_worker_events") as events,
    ):
        got = agent.run()
    assert got is not None and got.state == WorkerState.SUCCEEDED
    assert agent._remaining_restarts == 10 and agent.starts == 1
    events.assert_called_once_with(got)
    assert agent.shutdowns == [signal.SIGTERM]  # torch's run() always shuts down once


@pytest.mark.parametrize("state", [WorkerState.FAILED, WorkerState.UNHEALTHY])
def test_a_failing_group_is_restarted_until_the_restarts_run_out(state: WorkerState) -> None:
    agent = TorchAgent(spec(max_restarts=3))
    with patch.object(TorchAgent, "_monitor_workers", return_value=result(state)) as monitor:
        got = agent.run()
    assert got is not None and got.state == state  # the last monitor's result, as torch
    assert agent.get_worker_group().state == WorkerState.FAILED
    assert agent._remaining_restarts == 0
    assert monitor.call_count == 4  # one per restart, and the last attempt's
    assert (agent.starts, agent.stops) == (4, 4)  # three restarts, then the final stop


def test_nodes_waiting_restart_a_healthy_group_without_spending_a_restart() -> None:
    agent = TorchAgent(spec(max_restarts=1))
    states = [WorkerState.HEALTHY] * 3 + [WorkerState.SUCCEEDED]
    with (
        patch.object(TorchAgent, "_monitor_workers", side_effect=[result(s) for s in states]),
        patch.object(RendezvousHandler, "num_nodes_waiting", side_effect=[1, 1, 0]),
        patch.object(TorchAgent, "_record_worker_events"),
    ):
        got = agent.run()
    assert got is not None and agent.get_worker_group().state == WorkerState.SUCCEEDED
    assert agent.starts == 3 and agent._remaining_restarts == 1


def test_an_unknown_state_ends_the_run_with_an_exception() -> None:
    agent = TorchAgent(spec(max_restarts=100))
    with (
        patch.object(TorchAgent, "_monitor_workers", return_value=result(WorkerState.UNKNOWN)) as m,
        pytest.raises(Exception, match=r"\[test_trainer\] Worker group in UNKNOWN state"),
    ):
        agent.run()
    assert agent.get_worker_group().state == WorkerState.UNKNOWN
    assert m.call_count == 1 and agent._remaining_restarts == 100


def test_a_failed_initialization_leaves_the_group_init_and_shuts_down_once() -> None:
    agent = TorchAgent(spec())
    with (
        patch.object(TorchAgent, "_initialize_workers", side_effect=RuntimeError("no")),
        pytest.raises(RuntimeError, match="no"),
    ):
        agent.run()
    assert agent.get_worker_group().state == WorkerState.INIT
    assert agent.shutdowns == [signal.SIGTERM]


def test_a_death_signal_shuts_down_with_that_signal_and_only_once() -> None:
    agent = TorchAgent(spec(max_restarts=0))
    boom = SignalException("signal exception", sigval=signal.SIGINT)
    with (
        patch.object(TorchAgent, "_invoke_run", side_effect=boom),
        pytest.raises(SignalException),
    ):
        agent.run()
    assert agent.shutdowns == [signal.SIGINT]


def test_a_graceful_rendezvous_exit_returns_none() -> None:
    agent = TorchAgent(spec(max_restarts=0))
    with patch.object(TorchAgent, "_invoke_run", side_effect=RendezvousGracefulExitError()):
        assert agent.run() is None
    assert agent.shutdowns == [signal.SIGTERM]


def test_run_records_metrics_and_worker_events_after_invoke_run() -> None:
    agent = TorchAgent(spec())
    with (
        patch.object(TorchAgent, "_invoke_run") as invoke,
        patch.object(TorchAgent, "_record_metrics") as metrics,
        patch.object(TorchAgent, "_record_worker_events") as events,
    ):
        agent.run()
    invoke.assert_called_once_with("default")
    metrics.assert_called_once_with(invoke.return_value)
    events.assert_called_once_with(invoke.return_value)


# -- the synchronous hooks, called one by one ------------------------------------------


def test_rendezvous_called_synchronously_sets_ranks_and_the_master() -> None:
    hostname = _get_fq_hostname()
    s = spec(local_addr=hostname)
    agent = TorchAgent(s)
    wg = agent.get_worker_group()
    assert agent._rendezvous(wg) is None
    assert (wg.group_rank, wg.group_world_size) == (0, 1)
    assert wg.master_addr == hostname and wg.master_port is not None and wg.master_port > 0
    assert [w.global_rank for w in wg.workers] == list(range(8))
    assert {w.world_size for w in wg.workers} == {8} and {w.id for w in wg.workers} == {None}


def test_rendezvous_takes_the_spec_s_master_over_the_rendezvous() -> None:
    s = spec(local_addr="127.0.0.1")
    s.master_addr, s.master_port = "10.1.2.3", 4242
    agent = TorchAgent(s)
    wg = agent.get_worker_group()
    agent._rendezvous(wg)
    assert (wg.master_addr, wg.master_port) == ("10.1.2.3", 4242)


def test_initialize_then_restart_synchronously() -> None:
    agent = TorchAgent(spec())
    wg = agent.get_worker_group()
    agent._initialize_workers(wg)
    assert wg.state == WorkerState.HEALTHY
    assert [w.id for w in wg.workers] == [w.global_rank for w in wg.workers]
    for _ in range(3):
        agent._restart_workers(wg)
        assert wg.state == WorkerState.HEALTHY and wg.group_rank == 0
    assert (agent.starts, agent.stops) == (4, 3)


def test_a_stop_hook_without_torchs_later_is_restart_argument_still_works() -> None:
    class OldStyle(TorchAgent):
        def _stop_workers(self, worker_group: WorkerGroup) -> None:  # type: ignore[override]
            self.stops += 1

    agent = OldStyle(spec())
    agent._restart_workers(agent.get_worker_group())
    assert agent.stops == 1 and agent.get_worker_group().state == WorkerState.HEALTHY


def test_ranks_are_assigned_through_the_store_as_torch_does() -> None:
    """Five agents of two roles, in threads, over one store: torch's test's table."""
    infos = [
        _RoleInstanceInfo("parameter_server", 0, 4),
        _RoleInstanceInfo("trainer", 1, 1),
        _RoleInstanceInfo("trainer", 2, 2),
        _RoleInstanceInfo("trainer", 3, 3),
        _RoleInstanceInfo("parameter_server", 4, 5),
    ]
    loop = LoopThread(name="test-ranks")
    try:
        store = SyncStore(MemoryStore(AsyncioClock()), loop.run, timeout=30)

        def assign(info: _RoleInstanceInfo) -> list[tuple[int, ...]]:
            agent = TorchAgent(spec(role=info.role, local_world_size=info.local_world_size))
            workers = agent._assign_worker_ranks(
                store, info.rank, len(infos), agent._worker_group.spec
            )
            return [
                (w.local_rank, w.role_rank, w.global_rank, w.world_size, w.role_world_size)
                for w in workers
            ]

        with ThreadPool(len(infos)) as pool:
            out = pool.map(assign, infos)
    finally:
        loop.close()
    assert out == [
        [(0, 0, 0, 15, 9), (1, 1, 1, 15, 9), (2, 2, 2, 15, 9), (3, 3, 3, 15, 9)],
        [(0, 0, 4, 15, 6)],
        [(0, 1, 5, 15, 6), (1, 2, 6, 15, 6)],
        [(0, 3, 7, 15, 6), (1, 4, 8, 15, 6), (2, 5, 9, 15, 6)],
        [
            (0, 4, 10, 15, 9),
            (1, 5, 11, 15, 9),
            (2, 6, 12, 15, 9),
            (3, 7, 13, 15, 9),
            (4, 8, 14, 15, 9),
        ],
    ]
    assert all(isinstance(w, Worker) for w in TorchAgent(spec()).get_worker_group().workers)


# -- metrics and events ------------------------------------------------------------------


def test_flakiness_and_run_metrics_go_to_torchs_put_metric() -> None:
    agent = TorchAgent(spec(max_restarts=1))
    with patch("elastic.agent.server.api.put_metric") as put:
        agent._record_flakiness_metric()
        put.assert_called_with("workers.test_trainer.flakiness", 0)
        agent._worker_group.spec.max_restarts = 10
        agent._remaining_restarts = 3
        agent._record_flakiness_metric()
        put.assert_called_with("workers.test_trainer.flakiness", 63)
        agent._record_flakiness_metric(True)
        put.assert_called_with("workers.test_trainer.flakiness", 100)
        put.reset_mock()
        agent._record_metrics(RunResult(state=WorkerState.FAILED, failures={0: 0}))  # type: ignore[dict-item]
    put.assert_has_calls(
        [
            call("workers.test_trainer.run_total", 1),
            call("workers.test_trainer.run_success_with_retries", 0),
            call("workers.test_trainer.run_success_no_retries", 0),
            call("workers.test_trainer.run_failed_with_retries", 1),
            call("workers.test_trainer.run_failed_no_retries", 0),
        ],
        any_order=True,
    )


def test_events_carry_torchs_metadata() -> None:
    s = spec(max_restarts=4)
    agent = TorchAgent(s)
    agent._remaining_restarts = 2
    worker = agent._worker_group.workers[0]
    ev = agent._construct_event(state="SUCCEEDED", source=EventSource.WORKER, worker=worker)
    md = ev.metadata
    assert ev.name == "torchelastic.worker.status.SUCCEEDED" and ev.source == EventSource.WORKER
    assert (md["rdzv_backend"], md["state"], md["role"]) == ("static", "SUCCEEDED", s.role)
    assert md["agent_restarts"] == 2 and md["worker_id"] == "None"
    assert json.loads(str(md["metadata"]))["local_rank"] == [0]
    ok = agent.get_event_succeeded()
    assert ok.source == EventSource.AGENT and ok.metadata["state"] == "SUCCEEDED"
    with patch("elastic.events.api.record") as rec, agent.record_duration("RENDEZVOUS"):
        pass
    (recorded,), _ = rec.call_args
    assert recorded.name == "torchelastic.worker.status.RENDEZVOUS"
    assert recorded.metadata["duration_ms"] >= 0


# -- what stays refused, in one line ---------------------------------------------------


def test_the_event_driven_entry_point_refuses_a_torch_style_agent() -> None:
    agent = TorchAgent(spec())
    with pytest.raises(TypeError, match=r"TorchAgent is written against torch's synchronous"):
        asyncio.run(agent.run_async())


def test_an_async_hook_under_torchs_driver_is_refused_naming_it() -> None:
    class Mixed(TorchAgent):
        async def _exit_barrier(self) -> None:
            pass

    with pytest.raises(TypeError, match=r"Mixed\._exit_barrier is a coroutine function") as e:
        Mixed(spec()).run()
    assert "\n" not in str(e.value)


def test_a_subclass_of_a_torch_style_agent_keeps_the_driver_and_its_own_overrides() -> None:
    seen: list[str] = []

    class Child(TorchAgent):
        def _initialize_workers(self, worker_group: WorkerGroup) -> None:  # type: ignore[override]
            seen.append("mine")
            super()._initialize_workers(worker_group)  # torch's, which TorchAgent got

    agent = Child(spec(local_world_size=1))
    with patch.object(Child, "_monitor_workers", return_value=result(WorkerState.SUCCEEDED)):
        got = agent.run()
    assert got is not None and got.state == WorkerState.SUCCEEDED and seen == ["mine"]
    assert agent.get_worker_group().workers[0].id == 0


def test_the_exit_barrier_waits_on_the_round_s_store_as_torch_s_does() -> None:
    """One agent: the barrier (elastic.utils.store's, torch's keys) passes at once, and
    the store's timeout is the agent's exit_barrier_timeout only while it waits."""
    agent = TorchAgent(spec(local_world_size=1))
    wg = agent.get_worker_group()
    agent._rendezvous(wg)
    before = wg.store.timeout
    with patch("elastic.agent.server._torch_style.logger") as log:
        agent._exit_barrier()
    log.exception.assert_not_called()
    assert wg.store.timeout == before
    assert wg.store.get("torchelastic/agent/terminal_state/num_members") == b"1"


def test_elastic_s_own_agent_is_not_torch_style() -> None:
    from elastic.agent.server._torch_style import is_torch_style
    from elastic.agent.server.local_elastic_agent import LocalElasticAgent

    assert not is_torch_style(SimpleElasticAgent) and not is_torch_style(LocalElasticAgent)
    assert is_torch_style(TorchAgent)
    # elastic's own hooks stay coroutines: its event-driven agent is untouched
    assert inspect.iscoroutinefunction(LocalElasticAgent._rendezvous)


def test_run_gives_a_subclass_shutdown_the_configured_timeout() -> None:
    # torch's run() calls _shutdown(timeout=shutdown_timeout); a _shutdown written
    # without the parameter (TorchAgent's, older torch's) is called without it
    class WithTimeout(TorchAgent):
        def __init__(self, spec: WorkerSpec) -> None:
            super().__init__(spec)
            self._shutdown_timeout = 120
            self.timeouts: list[float] = []

        def _shutdown(  # type: ignore[override]
            self, death_sig: signal.Signals = signal.SIGTERM, timeout: float = 30
        ) -> None:
            self.shutdowns.append(death_sig)
            self.timeouts.append(timeout)

    agent = WithTimeout(spec())
    done = [result(WorkerState.SUCCEEDED)]
    with (
        patch.object(WithTimeout, "_monitor_workers", side_effect=done),
        patch.object(WithTimeout, "_record_worker_events"),
    ):
        agent.run()
    assert agent.shutdowns == [signal.SIGTERM] and agent.timeouts == [120]
