"""An event given as its parts (elastic/events ``PartsSink``, ``emit_parts``): an agent hands
a sink that has ``emit_parts`` each event's parts instead of an ``AgentEvent``, and what the
sink gets is exactly what ``emit`` would have got — same events, order, fields, times; a
subclass that overrides ``_emit_fields`` still sees every event; the simulator's report is
the same from parts as from events; a run's sinks take parts only when all of them do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elastic.events import AgentEvent, ListSink, NullSink, kinds, parts_sink
from sim.report import ReportSink, build_report
from sim.run import _RunSinks, simulate
from sim.scenario import load_scenario
from tests.test_report_fastpath import _state
from tests.test_worker_events import _agent, _plain, _start_and_stop, _Watching

ROOT = Path(__file__).resolve().parent.parent


class _Parts(ListSink):
    """A sink that takes parts: keeps each event made from them, and how it came."""

    def __init__(self) -> None:
        super().__init__()
        self.ways: list[str] = []

    def emit(self, event: AgentEvent) -> None:
        self.ways.append("event")
        super().emit(event)

    def emit_parts(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        rank: int | None,
        fields: Any,
    ) -> None:
        self.ways.append("parts")
        super().emit(AgentEvent(t, node, kind, role, rank, fields))


def _some_events(agent: Any, wg: Any) -> None:
    """A group start and stop (per-worker events one by one: neither sink takes records)
    and a few of the agent's own events."""
    agent._emit(kinds.AGENT_START, max_restarts=5)
    _start_and_stop(agent, wg)
    agent._emit_fields(kinds.AGENT_RESTART, None, {"reason": "failure", "detail": "x"})
    agent._emit(kinds.WORKER_FAILED, 7, exit_code=3)


def test_a_parts_sink_gets_exactly_the_events_a_plain_sink_gets() -> None:
    plain, parts = ListSink(), _Parts()
    for sink in (plain, parts):
        agent, wg = _agent(sink, workers=3, exit_order=[2, 0, 1])
        _some_events(agent, wg)
    assert len(plain.events) == 11
    assert _plain(parts.events) == _plain(plain.events)
    assert parts.ways == ["parts"] * len(plain.events)  # no AgentEvent was made for it


def test_an_overridden_emit_fields_sees_every_event_given_as_parts() -> None:
    parts = _Parts()
    agent, wg = _agent(parts, workers=2, cls=_Watching)
    assert isinstance(agent, _Watching)
    _some_events(agent, wg)
    assert agent.seen == [(e.kind, e.rank) for e in parts.events]
    assert len(agent.seen) == 9


def test_a_detached_agent_drops_every_event() -> None:
    parts = _Parts()
    agent, wg = _agent(parts, workers=2)
    agent.detach_events()
    _some_events(agent, wg)
    assert parts.events == []
    assert agent.last_event_time > 0  # the events were made (and dropped), not skipped


def test_which_sinks_take_parts() -> None:
    assert parts_sink(NullSink()) is not None
    assert parts_sink(ReportSink()) is not None
    assert parts_sink(ListSink()) is None
    report = ReportSink()
    alone = _RunSinks([report])
    assert alone.emit_parts == report.emit_parts
    # a second sink without emit_parts: events are made, and each sink gets them
    assert _RunSinks([report, ListSink()]).emit_parts is None
    assert _RunSinks([report, _Parts()]).emit_parts is None
    alone.close()
    assert alone.emit_parts is not None
    alone.emit_parts(1.0, 0, kinds.AGENT_START, "", None, {})  # dropped after the run
    assert report.count == 0


def test_the_reports_parts_and_events_give_the_same_state() -> None:
    events = simulate(
        load_scenario(ROOT / "scenarios" / "budget_exhausted.yaml"), keep_events=True
    ).events
    by_event, by_parts = ReportSink(), ReportSink()
    for e in events:
        by_event.emit(e)
        by_parts.emit_parts(e.t, e.node, e.kind, e.role, e.rank, e.fields)
        assert _state(by_parts) == _state(by_event), e
    assert by_parts.result() == by_event.result() == build_report(events)
    assert by_parts.result()["why"]  # the budget's cause line read the failure's parts


@pytest.mark.parametrize(
    "name",
    [
        "worker_crash_restarts.yaml",
        "node_crash_comes_back.yaml",
        "budget_exhausted.yaml",
        "worker_hang_heartbeat.yaml",
    ],
)
def test_a_simulated_runs_report_is_the_same_from_parts_or_events(name: str) -> None:
    scenario = load_scenario(ROOT / "scenarios" / name)
    a = simulate(scenario)  # the report is the only sink: the agents give parts
    b = simulate(scenario, keep_events=True)  # two sinks: the agents make events
    a.report.pop("wall_s")
    b.report.pop("wall_s")
    assert a.report == b.report
    assert a.report == {**build_report(b.events), "sim_events": a.report["sim_events"]}
