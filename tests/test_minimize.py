"""``elastic minimize``: a failing scenario shrunk to the fault (and nodes) that still make
the same expectation fail; a passing scenario refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.expect import check
from sim.minimize import main
from sim.run import simulate
from sim.scenario import FaultKind, load_scenario

FAILING = """
name: a budget of 0 and many faults, one of which spends it
seed: 3
until: 1d
cluster: {nodes: 6, nproc_per_node: 2, spare_nodes: 2}
job: {steps: 3000, step_time: 1s, startup_time: 10s, checkpoint_every: 100, checkpoint_time: 1s}
rendezvous: {min_nodes: 3, max_nodes: 6}
agent: {max_restarts: 0}
faults:
  - {at: 100s, kind: slow_node, node: 1, factor: 1.5, duration: 5m}
  - {kind: slow_node, every: 10m, factor: 1.2, duration: 1m}
  - {at: 1000s, kind: store_outage, duration: 2s}
  - {at: 1500s, kind: worker_crash, node: 4, local_rank: 1}
  - {at: 2000s, kind: slow_node, node: 2, factor: 2, duration: 1m}
expect:
  state: SUCCEEDED
"""


def test_a_failing_scenario_shrinks_to_the_fault_that_fails_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(FAILING, encoding="utf-8")
    out = tmp_path / "small.yaml"
    assert main([str(path), "-o", str(out)]) == 0
    assert "state: expected SUCCEEDED, got FAILED" in capsys.readouterr().out
    small = load_scenario(out)
    assert [f.kind for f in small.faults] == [FaultKind.WORKER_CRASH]
    assert small.cluster.nodes == 1 and small.cluster.spare_nodes == 0
    # the file it wrote fails the same way when run on its own
    assert check(small.expect, simulate(small).report) == ["state: expected SUCCEEDED, got FAILED"]


def test_a_passing_scenario_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(FAILING.replace("max_restarts: 0", "max_restarts: 5"), encoding="utf-8")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "its expectations hold" in err and err.count("\n") == 1
    assert not (tmp_path / "ok.min.yaml").exists()
