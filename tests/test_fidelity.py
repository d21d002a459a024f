"""One scenario, both worlds: ``elastic real``, the model worker, calibration, ``elastic compare``.

The real-process tests run scenarios at ``--time-scale 10`` (≈15 s each), have a
time limit, and leave no process behind (the ``tag`` fixture: every process started
inherits the test's tag).  Their tolerance is looser than the benchmark's
(bench/bench_fidelity.py) because up to six test sessions share this machine's two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.errors import ConfigError
from elastic.events import AgentEvent
from elastic.real.model_worker import ConfigProblem, load_config
from sim.calibration import Calibration, load_calibration, scenario_calibration
from sim.compare import compare, fault_recoveries, within
from sim.realrun import refusal
from sim.run import simulate
from sim.scenario import expand_faults, fault_rng, load_scenario, load_scenario_text
from tests.test_run_cli import TAG, tag

__all__ = ["tag"]  # the fixture, re-exported for pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

SMALL = """
name: small
until: 1h
cluster: {nodes: 2, nproc_per_node: 1}
job: {steps: 60, step_time: 1s, startup_time: 10s, checkpoint_every: 20, checkpoint_time: 1s}
rendezvous: {min_nodes: 2, max_nodes: 2, heartbeat_timeout: 5s, last_call_timeout: 1s}
faults:
  - {at: 30s, kind: %s}
