"""Simulation-level property: any churn schedule, over the whole agent in the simulator.

Churn schedules are generated as data (a YAML scenario text), so hypothesis shrinks a
failing one to a short list of faults, printed as a scenario you can replay with
``elastic sim``.  From the event log: every group that started belongs to a world whose
global ranks are exactly 0..W-1; each node's old group stopped before its new one
started; rounds agree on their size; budgets are kept; every run ends.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.checks import check_all
from sim.run import simulate
from sim.scenario import load_scenario_text

NODES = 4

fault = st.one_of(
    st.builds(
        lambda t, n: f"{{at: {t}s, kind: node_crash, node: {n}}}",
        st.integers(30, 3000),
        st.integers(0, NODES - 1),
    ),
    st.builds(
        lambda t, n, r: f"{{at: {t}s, kind: node_crash, node: {n}, restart_after: {r}s}}",
        st.integers(30, 3000),
        st.integers(0, NODES - 1),
        st.integers(1, 300),
    ),
    st.builds(
        lambda t, n: f"{{at: {t}s, kind: node_leave, node: {n}}}",
        st.integers(30, 3000),
        st.integers(0, NODES - 1),
    ),
    st.builds(
        lambda t, c: f"{{at: {t}s, kind: node_join, count: {c}}}",
        st.integers(30, 3000),
        st.integers(1, 2),
    ),
    st.builds(
        lambda t, n, lr: f"{{at: {t}s, kind: worker_crash, node: {n}, local_rank: {lr}}}",
        st.integers(30, 3000),
        st.integers(0, NODES - 1),
        st.integers(0, 1),
    ),
)


def scenario_text(faults: list[str], min_nodes: int, spares: int) -> str:
    lines = "\n".join(f"  - {f}" for f in faults) or "  []"
    return f"""name: generated churn
seed: 0
until: 1d
cluster: {{nodes: {NODES}, nproc_per_node: 2, spare_nodes: {spares}}}
job: {{steps: 1500, step_time: 2s, startup_time: 10s, checkpoint_every: 50, checkpoint_time: 3s}}
agent: {{max_restarts: 3}}
rendezvous: {{min_nodes: {min_nodes}, max_nodes: {NODES}, last_call_timeout: 20s,
             heartbeat_timeout: 10s, join_timeout: 15m}}
faults:
{lines}
"""


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    faults=st.lists(fault, max_size=6),
    min_nodes=st.integers(1, NODES),
    spares=st.integers(0, 2),
)
def test_any_churn_keeps_every_invariant(faults: list[str], min_nodes: int, spares: int) -> None:
    text = scenario_text(
        sorted(faults, key=lambda f: int(f.split("at: ")[1].split("s")[0])), min_nodes, spares
    )
    sc = load_scenario_text(text)
    result = simulate(sc, keep_events=True)
    violations = check_all(result.events)
    assert violations == [], text + "\n" + "\n".join(violations)
    assert result.report["state"] in {"SUCCEEDED", "FAILED", "TIMEOUT"}
