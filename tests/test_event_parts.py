"""Events and records given as their parts (elastic/events ``PartsSink``: ``emit_parts``,
``emit_group_parts``): an agent hands a sink that takes parts each event's, and each group
record's, parts instead of an ``AgentEvent`` or a ``WorkerEvents``, and what the sink gets
is exactly what ``emit`` and ``emit_group`` would have got — same events, order, fields,
times; a subclass that overrides ``_emit_fields`` still sees every event one by one; the
simulator's report is the same from parts as from events; a run's sinks take parts only
when the report is the only one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from elastic.events import AgentEvent, ListSink, NullSink, WorkerEvents, kinds, parts_sink
from sim.report import ReportSink, build_report
from sim.run import _RunSinks, simulate
from sim.scenario import load_scenario
from tests.test_report_fastpath import _state
from tests.test_worker_events import _agent, _plain, _start_and_stop, _Watching

ROOT = Path(__file__).resolve().parent.parent


class _Parts(ListSink):
    """A sink that takes parts: keeps each event made from them, and how it came (a
    record's events are kept expanded)."""

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

    def emit_group(self, group: WorkerEvents) -> None:
        self.ways.append("record")
        self.events.extend(group.events())

    def emit_group_parts(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        ranks: Sequence[int | None],
        keys: tuple[str, ...],
        fields: Any,
        columns: Any,
    ) -> None:
        self.ways.append("record parts")
        g = WorkerEvents(t, node, kind, role, ranks, keys, fields, columns)  # checked
        self.events.extend(g.events())


def _some_events(agent: Any, wg: Any) -> None:
    """A group start and stop and a few of the agent's own events."""
    agent._emit(kinds.AGENT_START, max_restarts=5)
    _start_and_stop(agent, wg)
    agent._emit_fields(kinds.AGENT_RESTART, None, {"reason": "failure", "detail": "x"})
    agent._emit(kinds.WORKER_FAILED, 7, exit_code=3)


def _instant() -> Any:
    """A clock at one instant (a record has one time for all its events)."""

    class Fixed:
        def now(self) -> float:
            return 42.5

    return Fixed()


def test_a_parts_sink_gets_exactly_the_events_a_plain_sink_gets() -> None:
    plain, parts = ListSink(), _Parts()
    for sink in (plain, parts):
        agent, wg = _agent(sink, workers=3, exit_order=[2, 0, 1], clock=_instant())
        _some_events(agent, wg)
    assert len(plain.events) == 11
    assert _plain(parts.events) == _plain(plain.events)
    # neither an AgentEvent nor a record was made for it
    assert parts.ways == [
        "parts",
        "record parts",
        "parts",
        "record parts",
        "parts",
        "parts",
        "parts",
    ]


def test_an_overridden_emit_fields_sees_every_event_given_as_parts() -> None:
    parts = _Parts()
    agent, wg = _agent(parts, workers=2, cls=_Watching)
    assert isinstance(agent, _Watching)
    _some_events(agent, wg)
    assert agent.seen == [(e.kind, e.rank) for e in parts.events]
    assert len(agent.seen) == 9
    assert "record parts" not in parts.ways  # each worker's event went by itself


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
    missing = _Parts()
    missing.emit_group_parts = None  # type: ignore[assignment,method-assign]
    assert parts_sink(missing) is None
    report = ReportSink()
    alone = _RunSinks([report])
    assert alone.emit_parts == report.emit_parts
    assert alone.emit_group_parts == report.emit_group_parts
    # a second sink without emit_parts: events are made, and each sink gets them
    assert _RunSinks([report, ListSink()]).emit_parts is None
    # every sink takes parts (the report and --plot's timeline): each gets the parts
    first, second = _Parts(), _Parts()
    both = _RunSinks([first, second])
    assert both.emit_parts is not None and both.emit_group_parts is not None
    both.emit_parts(1.0, 0, kinds.AGENT_START, "", None, {})
    both.emit_group_parts(1.0, 0, kinds.WORKER_START, "", [0, 1], ("a",), {}, {"a": [1, 2]})
    for sink in (first, second):
        assert sink.ways == ["parts", "record parts"]
        assert [(e.kind, e.rank, dict(e.fields)) for e in sink.events] == [
            (kinds.AGENT_START, None, {}),
            (kinds.WORKER_START, 0, {"a": 1}),
            (kinds.WORKER_START, 1, {"a": 2}),
        ]
    alone.close()
    assert alone.emit_parts is not None
    assert alone.emit_group_parts is not None
    alone.emit_parts(1.0, 0, kinds.AGENT_START, "", None, {})  # dropped after the run
    alone.emit_group_parts(1.0, 0, kinds.WORKER_START, "", [0], ("a",), {}, {"a": [1]})
    assert report.count == 0


def test_the_reports_parts_and_events_give_the_same_state() -> None:
    events = simulate(
        load_scenario(ROOT / "scenarios" / "budget_exhausted.yaml"), keep_events=True
    ).events
    by_event, by_parts = ReportSink(), ReportSink()
    for i, e in enumerate(events):
        by_event.emit(e)
        if e.kind == kinds.WORKER_TERMINATED:  # as a record of one: its first-only kind
            by_parts.emit_group_parts(
                e.t, e.node, e.kind, e.role, [e.rank], tuple(e.fields), {}, {
                    k: [v] for k, v in e.fields.items()
                }
            )  # fmt: skip
        else:
            by_parts.emit_parts(e.t, e.node, e.kind, e.role, e.rank, e.fields)
        assert _state(by_parts) == _state(by_event), (i, e)
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
