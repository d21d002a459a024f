"""A group of workers' events as one record (elastic/events ``WorkerEvents``, the agent's
``_group_sink``): a sink that takes records (``emit_group``) gets one per group start and
stop, and its expansion is exactly the stream a sink without ``emit_group`` gets — same
events, order, fields (and their order), ranks, times; a subclass or an instance that
overrides ``_emit_fields`` still sees every per-worker event one by one; the report counts
a record as its events; a simulated run gives the same log and report either way."""

from __future__ import annotations

import copy
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic.agent.server.api import SimpleElasticAgent, Worker, WorkerGroup, WorkerSpec
from elastic.events import (
    AgentEvent,
    FanOutSink,
    ListSink,
    NullSink,
    WorkerEvents,
    emit_group,
    kinds,
)
from elastic.workers import ExitCause, WorkerExit, WorkerLaunch
from sim.losses import LostTime
from sim.report import ReportSink, build_report
from sim.run import simulate
from sim.scenario import load_scenario
from tests.test_report_fastpath import _state

ROOT = Path(__file__).resolve().parent.parent


class _Handler:
    use_agent_store = True

    def get_run_id(self) -> str:
        return "job-7"


class _Clock:
    """A clock whose every reading is later than the last: a record made from one
    reading would show in the times if the agent batched where it must not."""

    def __init__(self) -> None:
        self.t = 10.0

    def now(self) -> float:
        self.t += 0.25
        return self.t


class _Group:
    def __init__(self, launches: Sequence[WorkerLaunch], exit_order: Sequence[int]) -> None:
        self.launches = list(launches)
        self.exit_order = list(exit_order)

    def pids(self) -> dict[int, int]:
        return {ln.local_rank: 100 + ln.local_rank for ln in self.launches}

    async def stop(self, grace: float, sig: int = 15) -> list[WorkerExit]:
        return [
            WorkerExit(r, -sig if r % 2 else 0, 1.0, ExitCause.STOPPED_BY_AGENT, 100 + r)
            for r in self.exit_order
        ]


class _Port:
    def __init__(self, exit_order: Sequence[int]) -> None:
        self.exit_order = exit_order

    async def start(self, launches: Sequence[WorkerLaunch]) -> _Group:
        return _Group(launches, self.exit_order)


class _Records(ListSink):
    """A sink that takes records: keeps them, and every event in order (expanded)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[WorkerEvents] = []

    def emit_group(self, group: WorkerEvents) -> None:
        self.records.append(group)
        self.events.extend(group.events())


class _Watching(SimpleElasticAgent):
    """A subclass that observes every event (as LocalElasticAgent does, to log them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[str, int | None]] = []

    def _emit_fields(self, kind: str, rank: int | None, fields: dict[str, Any]) -> None:
        self.seen.append((kind, rank))
        super()._emit_fields(kind, rank, fields)


def _agent(
    sink: Any,
    workers: int = 3,
    exit_order: Sequence[int] | None = None,
    cls: type[SimpleElasticAgent] = SimpleElasticAgent,
    clock: Any = None,
) -> tuple[SimpleElasticAgent, WorkerGroup]:
    spec = WorkerSpec(
        role="trainer",
        local_world_size=workers,
        rdzv_handler=_Handler(),  # type: ignore[arg-type]
        entrypoint="train.py",
        max_restarts=5,
    )
    order = list(range(workers)) if exit_order is None else list(exit_order)
    agent = cls(
        spec,
        clock=clock if clock is not None else _Clock(),  # type: ignore[arg-type]
        workers=_Port(order),  # type: ignore[arg-type]
        events=sink,
        node=4,
    )
    agent._attempt = 2
    agent._round = 6
    wg = agent.get_worker_group()
    wg.group_rank, wg.group_world_size = 1, 4
    wg.master_addr, wg.master_port = "node0", 29500
    wg.workers = [Worker(r, workers + r, 10 + r, 4 * workers, 8 * workers) for r in range(workers)]
    return agent, wg


def _run(coro: Coroutine[Any, Any, None]) -> None:
    with pytest.raises(StopIteration):
        coro.send(None)


def _start_and_stop(agent: SimpleElasticAgent, wg: WorkerGroup) -> None:
    _run(agent._start_workers(wg))
    _run(agent._stop_group(kinds.RESTART_FAILURE))


def _plain(events: Sequence[AgentEvent]) -> list[tuple[Any, ...]]:
    """Everything of each event, the fields' order included."""
    return [(e.t, e.node, e.kind, e.role, e.rank, list(e.fields.items())) for e in events]


def _same_instant_clock() -> Any:
    class Fixed:
        def now(self) -> float:
            return 42.5

    return Fixed()