"""


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "elastic.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


# -- refusals and bad input ------------------------------------------------------------


def test_a_fault_real_mode_cannot_do_is_refused_with_the_reason() -> None:
    sc = load_scenario_text(SMALL % "gpu_error, node: 1")
    reason = refusal(sc, expand_faults(sc, fault_rng(0)))
    assert reason is not None and "no GPU to fail" in reason


def _no_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    import elastic.real.netns

    monkeypatch.setattr(elastic.real.netns, "available", lambda: "network namespaces need root")


def test_a_partition_without_namespaces_is_refused_naming_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sc = load_scenario_text(SMALL % "network_partition, nodes: [1], duration: 5s")
    _no_namespaces(monkeypatch)
    reason = refusal(sc, expand_faults(sc, fault_rng(0)))
    assert reason is not None and "network_partition at 30s" in reason
    assert "network namespaces need root" in reason


def test_elastic_real_refuses_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(SMALL % "network_partition, nodes: [1], duration: 5s")
    from sim.realrun import main

    _no_namespaces(monkeypatch)
    r = _cli_main(main, [str(f), "--time-scale", "10"])
    assert r == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need root" in err, err


def _cli_main(main: object, argv: list[str]) -> int:
    assert callable(main)
    code = main(argv)
    assert isinstance(code, int)
    return code


def test_static_backend_is_refused() -> None:
    sc = load_scenario_text(
        (SMALL % "node_leave, node: 1").replace("min_nodes", "backend: static, min_nodes")
    )
    reason = refusal(sc, [])
    assert reason is not None and "rendezvous.backend" in reason


def test_model_worker_config_is_checked_field_by_field(tmp_path: Path) -> None:
    good = {"t0": 1.0, "time_scale": 10, "dir": "d", "events": "e", "steps": 5, "step_time": 1}
    p = tmp_path / "c.json"
    p.write_text(json.dumps(good))
    assert load_config(str(p)).steps == 5
    for key, bad in [("steps", 0), ("step_time", -1), ("time_scale", 0), ("steps", True)]:
        p.write_text(json.dumps(good | {key: bad}))
        with pytest.raises(ConfigProblem, match=key):
            load_config(str(p))
    p.write_text(json.dumps(good | {"faults": [{"kind": "node_crash", "at": 1, "node": 0}]}))
    with pytest.raises(ConfigProblem, match="faults"):
        load_config(str(p))


def test_model_worker_without_config_says_so_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_MODEL")}
    r = subprocess.run(
        [sys.executable, "-m", "elastic.real.model_worker"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--config" in r.stderr


def test_a_bad_calibration_file_is_one_line_naming_the_key(tmp_path: Path) -> None:
    p = tmp_path / "cal.json"
    p.write_text(json.dumps({"version": 1, "spawn_s": 0.01, "stop_s": -1, "reaction_s": 0,
                             "store_rtt_s": 0}))  # fmt: skip
    with pytest.raises(ConfigError, match="stop_s: got -1"):
        load_calibration(p)
    p.write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        load_calibration(p)
    f = tmp_path / "s.yaml"
    f.write_text((SMALL % "node_leave, node: 1") + f"calibration: {p.name}\n")
    r = _cli("sim", str(f))
    assert r.returncode == 2 and "calibration" in r.stderr and "Traceback" not in r.stderr


# -- calibration in the simulator ------------------------------------------------------


def test_calibration_scales_into_the_simulated_recovery() -> None:
    sc = load_scenario_text(SMALL % "worker_crash, node: 1, local_rank: 0")

    def recovery(cal: Calibration, k: float) -> float:
        return float(simulate(sc, calibration=cal, time_scale=k).report["recovery_s"][0])

    bare = Calibration(spawn_s=0.0, stop_s=0.0, reaction_s=0.0, store_rtt_s=0.0002)
    cal = Calibration(spawn_s=0.02, stop_s=0.01, reaction_s=0.002, store_rtt_s=0.0002)
    # the exit notice, node 0's stop and the spawn are on the recovery's path (node 1's
    # only worker crashed: nothing to stop there); times K at time scale K
    assert recovery(cal, 1) - recovery(bare, 1) == pytest.approx(0.032, abs=0.002)
    assert recovery(cal, 10) - recovery(bare, 10) == pytest.approx(0.32, abs=0.02)
    # and the store's latency is half the round trip, times K
    slow = Calibration(spawn_s=0.0, stop_s=0.0, reaction_s=0.0, store_rtt_s=0.002)
    assert recovery(slow, 10) > recovery(bare, 10) + 0.05


def test_a_scenario_names_its_calibration_relative_to_itself(tmp_path: Path) -> None:
    cal = Calibration(spawn_s=0.01, stop_s=0.01, reaction_s=0.0, store_rtt_s=0.0001)
    (tmp_path / "c.json").write_text(json.dumps(cal.to_dict()))
    f = tmp_path / "s.yaml"
    f.write_text((SMALL % "node_leave, node: 1") + "calibration: c.json\n")
    sc = load_scenario(f)
    assert scenario_calibration(sc) == cal
    assert load_scenario_text(sc.to_yaml()).calibration == "c.json"


def test_the_six_fidelity_scenarios_name_the_committed_calibration() -> None:
    for name in ("worker_crash", "node_crash_spare", "scale_up", "hang_timer",
                 "hang_heartbeat", "graceful_leave"):  # fmt: skip
        sc = load_scenario(SCENARIOS / f"fidelity_{name}.yaml")
        assert scenario_calibration(sc) is not None


# -- per-fault recovery ----------------------------------------------------------------


def test_recovery_is_attributed_to_the_fault_that_broke_the_world() -> None:
    def ev(t: float, kind: str, **f: object) -> AgentEvent:
        return AgentEvent(t, "sim", kind, fields=f)

    log = [
        ev(10, "sim.fault", fault="node_join", index=0),  # broke nothing before the next
        ev(20, "sim.world_broken"),
        ev(20, "sim.fault", fault="worker_crash", index=1, target=1),
        ev(31.5, "sim.world_running"),
    ]
    rows = fault_recoveries(log)
    assert [r["recovery_s"] for r in rows] == [None, 11.5]
    assert within(0.52, 0.5, 0.10, 0.05) and within(0.53, 0.5, 0.10, 0.05)
    assert not within(11.0, 10.0, 0.05, 0.05)


# -- real processes --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
# fidelity_hang_timer: the timer server's kill is one agent.watchdog event in both worlds
# (hangs_detected is compared exactly)
@pytest.mark.parametrize(
    "name", ["fidelity_worker_crash", "fidelity_graceful_leave", "fidelity_hang_timer"]
)
def test_real_and_simulated_recovery_agree(
    name: str, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TAG, tag)  # every process of the run inherits it: the sweep finds them
    sc = load_scenario(SCENARIOS / f"{name}.yaml")
    cal = scenario_calibration(sc)
    c = compare(sc, 10.0, cal, tolerance=0.25, floor=0.25)
    assert c.mismatches == [], c.table()
    assert c.real["state"] == "SUCCEEDED" and c.real["steps_done"] == sc.job.steps
    assert [r["ok"] for r in c.faults] == [True], c.table()


@pytest.mark.timeout(60)
def test_an_announced_store_outage_expires_no_lease(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import signal
    import time

    from elastic.real.clock import AsyncioClock
    from elastic.real.netstore import NetStoreClient

    monkeypatch.setenv(TAG, tag)
    outage = tmp_path / "outage"
    p = subprocess.Popen(
        [sys.executable, "-m", "elastic.real.netstore_host", "--outage-file", str(outage)],
        stdout=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None
        port = int(p.stdout.readline().decode().rsplit(":", 1)[1])

        async def main() -> tuple[bytes | None, bytes | None]:
            c = await NetStoreClient.connect(
                "127.0.0.1", port, token=None, clock=AsyncioClock(), connect_timeout=10,
                read_timeout=30,
            )  # fmt: skip
            try:
                seen = []
                for announce in (True, False):
                    lease = await c.grant_lease(0.5)
                    await c.set("k", b"v", lease=lease)
                    if announce:
                        outage.write_text("1.6")
                        p.send_signal(signal.SIGUSR1)
                        await asyncio.sleep(0.05)
                    p.send_signal(signal.SIGSTOP)
                    time.sleep(1.5)  # blocks the client too: it renews nothing meanwhile
                    p.send_signal(signal.SIGCONT)
                    await asyncio.sleep(0.1)
                    seen.append(await c.try_get("k"))
                    await lease.revoke()
                return seen[0], seen[1]
            finally:
                await c.aclose()

        announced, unannounced = asyncio.run(main())
        assert announced == b"v"  # the outage expired nobody's lease
        assert unannounced is None  # a plain stop: the lease ran out while stopped
    finally:
        p.send_signal(signal.SIGCONT)
        p.terminate()
        p.wait(timeout=10)
        assert p.stdout is not None
        p.stdout.close()


@pytest.mark.timeout(60)
def _start_real(scenario: str, tag: str) -> subprocess.Popen[str]:
    """``elastic real SCENARIO --time-scale 10`` in the background (stderr kept)."""
    code = "import sys; from sim.realrun import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, str(SCENARIOS / scenario), "--time-scale", "10"],
        env=dict(os.environ, **{TAG: tag}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_killed_elastic_real_leaves_nothing_running(sig: str, tag: str) -> None:
    import signal
    import time

    import psutil

    p = _start_real("fidelity_worker_crash.yaml", tag)
    # the run has started its store host (after its SIGTERM handler); then a moment for
    # the agents and their workers
    proc, deadline = psutil.Process(p.pid), time.monotonic() + 40

    def hosting() -> bool:
        for c in proc.children(recursive=True):
            try:
                if "elastic.real.netstore_host" in " ".join(c.cmdline()):
                    return True
            except psutil.Error:  # a child that ended meanwhile
                continue
        return False

    while not hosting():
        assert time.monotonic() < deadline and p.poll() is None, p.stderr
        time.sleep(0.05)
    time.sleep(2)
    p.send_signal(getattr(signal, sig))
    _, err = p.communicate(timeout=30)
    if sig == "SIGTERM":
        assert p.returncode == 130 and "interrupted" in err
    # the tag fixture fails the test if an agent, worker or the store host is left


# -- a partition, for real (network namespaces) ----------------------------------------


def _namespaces_of(pid: int) -> list[str]:
    """Namespaces and TAP devices a run in process ``pid`` made that still exist."""
    from elastic.real import netns

    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    dev = f"elt{pid % 100000}x"
    return [w for w in names.split() if w.startswith(f"{netns._PREFIX}{pid}_")] + [
        ln for ln in links.splitlines() if dev in ln
    ]


def _need_namespaces() -> None:
    from elastic.real import netns

    why = netns.available()
    if why is not None:
        pytest.skip(why)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_partition_cut_for_real_recovers_as_simulated_and_leaves_no_namespace(
    tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _need_namespaces()
    monkeypatch.setenv(TAG, tag)
    sc = load_scenario(SCENARIOS / "fidelity_partition_minority.yaml")
    c = compare(sc, 10.0, scenario_calibration(sc), tolerance=0.25, floor=0.25)
    assert c.mismatches == [], c.table()
    assert c.real["state"] == "SUCCEEDED" and c.real["final_nodes"] == 3
    assert [r["ok"] for r in c.faults] == [True], c.table()
    # the cut node's lease expired on the store's side (the others re-formed without it)
    # and it rejoined at the heal: two recoveries in both worlds
    assert c.real["recovery_count"] == c.sim["recovery_count"] == 2
    assert _namespaces_of(os.getpid()) == []


@pytest.mark.timeout(120)
def test_elastic_real_stopped_during_a_cut_leaves_no_namespace_and_no_process(tag: str) -> None:
    import signal
    import time

    import psutil

    _need_namespaces()
    p = _start_real("fidelity_partition_store_side.yaml", tag)
    time.sleep(7.5)  # the cut: scenario 50..90 s, wall 5..9 s after the agents' 1.5 s lead
    assert _namespaces_of(p.pid) != []
    p.send_signal(signal.SIGTERM)
    try:
        # (a loaded machine, the suite's other worker busy too, once took over 30 s)
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        tree = [" ".join(c.cmdline()[:4]) for c in psutil.Process(p.pid).children(True)]
        p.kill()
        p.communicate()
        raise AssertionError(f"not stopped 60 s after SIGTERM; its processes: {tree}") from None
    assert p.returncode == 130 and "interrupted" in err, err
    assert _namespaces_of(p.pid) == []
    # the tag fixture fails the test if an agent, worker or the store host is left
