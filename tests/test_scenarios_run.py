"""Every file in scenarios/ meets its ``expect:``, keeps every invariant, and replays exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.checks import check_all
from sim.expect import check
from sim.run import simulate
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
SLOW = {"large_gpu_failures_every_3h.yaml"}


# 2,048 nodes for 54 simulated days: about an hour of CPU and more memory than this machine
# has at today's simulator speed (issue 16, item 1); run it with `elastic sim`
TOO_SLOW = {"llama3_405b.yaml"}


def _param(p: Path) -> object:
    marks = [pytest.mark.slow, pytest.mark.timeout(600)] if p.name in SLOW else []
    return pytest.param(p, id=p.stem, marks=marks)


def test_there_are_scenarios_for_each_required_behaviour() -> None:
    names = {p.stem for p in SCENARIOS}
    for required in (
        "clean_run",
        "worker_crash_restarts",
        "budget_exhausted",
        "no_restarts",
        "node_crash_comes_back",
        "two_faults_close_together",
        "pytorch_111646_survivors_reform",
        "dlrover_1534_scale_up_one_round",
        "pytorch_108158_147064_budget_not_bypassed",
        "worker_hang_timer",
        "worker_hang_heartbeat",
        "preemption_with_notice",
        "store_outage_shorter_than_lease",
        "store_outage_longer_than_lease",
        "network_partition_minority_node",
        "network_partition_store_side",
        "slow_node",
        "node_crash_while_round_forms",
    ):
        assert required in names


# TOO_SLOW scenarios (an hour of CPU) are loaded and their fault draws checked by
# tests/test_papers.py and validated by tests/test_schema.py; they are not simulated here
@pytest.mark.parametrize("path", [_param(p) for p in SCENARIOS if p.name not in TOO_SLOW])
def test_scenario_meets_its_expectations_and_invariants(path: Path) -> None:
    sc = load_scenario(path)
    assert list(sc.expect.items()), f"{path.name} expects nothing"
    result = simulate(sc, keep_events=True)
    assert check(sc.expect, result.report) == []
    assert check_all(result.events) == []


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "elastic.cli", "sim", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.timeout(180)
def test_same_file_and_seed_give_byte_identical_json_apart_from_wall_time() -> None:
    f = str(ROOT / "scenarios" / "worker_crash_restarts.yaml")
    a = json.loads(_run_cli(f, "--json", "--seed", "5").stdout)
    b = json.loads(_run_cli(f, "--json", "--seed", "5").stdout)
    a.pop("wall_s")
    b.pop("wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["seed"] == 5
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
        "seed",
        "recovery_s",
        "recovery_s_max",
    ):
        assert key in a
    assert a["goodput"] == pytest.approx(a["steps_done"] * 2.0 / a["sim_time_s"], rel=1e-5)


@pytest.mark.timeout(120)
def test_check_determinism_flag_passes_on_a_random_fault_scenario(tmp_path: Path) -> None:
    f = tmp_path / "rate.yaml"
    f.write_text(
        "name: rate faults\nseed: 3\nuntil: 2d\n"
        "cluster: {nodes: 8, nproc_per_node: 4}\n"
        "job: {steps: 20000, step_time: 2s, startup_time: 30s, checkpoint_every: 200,"
        " checkpoint_time: 10s}\n"
        "agent: {max_restarts: 50}\n"
        "faults:\n  - {kind: worker_crash, every: 2h}\n  - {kind: node_crash, every: 8h,"
        " restart_after: 5m}\n"
        "expect: {state: SUCCEEDED}\n"
    )
    r = _run_cli(
        str(f), "--json", "--check-determinism", "--write-faults", str(tmp_path / "x.yaml")
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert len(report["event_log_sha256"]) == 64
    # the drawn faults, written back as an explicit scenario, replay the same run
    explicit = load_scenario(tmp_path / "x.yaml")
    assert not explicit.has_rate_faults
    again = simulate(explicit)
    assert again.report["sim_time_s"] == report["sim_time_s"]
    assert again.report["restarts"] == report["restarts"]


@pytest.mark.timeout(60)
def test_failed_expectations_exit_1_and_name_each_with_the_value_seen(tmp_path: Path) -> None:
    f = tmp_path / "wrong.yaml"
    f.write_text(
        "name: wrong expectations\ncluster: {nodes: 2, nproc_per_node: 2}\n"
        "job: {steps: 100, step_time: 1s}\n"
        "expect: {state: FAILED, restarts: {min: 2}}\n"
    )
    r = _run_cli(str(f))
    assert r.returncode == 1
    assert "state: expected FAILED, got SUCCEEDED" in r.stdout
    assert "restarts: expected ≥ 2, got 0" in r.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "name: x\ncluster: {nodes: 2, nproc_per_node: 2, nods: 3}\n"
            "job: {steps: 1, step_time: 1s}\n",
            "cluster.nods",
        ),
        (
            "name: x\ncluster: {nodes: 2, nproc_per_node: 2}\njob: {steps: 1, step_time: -1s}\n",
            "job.step_time",
        ),
        (
            "name: x\ncluster: {nodes: 2, nproc_per_node: two}\njob: {steps: 1, step_time: 1s}\n",
            "cluster.nproc_per_node",
        ),
        (
            "name: x\ncluster: {nodes: 2, nproc_per_node: 2}\njob: {steps: 1, step_time: 1s}\n"
            "faults:\n  - {at: 1m, kind: node_crash, node: 9}\n",
            "faults[0].node",
        ),
        (
            "name: x\ncluster: {nodes: 2, nproc_per_node: 2}\njob: {steps: 1, step_time: 1s}\n"
            "faults:\n  - {at: 1m, kind: worker_crsh, node: 0}\n",
            "faults[0].kind",
        ),
        ("name: x\ncluster: {nodes: 2\n", "x.yaml:"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_file_line_and_key(
    tmp_path: Path, text: str, needle: str
) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(text)
    r = _run_cli(str(f))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert needle in lines[0]
    assert str(f) in lines[0]
