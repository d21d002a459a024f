"""The simulator's memory does not grow with simulated time (issue 16, item 1).

The event log is streamed to its sinks, never held unless asked for; a stopped world
forgets its workers; the rendezvous drops a past round's keys from the store (main's
7ed3759/7f67da0; pinned here over a long simulated run).  A long run
is sampled twice, early and at the end: what it holds is the same.
"""

from __future__ import annotations

import gc
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

import sim.run
from elastic.events import FanOutSink, ListSink
from sim.checks import Checks, check_all
from sim.report import build_report
from sim.run import simulate
from sim.scenario import load_scenario_text
from sim.store import SimStoreHost
from sim.workers import SimGroup, _Member

ROOT = Path(__file__).resolve().parent.parent


def churn(
    hours: int, *, nodes: str = "nodes: 6, nproc_per_node: 4", fault: str, seed: int = 3
) -> str:
    """A long job (it never finishes) that a fault every few minutes keeps restarting."""
    return f"""name: churn
seed: {seed}
until: {hours}h
cluster: {{{nodes}}}
job: {{steps: 100000000, step_time: 2s, startup_time: 20s, checkpoint_every: 100,
      checkpoint_time: 5s}}
agent: {{max_restarts: 100000}}
faults:
  - {{{fault}}}
"""


# a worker crash every ~20 simulated minutes: a new rendezvous round each time
CHURN = "kind: worker_crash, every: 20m"
# a node crash every ~30 simulated minutes, each machine back 2 minutes later: a new agent
# (store client, lease, worker groups) per crash; 3 of 6 nodes are enough to go on
NODE_CHURN = "kind: node_crash, every: 30m, restart_after: 2m"


def node_churn(hours: int) -> str:
    text = churn(hours, nodes="nodes: 6, nproc_per_node: 2", fault=NODE_CHURN, seed=5)
    return text + "rendezvous: {min_nodes: 3, max_nodes: 6}\n"


class _Hosts(SimStoreHost):
    made: ClassVar[list[SimStoreHost]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _Hosts.made.append(self)


def _live(kind: type) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is kind)


@pytest.mark.timeout(120)
def test_a_long_run_holds_the_same_groups_and_store_keys_early_and_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _Hosts.made = []
    monkeypatch.setattr(sim.run, "SimStoreHost", _Hosts)
    samples: list[tuple[float, int, int, int]] = []

    def sample(now: float, until: float) -> None:
        # early: the first tick at a quarter of the run; late: its last tick
        early = not samples and now >= until / 4 - 1e-6
        late = now >= until - until / sim.run.PROGRESS_TICKS - 1e-6
        if early or late:
            gc.collect()
            keys = len(_Hosts.made[0].store.keys())
            samples.append((now, _live(_Member), _live(SimGroup), keys))

    sc = load_scenario_text(churn(48, fault=CHURN), "churn.yaml")
    report = simulate(sc, progress=sample).report
    assert report["rendezvous_rounds"] >= 100, report["rendezvous_rounds"]
    assert len(samples) == 2, samples  # two samples, three quarters of the run apart
    (t_early, m_early, g_early, k_early), (t_late, m_late, g_late, k_late) = samples
    assert t_late - t_early >= sc.until / 2, (t_early, t_late)
    nodes = 6
    # at most the current group and one being replaced per node, whatever the round (a
    # group's workers are its columns; its world and timers know it by its _Member)
    assert m_late <= 2 * nodes and g_late <= 2 * nodes, (m_late, g_late)
    assert m_late <= m_early + nodes and g_late <= g_early + nodes
    # the store holds the current rounds' keys, not one set per round ever run
    assert k_late <= k_early + 4 * nodes, (k_early, k_late)


@pytest.mark.timeout(60)
def test_the_log_is_streamed_to_a_sink_and_kept_only_when_asked() -> None:
    sc = load_scenario_text(churn(3, fault=CHURN), "churn.yaml")
    plain = simulate(sc)
    with pytest.raises(ValueError, match="keep_events=True"):
        plain.events  # noqa: B018  # the property raises
    sink, checks = ListSink(), Checks()
    kept = simulate(sc, sink=FanOutSink(sink, checks), keep_events=True)
    assert [e.to_json() for e in kept.events] == [e.to_json() for e in sink.events]
    # the invariant checkers fed as the run goes judge as they do over the whole log
    assert checks.violations() == check_all(kept.events) == []
    assert len(kept.events) > 100
    # the report fed as the run goes equals the report of the whole log
    streamed = {k: v for k, v in plain.report.items() if k not in ("wall_s", "sim_events")}
    whole = build_report(kept.events)
    assert streamed == whole
    assert plain.report["sim_events"] == kept.report["sim_events"]


