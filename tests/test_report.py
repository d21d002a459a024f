"""The report is computed from the event log alone: a saved log gives the same report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.events import AgentEvent, read_events
from sim.report import build_report

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_a_saved_simulation_log_gives_the_same_report(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    f = ROOT / "scenarios" / "worker_crash_restarts.yaml"
    sim = subprocess.run(
        [sys.executable, "-m", "elastic.cli", "sim", str(f), "--json", "--events", str(log)],
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    live = json.loads(sim.stdout)
    rep = subprocess.run(
        [sys.executable, "-m", "elastic.cli", "report", str(log), "--json"],
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    saved = json.loads(rep.stdout)
    for key in (
        "state",
        "restarts",
        "membership_restarts",
        "rendezvous_rounds",
        "world_size",
        "steps_done",
        "sim_time_s",
        "goodput",
        "events",
        "recovery_s",
    ):
        assert saved[key] == live[key], key


def test_a_real_runs_log_reports_recovery_from_failure_to_the_next_group() -> None:
    def ev(t: float, kind: str, **f: object) -> AgentEvent:
        return AgentEvent(t=t, node="host", kind=kind, fields=f)

    log = [
        ev(100.0, "agent.start", max_restarts=3),
        ev(100.1, "RENDEZVOUS", round=0, group_rank=0, group_world_size=1),
        ev(100.2, "agent.group_started", world_size=2, ranks=[0, 1]),
        ev(110.0, "torchelastic.worker.status.FAILED", exit_code=1),
        ev(110.0, "agent.restart", reason="failure"),
        ev(110.1, "RENDEZVOUS", round=1, group_rank=0, group_world_size=1),
        ev(110.3, "agent.group_started", world_size=2, ranks=[0, 1]),
        ev(120.0, "agent.finish", state="SUCCEEDED", restarts=1),
    ]
    r = build_report(read_events(e.to_json() for e in log))
    assert r["state"] == "SUCCEEDED"
    assert r["restarts"] == 1
    assert r["rendezvous_rounds"] == 2
    assert r["recovery_s"] == [pytest.approx(0.3)]
    assert r["run_time_s"] == pytest.approx(20.0)
    assert "seed" not in r and "goodput" not in r


@pytest.mark.timeout(120)
def test_plot_draws_the_timeline_from_the_event_log(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "timeline.png"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "elastic.cli",
            "sim",
            str(ROOT / "scenarios" / "node_crash_comes_back.yaml"),
            "--plot",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
