"""The fault handlers (sim/inject.py) and the parsing table (sim/scenario/model.py) cover the
same fault kinds, and each handler takes effect on a running cluster."""

from __future__ import annotations

from typing import Any

import pytest

from sim.inject import HANDLERS
from sim.scenario import FaultKind
from sim.scenario.model import KIND_FIELDS
from tests.two_nodes import two_node_events

# the smallest value of each field a fault kind can take, on the 2-node cluster below
_VALUES: dict[str, Any] = {
    "node": 1,
    "local_rank": 0,
    "exit_code": 1,
    "restart_after": "5s",
    "count": 1,
    "notice": "2s",
    "duration": "5s",
    "nodes": [1],
    "factor": 2.0,
}


def test_every_parsed_fault_kind_has_a_handler_and_every_handler_a_parsed_kind() -> None:
    assert set(HANDLERS) == set(KIND_FIELDS) == set(FaultKind)


def _run(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e.fields for e in two_node_events(faults, steps=200) if e.kind == "sim.fault"]


@pytest.mark.parametrize("kind", list(FaultKind), ids=[k.value for k in FaultKind])
def test_each_fault_kind_takes_effect_on_a_running_node(kind: FaultKind) -> None:
    fault: dict[str, Any] = {"at": "60s", "kind": kind.value}
    fault.update({name: _VALUES[name] for name in KIND_FIELDS[kind]})
    (logged,) = _run([fault])
    assert logged["fault"] == kind.value
    assert logged["applied"] is True


@pytest.mark.parametrize(
    "kind",
    [k for k in FaultKind if "node" in KIND_FIELDS[k] and k is not FaultKind.SLOW_NODE],
    ids=lambda k: k.value,
)
def test_a_fault_on_a_node_that_is_down_is_logged_as_not_applied(kind: FaultKind) -> None:
    crash = {"at": "30s", "kind": "node_crash", "node": 1}
    fault: dict[str, Any] = {"at": "60s", "kind": kind.value}
    fault.update({name: _VALUES[name] for name in KIND_FIELDS[kind]})
    first, second = _run([crash, fault])
    assert first["applied"] is True
    assert second["fault"] == kind.value and second["applied"] is False


def test_a_node_crash_on_a_node_already_down_schedules_no_second_restart() -> None:
    events = two_node_events(
        [
            {"at": "30s", "kind": "node_crash", "node": 1, "restart_after": "100s"},
            {"at": "60s", "kind": "node_crash", "node": 1, "restart_after": "5s"},
        ]
    )
    faults = [e.fields for e in events if e.kind == "sim.fault"]
    assert [f["applied"] for f in faults] == [True, False]
    assert faults[1]["why"] == "node 1 is down"
    assert "why" not in faults[0]
    # the one restart is the first crash's, at its time; none at 65 s from the no-op
    restarts = [e.t for e in events if e.kind == "sim.node_restart"]
    assert restarts == [130.0]


def test_a_restart_is_dropped_when_the_node_was_booted_since_it_was_scheduled() -> None:
    # the gpu repair boots node 1 at 60 s; it leaves at 90 s; the crash's restart (130 s)
    # must not bring back a node that a later fault removed
    events = two_node_events(
        [
            {"at": "10s", "kind": "gpu_error", "node": 1, "restart_after": "50s"},
            {"at": "30s", "kind": "node_crash", "node": 1, "restart_after": "100s"},
            {"at": "90s", "kind": "node_leave", "node": 1},
        ]
    )
    faults = [e.fields for e in events if e.kind == "sim.fault"]
    assert [f["applied"] for f in faults] == [True, True, True]
    restarts = [e.t for e in events if e.kind == "sim.node_restart"]
    assert restarts == [60.0]


@pytest.mark.parametrize("kind", ["node_leave", "preemption", "gpu_error"])
def test_a_fault_on_a_down_node_does_not_touch_its_next_incarnation(kind: str) -> None:
    # node 1 is down from 30 s to 130 s; the fault at 60 s (preemption: notice past the
    # restart) is a no-op, so the node booted at 130 s runs to the end of the job
    fault: dict[str, Any] = {"at": "60s", "kind": kind, "node": 1}
    if kind == "preemption":
        fault["notice"] = "100s"
    if kind == "gpu_error":
        fault["restart_after"] = "20s"
    events = two_node_events(
        [{"at": "30s", "kind": "node_crash", "node": 1, "restart_after": "100s"}, fault]
    )
    crash, noop = [e.fields for e in events if e.kind == "sim.fault"]
    assert crash["applied"] is True
    assert noop["applied"] is False and noop["why"] == "node 1 is down"
    assert [e.t for e in events if e.kind == "sim.node_restart"] == [130.0]
    node1 = [e for e in events if e.node == 1 and e.t > 130.0]
    kinds = {e.kind for e in node1}
    assert "torchelastic.worker.status.SUCCEEDED" in kinds
    assert "torchelastic.worker.status.TERMINATED" not in kinds
