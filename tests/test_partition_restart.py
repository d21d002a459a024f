"""A node booted (``restart_after``) while a ``network_partition`` cuts it off starts cut off:
its fresh store client inherits the cut until the heal (sim/inject.py, sim/world.py)."""

from __future__ import annotations

from typing import Any

from tests.two_nodes import two_node_events


def _node1_after(events: list[Any], t: float, kind: str) -> list[float]:
    return [e.t for e in events if e.node == 1 and e.kind == kind and e.t >= t]


def test_a_node_restarted_during_a_partition_reaches_the_store_only_after_the_heal() -> None:
    # node 1 crashes at 30 s and boots again at 40 s, inside the cut (35 s .. 135 s)
    events = two_node_events(
        [
            {"at": "30s", "kind": "node_crash", "node": 1, "restart_after": "10s"},
            {"at": "35s", "kind": "network_partition", "nodes": [1], "duration": "100s"},
        ]
    )
    assert [e.t for e in events if e.kind == "sim.node_restart"] == [40.0]
    (cut,) = [e.fields for e in events if e.kind == "sim.fault" and e.t == 35.0]
    assert cut["applied"] is True and cut["nodes"] == [1]
    # the new agent starts at once, but joins (a store round trip) only once healed
    assert _node1_after(events, 40.0, "agent.start") == [40.0]
    joined = _node1_after(events, 40.0, "RENDEZVOUS") + _node1_after(
        events, 40.0, "agent.group_started"
    )
    assert joined, "node 1 must rejoin after the heal"
    assert min(joined) >= 135.0


def test_a_node_restarted_after_the_heal_is_not_cut() -> None:
    events = two_node_events(
        [
            {"at": "30s", "kind": "node_crash", "node": 1, "restart_after": "50s"},
            {"at": "35s", "kind": "network_partition", "nodes": [1], "duration": "10s"},
        ]
    )
    joined = _node1_after(events, 80.0, "agent.group_started")
    assert joined and min(joined) < 135.0


def test_overlapping_partitions_heal_at_the_last_heal() -> None:
    # node 1 is cut by two partitions, 35..95 s and 60..160 s; crashed at 30 s and booted
    # at 40 s, its agent reaches the store only once both have healed (160 s), not at
    # the first heal (95 s)
    events = two_node_events(
        [
            {"at": "30s", "kind": "node_crash", "node": 1, "restart_after": "10s"},
            {"at": "35s", "kind": "network_partition", "nodes": [1], "duration": "60s"},
            {"at": "60s", "kind": "network_partition", "nodes": [1], "duration": "100s"},
        ]
    )
    joined = _node1_after(events, 40.0, "RENDEZVOUS") + _node1_after(
        events, 40.0, "agent.group_started"
    )
    assert joined, "node 1 must rejoin after the heals"
    assert min(joined) >= 160.0, min(joined)
