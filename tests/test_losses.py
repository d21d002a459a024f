"""Where the time goes (sim/losses.py): the parts add up to the run, each part is what the
model says it is, and the report reads the event log one event at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic.events import AgentEvent
from sim.losses import BUCKETS, GAP_BUCKETS
from sim.report import build_report
from sim.run import simulate
from sim.scenario import load_scenario, load_scenario_text

ROOT = Path(__file__).resolve().parent.parent
CHEAP = [
    "worker_crash_restarts",
    "node_crash_comes_back",
    "fidelity_node_crash_spare",
    "two_faults_close_together",
    "membership_joins_leaves_crashes",
    "worker_hang_heartbeat",
    "slow_node",
    "preemption_with_notice",
]

ONE_CRASH = """
seed: 1
until: 1d
cluster: {nodes: 2, nproc_per_node: 1}
job: {steps: 1000, step_time: 1s, startup_time: 10s, checkpoint_every: 100, checkpoint_time: 5s}
faults:
  - {at: 500s, kind: worker_crash, node: 1, local_rank: 0}
"""


@pytest.mark.parametrize("name", CHEAP)
def test_productive_and_lost_time_add_up_to_the_run(name: str) -> None:
    report = simulate(load_scenario(ROOT / "scenarios" / f"{name}.yaml")).report
    lost = report["lost_s"]
    assert all(lost[b] >= 0 for b in BUCKETS)
    assert lost["total"] == pytest.approx(sum(lost[b] for b in BUCKETS), abs=0.01)
    assert report["productive_s"] + lost["total"] == pytest.approx(report["sim_time_s"], abs=0.01)
    assert 0.0 <= report["ettr"] <= 1.0
    # every recovery is one row, and the rows add up to their categories
    for name_, cat in report["lost_by_category"].items():
        rows = [r for r in report["lost_by_fault"] if r["category"] == name_]
        assert cat["count"] + cat["rejoins"] == len(rows)
        assert cat["total"] == pytest.approx(sum(r["total"] for r in rows), abs=0.01)
    if report["state"] == "SUCCEEDED" and name != "slow_node":
        assert report["ettr"] == pytest.approx(report["goodput"], abs=1e-6)


def test_one_crash_costs_rework_since_the_checkpoint_and_a_restart() -> None:
    report = simulate(load_scenario_text(ONE_CRASH)).report
    lost = report["lost_s"]
    # the first world runs from ~10 s: by 500 s it did 4 segments of 100 steps + 5 s
    # checkpoint (420 s) and 70 more steps, thrown away; the second world resumes at step
    # 400 and writes ceil(600 / 100) - 1 = 5 checkpoints before the last step
    assert report["productive_s"] == pytest.approx(1000.0)
    assert lost["checkpoint"] == pytest.approx(9 * 5.0)
    assert lost["rework"] == pytest.approx(70.0, abs=0.1)
    assert lost["startup"] == pytest.approx(2 * 10.0, abs=0.1)  # the first start and the restart
    assert lost["detection"] == pytest.approx(0.0, abs=0.01)  # a crash is seen at once
    (row,) = report["lost_by_fault"]
    assert row["fault"] == row["category"] == "worker_crash" and row["node"] == 1
    assert row["t"] == pytest.approx(500.0)
    assert row["rework"] == pytest.approx(70.0, abs=0.1)
    assert row["total"] == pytest.approx(sum(row[b] for b in (*GAP_BUCKETS, "rework")))
    assert report["ettr"] == pytest.approx(1000.0 / report["sim_time_s"])


def test_a_crashed_node_is_detected_by_its_lease_and_waited_for() -> None:
    text = ONE_CRASH.replace(
        "{at: 500s, kind: worker_crash, node: 1, local_rank: 0}",
        "{at: 500s, kind: node_crash, node: 1, restart_after: 2m}",
    )
    report = simulate(load_scenario_text(text)).report
    (row,) = report["lost_by_fault"]
    assert row["fault"] == "node_crash"
    assert row["detection"] == pytest.approx(15.0, abs=0.1)  # heartbeat_timeout
    # the node is back 120 s after the crash; the survivor waited for it after stopping
    assert row["waiting_for_nodes"] == pytest.approx(120.0 - 15.0, abs=0.5)


def test_the_report_reads_the_log_as_a_stream() -> None:
    events = simulate(load_scenario_text(ONE_CRASH), keep_events=True).events
    seen = 0

    def once() -> Iterator[AgentEvent]:
        nonlocal seen
        for e in events:
            seen += 1
            yield e

    streamed = build_report(once())
    assert seen == len(events)
    assert streamed["lost_s"] == build_report(events)["lost_s"]


def test_a_real_runs_log_has_no_breakdown() -> None:
    events = [AgentEvent(t=0.0, node=0, kind="agent.start", fields={"max_restarts": 3})]
    assert "lost_s" not in build_report(events)


def test_failures_categories_are_charged_and_rejoins_go_to_the_fault_that_caused_them() -> None:
    sc = load_scenario_text(
        """
seed: 3
until: 3d
cluster: {nodes: 8, nproc_per_node: 2}
job: {steps: 40000, step_time: 4s, startup_time: 30s, checkpoint_every: 100, checkpoint_time: 5s}
rendezvous: {min_nodes: 6, max_nodes: 8}
agent: {max_restarts: 100}
failures:
  unexpected:
    mtbf: 3d
    per: gpu
    categories:
      - {name: hbm, kind: gpu_error, repair: 1h}
      - {name: bug, kind: worker_crash}
"""
    )
    report = simulate(sc).report
    cats = report["lost_by_category"]
    assert set(cats) == {"hbm", "bug"}
    rows = report["lost_by_fault"]
    rejoins = [r for r in rows if r["fault"].startswith("rejoin after")]
    assert rejoins and all(r["category"] == "hbm" for r in rejoins)
    # each repaired node is let back in once (this seed: no failure during a repair)
    assert cats["hbm"]["rejoins"] == cats["hbm"]["count"] == len(rejoins)
    assert cats["bug"]["rejoins"] == 0


def test_the_timeline_shades_the_lost_time_bands_with_a_legend(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from sim.plot import plot_timeline

    events = simulate(load_scenario_text(ONE_CRASH), keep_events=True).events
    labels = plot_timeline(events, str(tmp_path / "t.png"))
    assert "lost: rework" in labels and "lost: startup" in labels
    assert (tmp_path / "t.png").stat().st_size > 1000
