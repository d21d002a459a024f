"""check(expect, report): one human line per failed expectation, with the value seen."""

from __future__ import annotations

import enum

import pytest

from sim.expect import EXPECT_KEYS, Bound, Expectation, ExpectedState, check
from sim.scenario import load_scenario_text

MINIMAL = "cluster: {nodes: 2, nproc_per_node: 1}\njob: {steps: 10, step_time: 1s}\n"


def expectation(text: str) -> Expectation:
    return load_scenario_text(MINIMAL + "expect:\n" + text).expect


def test_a_report_meeting_every_expectation_gives_no_lines() -> None:
    expect = expectation(
        "  state: SUCCEEDED\n  restarts: 1\n  goodput: {min: 0.9}\n"
        "  recovery_s_max: {max: 2m}\n  world_size: {min: 8, max: 16}\n"
    )
    report = {
        "state": "SUCCEEDED",
        "restarts": 1,
        "goodput": 0.95,
        "recovery_s_max": 120.0,
        "world_size": 16,
        "unrelated": "ignored",
    }
    assert check(expect, report) == []


@pytest.mark.parametrize(
    ("expect", "report", "line"),
    [
        ("restarts: 1", {"restarts": 2}, "restarts: expected 1, got 2"),
        ("goodput: {min: 0.9}", {"goodput": 0.84}, "goodput: expected ≥ 0.9, got 0.84"),
        (
            "recovery_s_max: {max: 120}",
            {"recovery_s_max": 130.5},
            "recovery_s_max: expected ≤ 120, got 130.5",
        ),
        (
            "restarts: {min: 1, max: 2}",
            {"restarts": 3},
            "restarts: expected between 1 and 2, got 3",
        ),
        (
            "restarts: {min: 1, max: 2}",
            {"restarts": 0},
            "restarts: expected between 1 and 2, got 0",
        ),
        ("state: SUCCEEDED", {"state": "FAILED"}, "state: expected SUCCEEDED, got FAILED"),
        (
            "state: TIMEOUT",
            {"state": ExpectedState.SUCCEEDED},
            "state: expected TIMEOUT, got SUCCEEDED",
        ),
        (
            "world_size: 16",
            {},
            "world_size: expected 16, got nothing (the report has no 'world_size')",
        ),
        (
            "hangs_detected: 1",
            {"hangs_detected": None},
            "hangs_detected: expected 1, got nothing (None)",
        ),
        ("steps_done: 10", {"steps_done": "10"}, "steps_done: expected 10, got '10'"),
        ("events: {min: 1}", {"events": True}, "events: expected ≥ 1, got True"),
        (
            "sim_time_s: {max: 1h}",
            {"sim_time_s": 3600.5},
            "sim_time_s: expected ≤ 3600, got 3600.5",
        ),
        (
            "state: SUCCEEDED",
            {},
            "state: expected SUCCEEDED, got nothing (the report has no 'state')",
        ),
    ],
)
def test_a_failed_expectation_gives_one_line_with_the_value_seen(
    expect: str, report: dict[str, object], line: str
) -> None:
    assert check(expectation(f"  {expect}\n"), report) == [line]


def test_every_failed_expectation_gets_its_own_line_in_key_order() -> None:
    expect = expectation("  goodput: {min: 0.5}\n  restarts: 0\n  state: SUCCEEDED\n")
    lines = check(expect, {"state": "FAILED", "restarts": 3, "goodput": 0.1})
    assert [line.split(":")[0] for line in lines] == ["state", "restarts", "goodput"]


def test_state_may_be_reported_as_any_enum_with_the_expected_name() -> None:
    class WorkerState(enum.Enum):
        SUCCEEDED = 4
        FAILED = 5

    expect = expectation("  state: SUCCEEDED\n")
    assert check(expect, {"state": WorkerState.SUCCEEDED}) == []
    assert check(expect, {"state": WorkerState.FAILED}) == ["state: expected SUCCEEDED, got FAILED"]


def test_float_exact_values_compare_within_rounding_and_ints_exactly() -> None:
    assert Bound(exact=0.3).holds(0.1 + 0.2)
    assert not Bound(exact=0.3).holds(0.31)
    assert Bound(exact=2).holds(2)
    assert not Bound(exact=2).holds(3)
    assert Bound(min=1, max=1).holds(1)


def test_expectation_lists_every_report_key_the_scenario_accepts() -> None:
    assert set(EXPECT_KEYS) == {
        "state",
        "restarts",
        "membership_restarts",
        "rendezvous_rounds",
        "world_size",
        "steps_done",
        "sim_time_s",
        "goodput",
        "ettr",
        "events",
        "recovery_s_max",
        "recovery_count",
        "hangs_detected",
        "final_nodes",
    }
    assert [f for f in Expectation.__dataclass_fields__] == list(EXPECT_KEYS)
