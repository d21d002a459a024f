"""A timer server's kill reads the same in both worlds: the simulator emits what real mode's
timer server reports through its agent (``agent.watchdog`` events, torch's names and
fields), and the report counts the kill as a hang detected in either log."""

from __future__ import annotations

from pathlib import Path

from elastic.events import AgentEvent, kinds
from sim.report import build_report
from sim.run import simulate
from sim.scenario.reader import load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"

FIELDS = {"watchdog_event", "worker_pid", "scope_id", "expiration_time", "signal"}


def test_a_simulated_timer_kill_is_real_mode_s_two_watchdog_events() -> None:
    sc = load_scenario(SCENARIOS / "fidelity_hang_timer.yaml")
    result = simulate(sc, keep_events=True)
    assert result.events is not None
    dog = [e for e in result.events if e.kind == kinds.AGENT_WATCHDOG]
    assert [e.fields["watchdog_event"] for e in dog] == ["timer expired", "kill worker process"]
    for e in dog:
        assert set(e.fields) == FIELDS and e.rank is None
        assert e.fields["signal"] == 9 and e.fields["scope_id"] == "train_step"
    started = next(e for e in result.events if e.kind == kinds.AGENT_GROUP_STARTED)
    assert {e.role for e in dog} == {started.role} and {e.node for e in dog} == {1}
    # the expiry is the step's timer: 15 s after the start of the step the worker hung in
    # (50 s, plus the calibrated latencies), and the kill comes at it
    expired = dog[0].fields["expiration_time"]
    assert 65.0 <= expired < 65.1 and dog[0].t == dog[1].t >= expired
    assert result.report["hangs_detected"] == 1


def test_the_report_counts_a_kill_not_the_watchdog_s_other_events() -> None:
    def dog(t: float, name: str) -> AgentEvent:
        return AgentEvent(t, 0, kinds.AGENT_WATCHDOG, "trainer", None, {"watchdog_event": name})

    log = [
        dog(1, "watchdog started"),
        dog(5, "timer expired"),
        dog(5, "kill worker process"),
        dog(9, "watchdog stopped"),
    ]
    assert build_report(log)["hangs_detected"] == 1
