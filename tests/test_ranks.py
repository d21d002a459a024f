"""Rank assignment: torch's worked example, properties over any agents, and the store exchange."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from elastic.agent.ranks import AgentAssignment, RoleInfo, assign_ranks, exchange_ranks
from elastic.clock import Clock
from elastic.memstore import MemoryStore
from sim.clock import SimClock
from sim.store import SimStoreHost
from tests.worlds import run_in


def test_torchs_worked_example() -> None:
    agents = [
        RoleInfo("ps", 0, 4),
        RoleInfo("trainer", 1, 1),
        RoleInfo("trainer", 2, 2),
        RoleInfo("trainer", 3, 3),
        RoleInfo("ps", 4, 5),
    ]
    got = assign_ranks(agents)
    lws = [a.local_world_size for a in agents]
    expect = [
        (range(0, 4), range(0, 4), 15, 9),
        (range(4, 5), range(0, 1), 15, 6),
        (range(5, 7), range(1, 3), 15, 6),
        (range(7, 10), range(3, 6), 15, 6),
        (range(10, 15), range(4, 9), 15, 9),
    ]
    for a, n, (g, r, w, rw) in zip(got, lws, expect, strict=True):
        assert a.global_ranks(n) == g
        assert a.role_ranks(n) == r
        assert a.world_size == w
        assert a.role_world_size == rw


agent_lists = st.lists(
    st.tuples(st.sampled_from(["ps", "trainer", "eval"]), st.integers(1, 16)),
    min_size=1,
    max_size=40,
).map(lambda xs: [RoleInfo(role, i, n) for i, (role, n) in enumerate(xs)])


@given(agent_lists, st.randoms(use_true_random=False))
def test_properties_of_any_assignment(agents: list[RoleInfo], rnd: random.Random) -> None:
    got = assign_ranks(agents)
    world = sum(a.local_world_size for a in agents)
    # global ranks are exactly 0..W-1, each once; blocks ascend and follow group-rank order
    flat = [g for a, r in zip(agents, got, strict=True) for g in r.global_ranks(a.local_world_size)]
    assert flat == list(range(world))
    assert all(r.world_size == world for r in got)
    # per role: role ranks are exactly 0..R-1 in group-rank order; role world is the sum
    for role in {a.role for a in agents}:
        members = [(a, r) for a, r in zip(agents, got, strict=True) if a.role == role]
        size = sum(a.local_world_size for a, _ in members)
        flat_role = [x for a, r in members for x in r.role_ranks(a.local_world_size)]
        assert flat_role == list(range(size))
        assert all(r.role_world_size == size for _, r in members)
    # the order in which agents publish does not matter
    shuffled = list(agents)
    rnd.shuffle(shuffled)
    assert assign_ranks(shuffled) == got


def test_group_ranks_with_a_gap_are_refused() -> None:
    try:
        assign_ranks([RoleInfo("a", 0, 1), RoleInfo("a", 2, 1)])
    except ValueError as e:
        assert "0..1" in str(e)
    else:
        raise AssertionError("a gap in group ranks was accepted")


async def _exchange_all(
    clock: Clock, agents: list[RoleInfo], latency_order: list[int]
) -> list[AgentAssignment]:
    store = MemoryStore(clock)
    results: dict[int, AgentAssignment] = {}

    async def one(a: RoleInfo, delay: float) -> None:
        await clock.sleep(delay)
        results[a.rank] = await exchange_ranks(
            store, a.rank, len(agents), a.role, a.local_world_size, timeout=60
        )

    tasks = [clock.spawn(one(a, 0.001 * latency_order[i])) for i, a in enumerate(agents)]
    for t in tasks:
        await t.join()
    return [results[i] for i in range(len(agents))]


@settings(max_examples=40, deadline=None)
@given(agent_lists, st.randoms(use_true_random=False))
def test_store_exchange_run_concurrently_in_the_simulator_gives_the_pure_answer(
    agents: list[RoleInfo], rnd: random.Random
) -> None:
    order = list(range(len(agents)))
    rnd.shuffle(order)  # agents publish in any order
    got = run_in("sim", lambda clock: _exchange_all(clock, agents, order))
    assert got == assign_ranks(agents)


def test_store_exchange_through_the_simulated_store_host_with_latency() -> None:
    agents = [RoleInfo("trainer", i, 8) for i in range(16)]
    clock = SimClock()
    host = SimStoreHost(clock, latency=0.002)
    out: dict[int, AgentAssignment] = {}

    async def one(a: RoleInfo) -> None:
        c = host.client(a.rank)
        out[a.rank] = await exchange_ranks(c, a.rank, 16, a.role, 8, timeout=10)

    for a in agents:
        clock.spawn(one(a))
    clock.env.run()
    assert [out[i] for i in range(16)] == assign_ranks(agents)
    assert host.store.stats.ops <= 16 * 3  # O(1) operations per agent
