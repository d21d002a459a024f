"""The invariant checkers fail on logs that break them (so their silence means something)."""

from __future__ import annotations

from elastic.events import AgentEvent
from sim.checks import (
    budget_kept,
    every_agent_ends,
    one_world_per_round,
    ranks_contiguous,
    stop_before_start,
)
from sim.run import simulate
from sim.scenario import load_scenario_text


def ev(t: float, node: object, kind: str, **fields: object) -> AgentEvent:
    return AgentEvent(t=t, node=node, kind=kind, fields=fields)  # type: ignore[arg-type]


def test_a_rank_handed_out_twice_is_caught() -> None:
    log = [
        ev(0, 0, "RENDEZVOUS", round=1, group_rank=0, group_world_size=2),
        ev(0, 1, "RENDEZVOUS", round=1, group_rank=0, group_world_size=2),
    ]
    assert one_world_per_round(log)


def test_global_ranks_with_a_gap_are_caught() -> None:
    log = [
        ev(0, 0, "RENDEZVOUS", round=1, group_rank=0, group_world_size=2),
        ev(0, 0, "agent.group_started", ranks=[0, 1], world_size=4),
        ev(0, 1, "RENDEZVOUS", round=1, group_rank=1, group_world_size=2),
        ev(0, 1, "agent.group_started", ranks=[3, 4], world_size=4),
        ev(1, "sim", "sim.world_running", round=1),
    ]
    assert ranks_contiguous(log)


def test_a_group_started_over_a_running_one_is_caught() -> None:
    log = [
        ev(0, 0, "agent.start"),
        ev(1, 0, "agent.group_started", ranks=[0], world_size=1),
        ev(2, 0, "agent.group_started", ranks=[0], world_size=1),
    ]
    assert stop_before_start(log)


def test_an_overspent_budget_is_caught() -> None:
    log = [ev(0, 0, "agent.start", max_restarts=1)] + [
        ev(i, 0, "agent.restart", reason="failure") for i in (1, 2)
    ]
    assert budget_kept(log)


def test_an_agent_that_never_finishes_is_caught() -> None:
    log = [ev(0, 0, "agent.start"), ev(1, "sim", "sim.end", reason="done")]
    assert every_agent_ends(log)


def test_a_real_run_passes_every_checker() -> None:
    sc = load_scenario_text(
        "name: x\ncluster: {nodes: 3, nproc_per_node: 2}\njob: {steps: 200, step_time: 1s}\n"
        "faults:\n  - {at: 50s, kind: worker_crash, node: 1, local_rank: 1}\n"
    )
    events = simulate(sc, keep_events=True).events
    for check in (
        one_world_per_round,
        ranks_contiguous,
        stop_before_start,
        budget_kept,
        every_agent_ends,
    ):
        assert check(events) == [], check.__name__