def test_a_sink_without_emit_group_gets_every_event_one_by_one_as_before() -> None:
    sink = ListSink()
    agent, wg = _agent(sink, workers=3, exit_order=[2, 0, 1])
    _start_and_stop(agent, wg)
    got = _plain(sink.events)
    # each event read the clock itself (times 10.25, 10.5, ...): nothing was batched
    assert [e[0] for e in got] == [10.25 + 0.25 * i for i in range(len(got))]
    assert got == [
        (10.25, 4, kinds.WORKER_START, "trainer", 3, [
            ("local_rank", 0), ("role_rank", 10), ("world_size", 12), ("group_rank", 1),
            ("worker_pid", 100), ("attempt", 2)]),
        (10.5, 4, kinds.WORKER_START, "trainer", 4, [
            ("local_rank", 1), ("role_rank", 11), ("world_size", 12), ("group_rank", 1),
            ("worker_pid", 101), ("attempt", 2)]),
        (10.75, 4, kinds.WORKER_START, "trainer", 5, [
            ("local_rank", 2), ("role_rank", 12), ("world_size", 12), ("group_rank", 1),
            ("worker_pid", 102), ("attempt", 2)]),
        got[3],  # agent.group_started (not per worker)
        (11.25, 4, kinds.WORKER_TERMINATED, "trainer", 5, [
            ("local_rank", 2), ("exit_code", 0), ("attempt", 2)]),
        (11.5, 4, kinds.WORKER_TERMINATED, "trainer", 3, [
            ("local_rank", 0), ("exit_code", 0), ("attempt", 2)]),
        (11.75, 4, kinds.WORKER_TERMINATED, "trainer", 4, [
            ("local_rank", 1), ("exit_code", -15), ("attempt", 2)]),
        (12.0, 4, kinds.AGENT_GROUP_STOPPED, "trainer", None, [
            ("reason", kinds.RESTART_FAILURE), ("attempt", 2)]),
    ]  # fmt: skip
    assert got[3][2] == kinds.AGENT_GROUP_STARTED


def test_a_sink_with_emit_group_gets_one_record_per_start_and_per_stop() -> None:
    sink = _Records()
    agent, wg = _agent(sink, workers=3, exit_order=[2, 0, 1])
    _start_and_stop(agent, wg)
    assert [(r.kind, list(r.ranks)) for r in sink.records] == [
        (kinds.WORKER_START, [3, 4, 5]),
        (kinds.WORKER_TERMINATED, [5, 3, 4]),
    ]
    # one clock reading per record, as a simulated instant has one time for all
    assert [e.t for e in sink.events] == [10.25] * 3 + [10.5] + [10.75] * 3 + [11.0]
    assert agent.last_event_time == 11.0
    assert [w.id for w in wg.workers] == [100, 101, 102]


@settings(max_examples=60, deadline=None)
@given(
    workers=st.integers(min_value=1, max_value=16),
    attempt=st.integers(min_value=0, max_value=3),
    data=st.data(),
)
def test_a_records_expansion_is_the_stream_a_plain_sink_gets(
    workers: int, attempt: int, data: Any
) -> None:
    # the exits the stop returns: any of the workers (those already taken are not), in
    # any order
    order = data.draw(st.permutations(list(range(workers))), label="exit order")
    order = order[: data.draw(st.integers(0, workers), label="exits left")]
    plain, records = ListSink(), _Records()
    for sink in (plain, records):
        agent, wg = _agent(sink, workers=workers, exit_order=order, clock=_same_instant_clock())
        agent._attempt = attempt
        _start_and_stop(agent, wg)
    assert _plain(records.events) == _plain(plain.events)
    assert [len(r) for r in records.records] == [workers, len(order)][: 2 if order else 1]


@pytest.mark.parametrize("how", ["subclass", "instance"])
def test_an_overridden_emit_fields_sees_every_worker_event_one_by_one(how: str) -> None:
    sink = _Records()
    seen: list[tuple[str, int | None]] = []
    if how == "subclass":
        agent, wg = _agent(sink, workers=4, cls=_Watching)
        assert isinstance(agent, _Watching)
        seen = agent.seen
    else:
        agent, wg = _agent(sink, workers=4)
        base = agent._emit_fields

        def watch(kind: str, rank: int | None, fields: dict[str, Any]) -> None:
            seen.append((kind, rank))
            base(kind, rank, fields)

        agent._emit_fields = watch  # type: ignore[method-assign]
    _start_and_stop(agent, wg)
    assert seen == [
        *[(kinds.WORKER_START, 4 + r) for r in range(4)],
        (kinds.AGENT_GROUP_STARTED, None),
        *[(kinds.WORKER_TERMINATED, 4 + r) for r in range(4)],
        (kinds.AGENT_GROUP_STOPPED, None),
    ]
    assert sink.records == []  # nothing went around the override
    assert [(e.kind, e.rank) for e in sink.events] == seen


def test_fan_out_takes_records_only_when_every_sink_does() -> None:
    a, b = _Records(), _Records()
    both = FanOutSink(a, b)
    assert both.emit_group is not None
    mixed = FanOutSink(_Records(), ListSink())
    assert mixed.emit_group is None
    agent, wg = _agent(both, workers=2)
    _start_and_stop(agent, wg)
    assert len(a.records) == len(b.records) == 2
    assert _plain(a.events) == _plain(b.events)
    plain = ListSink()
    agent, wg = _agent(mixed, workers=2)
    _start_and_stop(agent, wg)
    agent, wg = _agent(plain, workers=2)
    _start_and_stop(agent, wg)
    assert _plain(mixed._sinks[1].events) == _plain(plain.events)  # type: ignore[attr-defined]