@pytest.mark.timeout(120)
def test_the_events_file_is_written_as_it_happens_byte_identical_and_nothing_else(
    tmp_path: Path,
) -> None:
    text = churn(3, fault=CHURN)
    (tmp_path / "s.yaml").write_text(text)
    log = tmp_path / "log.jsonl"
    cmd = [sys.executable, "-m", "elastic.cli", "sim", "s.yaml", "--json", "--check-determinism"]
    r = subprocess.run(
        [*cmd, "--events", str(log)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=100,
    )
    assert r.returncode == 0, r.stderr
    events = simulate(load_scenario_text(text, "s.yaml"), keep_events=True).events
    expected = "".join(e.to_json() + "\n" for e in events).encode()
    assert log.read_bytes() == expected
    assert json.loads(r.stdout)["event_log_sha256"] == hashlib.sha256(expected).hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "s.yaml"]


def test_a_past_round_leaves_no_key_in_the_simulated_store(monkeypatch: pytest.MonkeyPatch) -> None:
    _Hosts.made = []
    monkeypatch.setattr(sim.run, "SimStoreHost", _Hosts)
    sc = load_scenario_text(churn(6, fault=CHURN), "churn.yaml")
    report = simulate(sc).report
    last = int(report["rendezvous_rounds"]) - 1
    keys = _Hosts.made[0].store.keys()
    rounds = {
        int(part[1:])
        for k in keys
        for part in k.split("/")
        if len(part) > 1 and part[0] == "r" and part[1:].isdigit()
    }
    rounds |= {int(k.split("/s/")[1].split("/")[0]) for k in keys if "/s/" in k}
    assert rounds and min(rounds) >= last - 2, (last, sorted(rounds))


@pytest.mark.timeout(120)
def test_a_crashed_nodes_agent_is_freed_with_everything_it_held() -> None:
    """A node's first agent is built before the run starts.  When the simulator froze that
    heap (``gc.freeze``) to spare the collector, a crashed node's first agent was never
    freed, nor its last worker group, workers, store client and lease: one agent leaked
    per crashed node, memory grew with simulated time (sim/gcpause.py)."""
    from sim.store import _ClientLease

    held: list[tuple[int, int]] = []

    def sample(now: float, until: float) -> None:
        if now >= 0.9 * until and not held:
            gc.collect()
            leases = [o for o in gc.get_objects() if type(o) is _ClientLease]
            dead = sum(1 for lease in leases if lease._client.dead)
            held.append((_live(SimGroup), dead))

    sc = load_scenario_text(node_churn(24), "node-churn.yaml")
    report = simulate(sc, progress=sample).report
    assert report["faults"].get("node_crash", 0) >= 30, report["faults"]
    (groups, dead_leases) = held[-1]
    # the live nodes' groups (one each, and one being replaced), nothing of a dead agent
    assert groups <= 2 * 6, groups
    assert dead_leases <= 1, dead_leases  # a node crashed at the very end, still held


@pytest.mark.timeout(120)
def test_a_crashed_nodes_agent_is_freed_without_waiting_for_a_full_collection() -> None:
    """An agent is no reference cycle: when its node crashes, it is freed at once, with its
    last round's member list.  A cycle (the metrics held the agent's bound method) kept
    every crashed node's agent until a full collection, which a long simulation runs
    rarely: the 54-day 2,048-node run's memory grew with every crash."""
    from elastic.agent.server.api import SimpleElasticAgent

    agents: list[int] = []

    def sample(now: float, until: float) -> None:
        if now >= 0.9 * until and not agents:
            agents.append(_live(SimpleElasticAgent) - before)

    sc = load_scenario_text(node_churn(24), "node-churn.yaml")
    gc.collect()
    before = _live(SimpleElasticAgent)  # another test's run may still be held (_Hosts.made)
    gc.disable()  # nothing freed but by reference counting
    try:
        report = simulate(sc, progress=sample).report
    finally:
        gc.enable()
    assert report["faults"].get("node_crash", 0) >= 30, report["faults"]
    # the six nodes' current agents and one being replaced at most
    assert agents[0] <= 6 + 1, agents
