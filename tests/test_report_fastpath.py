"""The report's routing by kind (sim/report.py ``ReportSink``): each part of the report is
fed only the kinds it says it reacts to (``KINDS``), so skipping the others changes no
report.  Checked on runs with crashes, hangs, partitions and restarts: at every event of a
kind a part does not list, that part's ``see`` leaves its state exactly as it was."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest

from elastic.events import AgentEvent, kinds
from sim.losses import LostTime
from sim.report import ReportSink, _Causes, build_report
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
def test_events_of_unlisted_kinds_change_no_part_of_the_report(name: str) -> None:
    events = simulate(load_scenario(ROOT / "scenarios" / name), keep_events=True).events
    assert events is not None
    skipped: dict[str, int] = {}
    sink = ReportSink()
    for e in events:
        feeds: list[tuple[str, frozenset[str], Callable[[AgentEvent], None]]] = [
            ("causes", _Causes.KINDS, sink.causes.see),
            ("losses", LostTime.KINDS, sink.losses.see),
            ("sim_rec", sink.sim_rec.kinds, lambda ev: sink.sim_rec.see(ev.kind, ev.t)),
            ("real_rec", sink.real_rec.kinds, lambda ev: sink.real_rec.see(ev.kind, ev.t)),
        ]
        for part, listed, feed in feeds:
            if e.kind in listed:
                continue
            skipped[part] = skipped.get(part, 0) + 1
            before = _state(sink)
            feed(e)
            assert _state(sink) == before, (part, e)
        sink.emit(e)
    # every part skipped something, the worker START events among them
    assert set(skipped) == {"causes", "losses", "sim_rec", "real_rec"}
    assert all(kinds.WORKER_START not in listed for listed in (_Causes.KINDS, LostTime.KINDS))
    assert sink.result() == build_report(events)
