"""The agent's cheaper paths give exactly what the general ones give (issue 16 item 1):

* a group started from one :class:`~elastic.workers.GroupLaunch` record (a port with
  ``start_group``) yields the launches, environments included, of the per-worker path;
* a group whose exits are taken by a listener (``ListenedGroup``: the simulator's) gives
  the event log of the group-outcome task that a group without ``listen`` gets;
* a restart run inline in ``_invoke_run`` gives the log of ``_restart_workers``, and an
  overridden ``_restart_workers`` or ``_initialize_workers`` is still called;
* ``WorkerEvents.unchecked`` makes the record the checked constructor makes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

from elastic.agent.server.api import SimpleElasticAgent, Worker, WorkerGroup, WorkerSpec
from elastic.events import WorkerEvents
from elastic.workers import GroupLaunch, WorkerLaunch
from sim import world as sim_world
from sim.run import simulate
from sim.scenario import load_scenario
from sim.workers import SimGroup, SimWorkers

ROOT = Path(__file__).resolve().parent.parent
# scenarios with worker failures, hangs, node crashes, joins and graceful leaves
SCENARIOS = [
    "worker_crash_restarts.yaml",
    "worker_hang_timer.yaml",
    "membership_joins_leaves_crashes.yaml",
    "multinode_graceful_leave.yaml",
    "budget_exhausted.yaml",
    "clean_run.yaml",
]


def _log_hash(name: str, seed: int | None = None) -> str:
    sc = load_scenario(ROOT / "scenarios" / name)
    result = simulate(sc, seed=seed, keep_events=True)
    h = hashlib.sha256()
    for e in result.events:
        h.update(e.to_json().encode())
    return h.hexdigest()


@pytest.mark.parametrize("name", SCENARIOS)
def test_listened_group_gives_the_log_of_the_group_outcome_task(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _log_hash(name, seed=7)
    monkeypatch.delattr(SimGroup, "listen")
    assert _log_hash(name, seed=7) == fast


@pytest.mark.parametrize("name", SCENARIOS)
def test_group_launch_record_gives_the_log_of_per_worker_launches(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _log_hash(name)
    monkeypatch.delattr(SimWorkers, "start_group")
    assert _log_hash(name) == fast


@pytest.mark.parametrize("name", SCENARIOS[:3])
def test_inline_restart_gives_the_log_of_restart_workers(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _log_hash(name)
    calls: list[str] = []

    class Overriding(SimpleElasticAgent):
        async def _restart_workers(self, wg: WorkerGroup, reason: str, detail: str = "") -> None:
            calls.append(reason)
            await super()._restart_workers(wg, reason, detail)

    monkeypatch.setattr(sim_world, "SimpleElasticAgent", Overriding)
    assert _log_hash(name) == fast
    assert calls  # the override was called for every restart


def test_an_overridden_initialize_workers_is_called_at_every_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    class Overriding(SimpleElasticAgent):
        async def _initialize_workers(self, wg: WorkerGroup) -> None:
            calls.append(self._attempt)
            await super()._initialize_workers(wg)

    monkeypatch.setattr(sim_world, "SimpleElasticAgent", Overriding)
    report = simulate(load_scenario(ROOT / "scenarios" / "worker_crash_restarts.yaml")).report
    assert report["restarts"]
    assert max(calls) >= 1  # called again after the first start


class _Handler:
    use_agent_store = False

    def get_run_id(self) -> str:
        return "job"


class _Group:
    def pids(self) -> dict[int, int]:
        return {}


class _Port:
    """Records what the agent hands it, by either path."""

    def __init__(self, records: bool) -> None:
        self.launches: list[WorkerLaunch] = []
        self.record: GroupLaunch | None = None
        if not records:
            self.start_group = None

    async def start(self, launches: Sequence[WorkerLaunch]) -> _Group:
        self.launches = list(launches)
        return _Group()

    async def start_group(self, group: GroupLaunch) -> _Group:  # type: ignore[misc]
        self.record = group
        self.launches = group.launches()
        return _Group()


class _Clock:
    def now(self) -> float:
        return 0.0


def _started(records: bool, virtual: bool) -> _Port:
    spec = WorkerSpec(
        role="trainer",
        local_world_size=3,
        rdzv_handler=_Handler(),  # type: ignore[arg-type]
        entrypoint="train.py",
        args=("--lr", 3, "x"),
        virtual_local_rank=virtual,
    )
    port = _Port(records)
    agent = SimpleElasticAgent(spec, clock=_Clock(), workers=port)  # type: ignore[arg-type]
    wg = agent.get_worker_group()
    wg.group_rank, wg.group_world_size = 1, 4
    wg.master_addr, wg.master_port = "node0", 29500
    wg.workers = [Worker(r, 3 + r, 13 + r, 12, 24) for r in range(3)]
    coro: Coroutine[Any, Any, None] = agent._start_workers(wg)
    with pytest.raises(StopIteration):
        coro.send(None)
    return port


@pytest.mark.parametrize("virtual", [False, True])
def test_a_group_launch_record_expands_to_the_per_worker_launches(virtual: bool) -> None:
    by_record, one_by_one = _started(True, virtual), _started(False, virtual)
    assert by_record.record is not None and len(by_record.record) == 3
    assert by_record.launches == one_by_one.launches
    for a, b in zip(by_record.launches, one_by_one.launches, strict=True):
        assert list(a.env) == list(b.env)  # torch's order
    assert len({id(ln.env) for ln in by_record.launches}) == 3  # a dict of its own each


def test_a_group_launch_refuses_columns_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="one per worker"):
        GroupLaunch({}, [0, 1], [0], [0, 1], [2, 2], [2, 2], False, "train.py")


def test_unchecked_worker_events_equal_the_checked_record() -> None:
    args = (
        1.5,
        3,
        "torchelastic.worker.status.START",
        "trainer",
        [8, 9],
        ("local_rank", "attempt"),
        {"attempt": 2},
        {"local_rank": [0, 1]},
    )
    checked = WorkerEvents(*args)  # type: ignore[arg-type]
    unchecked = WorkerEvents.unchecked(*args)  # type: ignore[arg-type]
    assert unchecked == checked
    assert [e.to_json() for e in unchecked.events()] == [e.to_json() for e in checked.events()]


def test_the_env_base_made_again_equals_a_fresh_one() -> None:
    """``_env_base`` copies its last env while only the group rank changed: each env it
    gives equals (keys in order) the one a fresh agent makes, whatever changed, and what a
    caller does to one does not reach the next."""

    def agent_at(rank: int, world: int, addr: str, port: int, remaining: int) -> Any:
        spec = WorkerSpec(
            role="trainer",
            local_world_size=3,
            rdzv_handler=_Handler(),  # type: ignore[arg-type]
            entrypoint="train.py",
            max_restarts=5,
        )
        agent = SimpleElasticAgent(spec, clock=_Clock())  # type: ignore[arg-type]
        agent._remaining_restarts = remaining
        wg = agent.get_worker_group()
        wg.group_rank, wg.group_world_size, wg.master_addr, wg.master_port = rank, world, addr, port
        return agent

    def items(env: dict[str, str]) -> list[tuple[str, str]]:
        return list(env.items())

    steps = [
        (1, 4, "node0", 29500, 5),
        (2, 4, "node0", 29500, 5),  # the group rank only: a copy
        (2, 4, "node0", 29500, 5),
        (0, 3, "node0", 29500, 5),
        (0, 3, "node2", 29501, 5),
        (0, 3, "node2", 29501, 4),  # a restart spent
        (3, 3, "node2", 29501, 4),
    ]
    agent = agent_at(*steps[0])
    wg = agent.get_worker_group()
    for rank, world, addr, port, remaining in steps:
        wg.group_rank, wg.group_world_size, wg.master_addr, wg.master_port = rank, world, addr, port
        agent._remaining_restarts = remaining
        fresh = agent_at(rank, world, addr, port, remaining)
        want = items(fresh._env_base(fresh.get_worker_group()))
        got = agent._env_base(wg)
        assert items(got) == want
        got["GROUP_RANK"], got["EXTRA"] = "x", "y"  # the caller's own
    wg.master_addr = "node9"
    assert agent._env_base(wg)["MASTER_ADDR"] == "node9"
    assert "EXTRA" not in agent._env_base(wg)
