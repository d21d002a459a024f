"""The report's fast path for worker START events (sim/report.py ``ReportSink.emit``):
none of the report's parts but the counters reacts to that kind, so skipping them changes
no report.  Checked on runs with crashes, hangs, partitions and restarts: at every START
event, each part's ``see`` leaves its state exactly as it was."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from elastic.events import kinds
from sim.report import ReportSink, build_report
from sim.run import simulate
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = [
    "worker_crash_restarts.yaml",
    "worker_hang_heartbeat.yaml",
    "node_crash_comes_back.yaml",
    "network_partition_minority_node.yaml",
    "budget_exhausted.yaml",
]


def _plain(x: object) -> object:
    """``x`` as nested builtins, so two states compare by value."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return type(x)(_plain(v) for v in x) if not isinstance(x, set) else sorted(map(repr, x))
    names = list(getattr(x, "__dict__", {})) + list(getattr(type(x), "__slots__", ()))
    if names and not isinstance(x, str | int | float | bool):
        return (type(x).__name__, {n: _plain(getattr(x, n)) for n in names if hasattr(x, n)})
    return x


def _state(sink: ReportSink) -> object:
    return _plain(copy.deepcopy(_parts(sink)))


def _parts(sink: ReportSink) -> list[object]:
    return [sink.causes, sink.losses, sink.sim_rec, sink.real_rec]


@pytest.mark.parametrize("name", SCENARIOS)
def test_worker_start_events_change_no_part_of_the_report(name: str) -> None:
    events = simulate(load_scenario(ROOT / "scenarios" / name), keep_events=True).events
    assert events is not None
    starts = 0
    sink = ReportSink()
    for e in events:
        if e.kind == kinds.WORKER_START:
            starts += 1
            before = _state(sink)
            sink.causes.see(e)
            sink.losses.see(e)
            sink.sim_rec.see(e.kind, e.t)
            sink.real_rec.see(e.kind, e.t)
            assert _state(sink) == before, e
        sink.emit(e)
    assert starts > 0
    assert sink.result() == build_report(events)
