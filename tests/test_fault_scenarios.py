"""Each advertised fault kind has a scenario in scenarios/, and the scenarios of the store
and network faults show the fault model of sim/store.py in the agents' own events: nothing
reaches a node cut off from the store, and nobody learns of a death while the store is down.
(The ``expect:`` of each file, derived in its comments, is checked by test_scenarios_run.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic.events import AgentEvent
from sim.run import simulate
from sim.scenario import FaultKind, load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


def _events(name: str) -> list[AgentEvent]:
    return simulate(load_scenario(SCENARIOS / f"{name}.yaml"), keep_events=True).events


def _agent_events(evs: list[AgentEvent], nodes: set[int], lo: float, hi: float) -> list[str]:
    return [f"{e.t:.3f} {e.node} {e.kind}" for e in evs if e.node in nodes and lo < e.t < hi]


def test_every_fault_kind_is_exercised_by_a_scenario_file() -> None:
    used = {f.kind for p in SCENARIOS.glob("*.yaml") for f in load_scenario(p).faults}
    assert set(FaultKind) - used == set()


@pytest.mark.parametrize(
    ("name", "outage"),
    [("store_outage_shorter_than_lease", 10.0), ("store_outage_longer_than_lease", 120.0)],
)
def test_nobody_learns_of_a_death_while_the_store_is_down_nor_before_a_full_ttl_after(
    name: str, outage: float
) -> None:
    evs = _events(name)
    crash = 1800.0
    seen = min(e.t for e in evs if e.kind == "agent.membership_change")
    # the lease (15 s) expires 15 s after the store returns, and the watch answers then
    assert crash + outage + 15.0 <= seen < crash + outage + 15.1
    # the first outage, with nobody dead, changed nothing
    assert _agent_events(evs, {0, 1, 2, 3}, 599.0, 601.0 + outage) == []


def test_a_cut_off_node_hears_nothing_until_the_link_heals() -> None:
    evs = _events("network_partition_minority_node")
    assert _agent_events(evs, {3}, 1800.0, 2100.0) == []
    after = [e for e in evs if e.node == 3 and e.t >= 2100.0]
    assert after[0].kind == "agent.membership_change"
    # the others learnt of its loss from its lease, on the store's side, 15 s after the
    # last renewal that reached the store (every 5 s from its grant just after 0 s: 1795)
    others = [e.t for e in evs if e.kind == "agent.membership_change" and e.node != 3]
    assert 1810.0 <= min(others) < 1810.1


def test_the_majority_cut_off_from_the_store_and_the_lone_store_side_node_both_wait() -> None:
    evs = _events("network_partition_store_side")
    assert _agent_events(evs, {1, 2, 3}, 1800.0, 2100.0) == []
    # node 0 saw the others' leases expire, but one node is below min_nodes: no round
    assert [e for e in evs if e.kind == "RENDEZVOUS" and 1800.0 < e.t < 2100.0] == []
    lost = [e.t for e in evs if e.node == 0 and e.kind == "agent.membership_change"]
    assert 1810.0 <= lost[0] < 1810.1  # 15 s after their last renewals, at 1795