def test_emit_group_expands_for_a_sink_without_the_method() -> None:
    g = WorkerEvents(
        3.0, "n", "k", "r", [7, 8], ("a", "b", "c"), {"b": [1]}, {"a": [0, 1], "c": ["x", "y"]}
    )
    sink = ListSink()
    emit_group(sink, g)
    assert _plain(sink.events) == [
        (3.0, "n", "k", "r", 7, [("a", 0), ("b", [1]), ("c", "x")]),
        (3.0, "n", "k", "r", 8, [("a", 1), ("b", [1]), ("c", "y")]),
    ]
    assert _plain([g.event(1)]) == _plain(sink.events[1:])
    assert len(g) == 2
    emit_group(NullSink(), g)  # takes it, drops it


@pytest.mark.parametrize(
    ("keys", "fields", "columns", "why"),
    [
        (("a", "a"), {"a": 1}, {"a": [1]}, "expected each once"),
        (("a",), {"a": 1}, {"b": [1]}, "expected each once"),
        (("a", "b"), {"a": 1}, {}, "expected each once"),
        (("a", "b"), {"a": 1}, {"b": [1, 2]}, "column 'b' has 2 values; expected one per rank"),
    ],
)
def test_a_malformed_record_is_refused(
    keys: tuple[str, ...], fields: dict[str, Any], columns: dict[str, Any], why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        WorkerEvents(0.0, 0, "k", "", [0], keys, fields, columns)


@pytest.mark.parametrize("log", ["simulated", "real"])
@pytest.mark.parametrize(
    "kind",
    [
        kinds.WORKER_START,
        kinds.WORKER_TERMINATED,
        kinds.WORKER_FAILED,
        kinds.WORKER_SUCCEEDED,
        kinds.AGENT_GROUP_STOPPED,  # not per worker: a part reads each (a record expands)
    ],
)
def test_the_report_counts_a_record_as_its_events(kind: str, log: str) -> None:
    scenario = load_scenario(ROOT / "scenarios" / "worker_crash_restarts.yaml")
    events = simulate(scenario, keep_events=True).events
    if log == "real":  # a real run's log: no sim.* events (its recoveries are the agents')
        events = [e for e in events if not e.kind.startswith("sim.")]
    # the record comes during a recovery (the first failure's), where every part listens
    half = 1 + next(i for i, e in enumerate(events) if e.kind == kinds.WORKER_FAILED)
    g = WorkerEvents(
        events[half].t, 99, kind, "default", [8, 9, 10], ("local_rank", "attempt"),
        {"attempt": 1}, {"local_rank": [0, 1, 2]},
    )  # fmt: skip
    one, many = ReportSink(), ReportSink()
    for e in events[:half]:
        one.emit(e)
        many.emit(e)
    assert (one.losses.gap is not None) == (log == "simulated")
    one.emit_group(g)
    for e in g.events():
        many.emit(e)
    assert (one.count, one.t0, one.last_t, one.nodes) == (
        many.count,
        many.t0,
        many.last_t,
        many.nodes,
    )
    assert _state(one) == _state(many)
    for e in events[half:]:
        one.emit(e)
        many.emit(e)
    assert one.result() == many.result()


def test_losses_first_at_an_instant_kinds_change_nothing_when_repeated() -> None:
    """What lets the report feed a record of such a kind as its first event only."""
    for name in ("worker_crash_restarts.yaml", "node_crash_comes_back.yaml"):
        events = simulate(load_scenario(ROOT / "scenarios" / name), keep_events=True).events
        losses = LostTime()
        repeated = 0
        for e in events:
            losses.see(e)
            if e.kind in LostTime.FIRST_AT_AN_INSTANT:
                before = copy.deepcopy(vars(losses))
                losses.see(AgentEvent(e.t, e.node, e.kind, e.role, e.rank, dict(e.fields)))
                assert vars(losses) == before, e
                repeated += 1
        assert repeated > 0


class _GroupLog(ListSink):
    """A ``sink=`` that takes records (so the whole run batches), keeping every event."""

    def emit_group(self, group: WorkerEvents) -> None:
        self.events.extend(group.events())


@pytest.mark.parametrize(
    "name",
    ["worker_crash_restarts.yaml", "node_crash_comes_back.yaml", "budget_exhausted.yaml"],
)
def test_a_simulated_run_gives_the_same_log_and_report_batched_or_not(name: str) -> None:
    scenario = load_scenario(ROOT / "scenarios" / name)
    batched, plain = _GroupLog(), ListSink()  # ListSink: the agents emit one by one
    a = simulate(scenario, sink=batched)
    b = simulate(scenario, sink=plain)
    assert [e.to_json() for e in batched.events] == [e.to_json() for e in plain.events]
    assert _plain(batched.events) == _plain(plain.events)
    a.report.pop("wall_s")
    b.report.pop("wall_s")
    assert a.report == b.report
    assert a.report == {**build_report(plain.events), "sim_events": a.report["sim_events"]}
