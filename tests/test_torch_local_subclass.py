"""A ``LocalElasticAgent`` subclass written against torch's synchronous hooks overrides
one hook and calls ``super()`` for the rest, as it would on torch's class
(``elastic/agent/server/_torch_local.py``): real worker processes, torch's polling
driver, torch's results.  Also ``PContext.wait(0)``, the one look torch's
``_monitor_workers`` makes."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import Mock, patch

import pytest

import elastic.rendezvous.registry as rdzv_registry
from elastic.agent.server._torch_local import TorchLocalElasticAgent
from elastic.agent.server._torch_style import is_torch_style
from elastic.agent.server.api import (
    RunResult,
    SimpleElasticAgent,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
    torch_hook_refusal,
)
from elastic.agent.server.local_elastic_agent import LocalElasticAgent
from elastic.multiprocessing import DefaultLogsSpecs, start_processes
from elastic.rendezvous import RendezvousParameters
from elastic.utils.distributed import get_free_port
from tests.leftovers import no_leftover_processes

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def leaves_no_process() -> Iterator[None]:
    with no_leftover_processes():
        yield


# -- worker functions (started by importable name in spawned processes) ----------------
def rank_times_ten() -> int:
    return int(os.environ["RANK"]) * 10


def fail_first_attempt(marker: str) -> int:
    """Exit 3 on the first attempt (no marker file yet), succeed after."""
    if not os.path.exists(marker):
        Path(marker).write_text("x")
        raise SystemExit(3)
    return int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def always_fail() -> None:
    raise SystemExit(7)


# -- the subclasses ----------------------------------------------------------------------
class MonitorHook(LocalElasticAgent):
    calls: list[str]

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        self.calls.append(f"monitor:{worker_group.state.name}")
        return super()._monitor_workers(worker_group)


class StopHook(LocalElasticAgent):
    calls: list[str]

    def _stop_workers(self, worker_group: WorkerGroup, is_restart: bool = False) -> None:
        self.calls.append("stop")
        super()._stop_workers(worker_group, is_restart)


class StartHook(LocalElasticAgent):
    calls: list[str]

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:  # type: ignore[override]
        pids: dict[int, Any] = super()._start_workers(worker_group)  # type: ignore[assignment]
        self.calls.append(f"start:{sorted(pids)}")
        return pids


class ShutdownHook(LocalElasticAgent):
    calls: list[str]

    def _shutdown(  # type: ignore[override]
        self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30
    ) -> None:
        self.calls.append(f"shutdown:{int(death_sig)}:{timeout}")
        super()._shutdown(death_sig, timeout)


def one_node_handler() -> Any:
    """A c10d handler of a one-node job that hosts its store on a free port."""
    params = RendezvousParameters(
        backend="c10d",
        endpoint=f"127.0.0.1:{get_free_port()}",
        run_id=uuid.uuid4().hex[:8],
        min_nodes=1,
        max_nodes=1,
        is_host=True,
    )
    return rdzv_registry.get_rendezvous_handler(params)


def make(
    cls: type[LocalElasticAgent],
    tmp_path: Path,
    entrypoint: Any,
    *args: Any,
    nproc: int = 2,
    max_restarts: int = 0,
) -> Any:
    spec = WorkerSpec(
        role="trainer",
        local_world_size=nproc,
        entrypoint=entrypoint,
        args=args,
        rdzv_handler=one_node_handler(),
        max_restarts=max_restarts,
        monitor_interval=0.05,
    )
    agent = cls(
        spec,
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
        start_method="spawn",
        exit_barrier_timeout=2,
        shutdown_timeout=5,
    )
    agent.calls = []
    return agent


def run(agent: Any) -> RunResult | None:
    try:
        result: RunResult | None = agent.run()
        return result
    finally:
        agent._worker_group.spec.rdzv_handler.shutdown()


@pytest.mark.parametrize("cls", [MonitorHook, StopHook, StartHook, ShutdownHook])
def test_a_direct_subclass_with_a_synchronous_hook_gets_torchs_local_agent(
    cls: type[LocalElasticAgent],
) -> None:
    assert cls.__bases__ == (TorchLocalElasticAgent,)
    assert cls.__mro__[2] is LocalElasticAgent


def test_an_overridden_monitor_sees_every_poll_and_the_results_by_global_rank(
    tmp_path: Path,
) -> None:
    agent = make(MonitorHook, tmp_path, rank_times_ten)
    result = run(agent)
    assert result is not None and result.state == WorkerState.SUCCEEDED
    assert result.return_values == {0: 0, 1: 10}
    assert agent.calls and set(agent.calls) == {"monitor:HEALTHY"}
    assert agent._pcontext is not None


def test_an_overridden_start_returns_the_pids_the_monitor_checks(tmp_path: Path) -> None:
    agent = make(StartHook, tmp_path, rank_times_ten, nproc=3)
    result = run(agent)
    assert result is not None and result.state == WorkerState.SUCCEEDED
    assert agent.calls == ["start:[0, 1, 2]"]
    assert result.return_values == {0: 0, 1: 10, 2: 20}


def test_a_failed_group_restarts_through_the_overridden_stop(tmp_path: Path) -> None:
    marker = str(tmp_path / "attempted")
    agent = make(StopHook, tmp_path, fail_first_attempt, marker, nproc=1, max_restarts=2)
    result = run(agent)
    assert result is not None and result.state == WorkerState.SUCCEEDED, result
    assert agent.calls == ["stop"]  # the restart's stop; a success stops nothing
    assert result.return_values == {0: 1}  # TORCHELASTIC_RESTART_COUNT of the 2nd attempt
    assert agent._remaining_restarts == 1


def test_restarts_used_up_fail_with_the_exit_code_and_a_shutdown_with_its_timeout(
    tmp_path: Path,
) -> None:
    agent = make(ShutdownHook, tmp_path, always_fail, nproc=2, max_restarts=1)
    result = run(agent)
    assert result is not None and result.state == WorkerState.FAILED
    assert set(result.failures) <= {0, 1} and result.failures
    assert {f.exitcode for f in result.failures.values()} == {7}
    # restart: _stop_workers -> _shutdown(); the final stop too; then run()'s own, with
    # the agent's shutdown timeout (torch 2.13's driver)
    assert agent.calls == ["shutdown:15:30", "shutdown:15:30", "shutdown:15:5"]


def test_a_class_between_it_and_local_elastic_agent_is_refused_naming_the_hook(
    tmp_path: Path,
) -> None:
    class Between(LocalElasticAgent):
        pass

    class Below(Between):
        def _stop_workers(self, worker_group: WorkerGroup, is_restart: bool = False) -> None:
            pass

    assert Below.__bases__ == (Between,)  # a user's intermediate class is never changed
    agent = make(Below, tmp_path, rank_times_ten, nproc=1)
    refusal = r"Below\._stop_workers.*direct subclass of LocalElasticAgent"
    with pytest.raises(TypeError, match=refusal):
        run(agent)


def test_wait_zero_looks_once_and_sees_an_exit_the_kernel_reported(tmp_path: Path) -> None:
    pc = start_processes(
        "r", rank_times_ten, {0: ()}, {0: {"RANK": "4"}}, DefaultLogsSpecs(log_dir=str(tmp_path))
    )
    try:
        deadline = time.monotonic() + 30
        looks = 0
        while (result := pc.wait(0)) is None:
            looks += 1
            assert time.monotonic() < deadline, "wait(0) never saw the exit"
            time.sleep(0.05)
        assert result.return_values == {0: 40}
        assert looks >= 1  # the first look came before the spawned worker could finish
    finally:
        pc.close()


class InvokeRunHook(LocalElasticAgent):
    calls: list[str]

    def _invoke_run(self, role: str = "default") -> RunResult:  # type: ignore[override]
        self.calls.append("invoke_run")
        result: RunResult = super()._invoke_run(role)  # type: ignore[assignment]
        return result


def test_an_overridden_invoke_run_wraps_torchs_loop(tmp_path: Path) -> None:
    agent = make(InvokeRunHook, tmp_path, rank_times_ten, nproc=1)
    result = run(agent)
    assert result is not None and result.state == WorkerState.SUCCEEDED
    assert result.return_values == {0: 0}
    assert agent.calls == ["invoke_run"]


def test_a_hook_patched_on_one_agent_runs_that_agent_under_torchs_driver(tmp_path: Path) -> None:
    # torch's local_elastic_agent_test (shutdown_called): start_processes and the
    # instance's _monitor_workers patched, the context closed once
    pcontext = Mock()
    pcontext.pids.return_value = {0: 0}
    started = "elastic.agent.server.local_elastic_agent.start_processes"
    with patch(started, return_value=pcontext) as start_processes:
        agent = make(LocalElasticAgent, tmp_path, rank_times_ten, nproc=1)
        with patch.object(agent, "_monitor_workers") as monitor:
            monitor.return_value = RunResult(state=WorkerState.SUCCEEDED, return_values={0: 0})
            result = run(agent)
    assert result is not None and result.state == WorkerState.SUCCEEDED
    start_processes.assert_called_once()
    pcontext.close.assert_called_once()


def test_elastics_own_local_agent_is_event_driven_and_not_refused() -> None:
    assert LocalElasticAgent.__bases__ == (SimpleElasticAgent,)
    assert not is_torch_style(LocalElasticAgent)
    assert torch_hook_refusal(LocalElasticAgent) is None


def test_a_replaced_store_barrier_is_called_at_the_exit_and_its_failure_is_not_the_jobs(
    tmp_path: Path,
) -> None:
    # torch's local_elastic_agent_test (barrier_failed): elastic.utils.store.barrier
    # patched to raise; the run still succeeds and the barrier was asked once
    with patch("elastic.utils.store.barrier", side_effect=RuntimeError("test error")) as b:
        agent = make(LocalElasticAgent, tmp_path, rank_times_ten, nproc=1)
        result = run(agent)
    assert result is not None and result.state == WorkerState.SUCCEEDED
    b.assert_called_once()
    kwargs = b.call_args.kwargs
    assert kwargs["world_size"] == 1 and kwargs["barrier_timeout"] == 2
    assert kwargs["key_prefix"] == "torchelastic/agent/terminal_state"


def test_a_wrapped_store_barrier_runs_over_the_rounds_store_from_its_thread(
    tmp_path: Path,
) -> None:
    from elastic.utils import store as store_util

    original = store_util.barrier
    seen: list[Any] = []

    def wrapped(**kwargs: Any) -> None:
        original(**kwargs)  # a real barrier: the store's add/set/wait from this thread
        seen.append(kwargs["store"].get("torchelastic/agent/terminal_state/last_member"))

    with patch("elastic.utils.store.barrier", wrapped):
        agent = make(LocalElasticAgent, tmp_path, rank_times_ten, nproc=1)
        result = run(agent)
    assert result is not None and result.state == WorkerState.SUCCEEDED
    assert len(seen) == 1 and seen[0]  # the barrier ran to its end on the round's store
