"""The fault handlers (sim/inject.py) and the parsing table (sim/scenario/model.py) cover the
same fault kinds, and each handler takes effect on a running cluster."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sim.inject import HANDLERS
from sim.run import simulate
from sim.scenario import FaultKind, load_scenario_text
from sim.scenario.model import KIND_FIELDS

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
    text = yaml.safe_dump(
        {
            "cluster": {"nodes": 2, "nproc_per_node": 2},
            "job": {"steps": 200, "step_time": "1s", "startup_time": "1s"},
            "rendezvous": {"min_nodes": 1, "max_nodes": 3},
            "agent": {"max_restarts": 10},
            "until": "2h",
            "faults": faults,
        }
    )
    events = simulate(load_scenario_text(text), keep_events=True).events
    return [e.fields for e in events if e.kind == "sim.fault"]


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
