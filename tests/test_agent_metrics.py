"""The agent's metrics go through its own handler and its clock, never a module global;
torch's process-wide metrics API keeps working for users."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import sim.world
from elastic import metrics
from elastic.agent.server.api import SimpleElasticAgent, WorkerState
from elastic.events import ListSink
from elastic.metrics import api as metrics_api
from elastic.metrics.core import AgentMetrics, MetricData, MetricHandler
from sim.run import simulate
from sim.scenario import load_scenario
from tests.test_local_agent import _agent
from tests.test_run_cli import TAG, tag

__all__ = ["tag"]

ROOT = Path(__file__).resolve().parent.parent


class Recorder(MetricHandler):
    def __init__(self) -> None:
        self.data: list[MetricData] = []

    def emit(self, metric_data: MetricData) -> None:
        self.data.append(metric_data)


def test_agent_metrics_are_stamped_by_the_given_clock_and_kept_per_instance() -> None:
    rec = Recorder()
    t = [5.0]
    a, b = AgentMetrics(rec, lambda: t[0]), AgentMetrics(rec, lambda: 99.0)
    a.put("workers.r.run_total", 1)
    t[0] = 6.5
    a.put("workers.r.flakiness", 20)
    b.put("workers.r.run_total", 3)
    assert rec.data == [
        MetricData(5.0, "torchelastic", "workers.r.run_total", 1),
        MetricData(6.5, "torchelastic", "workers.r.flakiness", 20),
        MetricData(99.0, "torchelastic", "workers.r.run_total", 3),
    ]
    assert a.last_values == {"workers.r.run_total": 1, "workers.r.flakiness": 20}
    assert b.last_values == {"workers.r.run_total": 3}


def test_simulated_agents_report_on_simulated_time_each_to_its_own_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agents: list[SimpleElasticAgent] = []
    handlers: list[Recorder] = []

    class Recorded(SimpleElasticAgent):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            handlers.append(Recorder())
            super().__init__(*args, metrics_handler=handlers[-1], **kwargs)
            agents.append(self)

    monkeypatch.setattr(sim.world, "SimpleElasticAgent", Recorded)
    global_before = dict(metrics_api.last_values)
    # three nodes; node 2 crashes at t=100 before it measured anything; 0 and 1 see the
    # membership change (at the same instant: its lease expiry), re-form and succeed
    res = simulate(
        load_scenario(ROOT / "scenarios" / "multinode_kill_one_of_three.yaml"), keep_events=True
    )
    by_node = {a._node: rec for a, rec in zip(agents, handlers, strict=True)}
    assert sorted(by_node) == [0, 1, 2] and by_node[2].data == []
    for node in (0, 1):
        rec = by_node[node]
        mine = [e for e in res.events if e.node == node]
        restart_t = next(e.t for e in mine if e.kind == "agent.restart")
        finish_t = next(e.t for e in mine if e.kind == "agent.finish")
        first, last = rec.data[0], rec.data[-1]
        # simulated seconds on this agent's clock, at the moments it decided and finished
        assert (first.name, first.value, first.timestamp) == (
            "workers.default.remaining_restarts",
            3,
            restart_t,
        )
        assert (last.name, last.timestamp) == ("workers.default.flakiness", finish_t)
        agent = next(a for a in agents if a._node == node)
        assert agent.metrics.last_values == {d.name: d.value for d in rec.data}
        assert agent.metrics.last_values["workers.default.run_success_no_retries"] == 1
    # each stamp is its own agent's decision instant (checked above against its own
    # events); the two survivors see node 2's lease expire at the same instant (every
    # member watches the members' keys; no ring hop delays the second one)
    assert by_node[0].data[0].timestamp == by_node[1].data[0].timestamp
    assert metrics_api.last_values == global_before  # the process-wide map is untouched


@pytest.mark.timeout(60)
def test_a_real_agent_reports_to_the_handler_configured_with_torchs_api(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TAG, tag)
    monkeypatch.setattr("elastic.agent.server.local_elastic_agent.NVIDIA_CONTROL_DEVICE", "")
    rec = Recorder()
    monkeypatch.setattr(metrics_api, "_metrics_map", {"torchelastic": rec})
    agent = _agent(tmp_path, ListSink())
    result = asyncio.run(agent.run_async())
    assert result is not None and result.state == WorkerState.SUCCEEDED
    names = [d.name for d in rec.data]
    assert "workers.default.run_total" in names and "workers.default.succeeded" in names
    assert agent.metrics.last_values["workers.default.run_success_no_retries"] == 1
    # torch's user-facing API still routes by group and stamps wall time
    metrics.put_metric("my.metric", 7, "torchelastic")
    assert rec.data[-1].name == "my.metric" and rec.data[-1].timestamp > 1e9
