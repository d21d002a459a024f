"""``elastic real`` dispatches faults through one table keyed by the simulator's fault kinds
(sim/realrun.py HANDLERS, beside sim/inject.py HANDLERS), and a fault on a node that is
down is a no-op there too: logged once with why, no second restart, no late leave."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sim import realrun
from sim.inject import HANDLERS as SIM_HANDLERS
from sim.realrun import HANDLERS, REFUSED, refusal
from sim.scenario import load_scenario_text
from sim.scenario.model import Fault, FaultKind

SMALL = """
name: small
until: 1h
cluster: {nodes: 2, nproc_per_node: 1}
job: {steps: 60, step_time: 1s}
rendezvous: {min_nodes: 1, max_nodes: 3}
"""


def test_every_simulated_fault_kind_is_run_or_refused_by_name_in_real_mode() -> None:
    assert set(HANDLERS) | set(REFUSED) == set(SIM_HANDLERS)
    assert not set(HANDLERS) & set(REFUSED)


@pytest.mark.parametrize("kind", sorted(REFUSED, key=lambda k: k.value), ids=lambda k: k.value)
def test_a_refused_kind_is_refused_in_one_line_naming_it_and_why(kind: FaultKind) -> None:
    sc = load_scenario_text(SMALL)
    why = refusal(sc, [Fault(at=30.0, kind=kind, node=1)])
    assert why == f"fault {kind.value} at 30s: {REFUSED[kind]}"


class _Proc:
    """An agent process as the dispatcher sees it: already exited."""

    pid = -1

    def poll(self) -> int:
        return 0

    def send_signal(self, signum: int) -> None:
        raise AssertionError("no signal to a down node's agent")


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[int]]:
    sc = load_scenario_text(SMALL)
    run: Any = realrun._Run(
        sc,
        1.0,
        tmp_path,
        time.monotonic(),
        0,
        tmp_path / "model.json",
        store=None,
    )
    run.alive = {0: True, 1: False}  # node 1 crashed earlier
    run.incarnations = {0: 1, 1: 1}
    spawned: list[int] = []
    monkeypatch.setattr(run, "spawn_agent", lambda node: spawned.append(node))
    return run, spawned


@pytest.mark.parametrize(
    "fault",
    [
        Fault(at=60.0, kind=FaultKind.NODE_CRASH, node=1, restart_after=5.0),
        Fault(at=60.0, kind=FaultKind.NODE_LEAVE, node=1),
        Fault(at=60.0, kind=FaultKind.PREEMPTION, node=1, notice=100.0),
        Fault(at=60.0, kind=FaultKind.WORKER_CRASH, node=1, local_rank=0, exit_code=1),
    ],
    ids=lambda f: f.kind.value,
)
def test_a_fault_on_a_down_node_is_a_logged_no_op_in_real_mode(
    fault: Fault, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, spawned = _run(tmp_path, monkeypatch)
    realrun._apply(run, fault, 3)
    (event,) = run.events
    assert event.kind == "sim.fault"
    assert event.fields["fault"] == fault.kind.value and event.fields["index"] == 3
    assert event.fields["applied"] is False and event.fields["why"] == "node 1 is down"
    assert spawned == [] and run.pending_starts == 0  # no second restart
    assert run.actions == []  # nothing later: no restart, no leave after the notice


def test_a_node_crash_on_a_live_node_schedules_its_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, spawned = _run(tmp_path, monkeypatch)
    realrun._apply(run, Fault(at=60.0, kind=FaultKind.NODE_CRASH, node=0, restart_after=5.0), 0)
    (event,) = run.events
    assert event.fields["applied"] is True and "why" not in event.fields
    assert run.alive[0] is False
    assert spawned == [0] and run.pending_starts == 1 and len(run.actions) == 1


def test_a_real_restart_is_logged_on_its_node_as_the_simulator_logs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, spawned = _run(tmp_path, monkeypatch)
    opened: list[object] = []
    monkeypatch.setattr(run, "spawn_agent", lambda node: spawned.append(node) or f"agent {node}")
    monkeypatch.setattr(run, "open_gate", opened.append)
    realrun._apply(run, Fault(at=60.0, kind=FaultKind.NODE_CRASH, node=0, restart_after=5.0), 0)
    ((_, _, restart),) = run.actions
    restart()
    assert opened == ["agent 0"] and run.pending_starts == 0
    event = run.events[-1]
    assert (event.kind, event.node, event.fields) == ("sim.node_restart", 0, {})
