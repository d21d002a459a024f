"""The environment and launches the agent gives its workers (elastic/agent/server/api.py):
exactly torch's variables, in torch's order, per worker; the group's shared part built once
(``_worker_envs``) gives the same dicts as ``worker_env`` per worker; a subclass's
``worker_env`` and every env hook still apply; ``${local_rank}`` in an argument is each
worker's own."""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any

import pytest

from elastic.agent.server.api import SimpleElasticAgent, Worker, WorkerGroup, WorkerSpec
from elastic.workers import WorkerLaunch

TORCH_KEYS = [
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
]


class _Handler:
    """What worker_env reads of a rendezvous handler."""

    use_agent_store = True

    def get_run_id(self) -> str:
        return "job-7"


class _Clock:
    def now(self) -> float:
        return 0.0


class _Group:
    def __init__(self, launches: Sequence[WorkerLaunch]) -> None:
        self.launches = list(launches)

    def pids(self) -> dict[int, int]:
        return {ln.local_rank: 100 + ln.local_rank for ln in self.launches}


class _Port:
    def __init__(self) -> None:
        self.group: _Group | None = None

    async def start(self, launches: Sequence[WorkerLaunch]) -> _Group:
        self.group = _Group(launches)
        return self.group


def _agent(
    virtual: bool = False, args: tuple[Any, ...] = (), hooks: Any = None
) -> tuple[SimpleElasticAgent, WorkerGroup, _Port]:
    spec = WorkerSpec(
        role="trainer",
        local_world_size=3,
        rdzv_handler=_Handler(),  # type: ignore[arg-type]
        entrypoint="train.py",
        args=args,
        max_restarts=5,
        virtual_local_rank=virtual,
    )
    port = _Port()
    agent = SimpleElasticAgent(spec, clock=_Clock(), workers=port, env_hooks=hooks)  # type: ignore[arg-type]
    agent._remaining_restarts = 3  # two restarts spent
    wg = agent.get_worker_group()
    wg.group_rank, wg.group_world_size = 1, 4
    wg.master_addr, wg.master_port = "node0", 29500
    wg.workers = [Worker(r, 3 + r, 13 + r, 12, 24) for r in range(3)]
    return agent, wg, port


def _torch_env(w: Worker, virtual: bool) -> dict[str, str]:
    """torch's table for the agent and group of :func:`_agent`, written out."""
    return {
        "LOCAL_RANK": "0" if virtual else str(w.local_rank),
        "RANK": str(w.global_rank),
        "GROUP_RANK": "1",
        "ROLE_RANK": str(w.role_rank),
        "ROLE_NAME": "trainer",
        "LOCAL_WORLD_SIZE": "3",
        "WORLD_SIZE": "12",
        "GROUP_WORLD_SIZE": "4",
        "ROLE_WORLD_SIZE": "24",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "5",
        "TORCHELASTIC_RUN_ID": "job-7",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def _run(coro: Coroutine[Any, Any, None]) -> None:
    with pytest.raises(StopIteration):
        coro.send(None)


@pytest.mark.parametrize("virtual", [False, True])
def test_each_worker_gets_exactly_torchs_variables_in_torchs_order(virtual: bool) -> None:
    agent, wg, _ = _agent(virtual)
    envs = agent._worker_envs(wg)
    for w, env in zip(wg.workers, envs, strict=True):
        assert env == _torch_env(w, virtual)
        assert list(env) == TORCH_KEYS
        one = agent.worker_env(wg, w)
        assert one == env and list(one) == TORCH_KEYS
    assert len({id(e) for e in envs}) == len(envs)  # a dict of its own per worker


def test_env_hooks_see_each_workers_own_dict_after_torchs_variables() -> None:
    seen: list[tuple[int, str]] = []

    def hook(wg: WorkerGroup, w: Worker, env: dict[str, str]) -> None:
        seen.append((w.local_rank, env["RANK"]))
        env["CUDA_VISIBLE_DEVICES"] = str(w.local_rank)

    agent, wg, _ = _agent(hooks=[hook])
    envs = agent._worker_envs(wg)
    assert seen == [(0, "3"), (1, "4"), (2, "5")]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2"]
    assert [list(e) for e in envs] == [[*TORCH_KEYS, "CUDA_VISIBLE_DEVICES"]] * 3


def test_a_subclass_worker_env_is_what_the_workers_get() -> None:
    class Custom(SimpleElasticAgent):
        def worker_env(self, wg: WorkerGroup, worker: Worker) -> dict[str, str]:
            return {**super().worker_env(wg, worker), "MINE": str(worker.local_rank)}

    _, wg, port = _agent()
    agent = Custom(wg.spec, clock=_Clock(), workers=port)  # type: ignore[arg-type]
    agent._worker_group = wg
    _run(agent._start_workers(wg))
    assert port.group is not None
    assert [dict(ln.env)["MINE"] for ln in port.group.launches] == ["0", "1", "2"]


def test_launches_carry_the_env_and_each_workers_own_arguments() -> None:
    agent, wg, port = _agent(args=("--rank=${local_rank}", 7, "plain"))
    _run(agent._start_workers(wg))
    assert port.group is not None
    launches = port.group.launches
    assert [ln.args for ln in launches] == [(f"--rank={r}", 7, "plain") for r in range(3)]
    assert [dict(ln.env) for ln in launches] == [_torch_env(w, False) for w in wg.workers]
    assert [(ln.local_rank, ln.global_rank) for ln in launches] == [(0, 3), (1, 4), (2, 5)]
    assert [w.id for w in wg.workers] == [100, 101, 102]

    agent, wg, port = _agent(args=("plain", 7))
    _run(agent._start_workers(wg))
    assert port.group is not None
    assert [ln.args for ln in port.group.launches] == [("plain", 7)] * 3
