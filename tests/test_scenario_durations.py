"""Scenario durations: seconds as numbers, or strings with a unit; exact, never negative."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (0, 0.0),
        (30, 30.0),
        (0.5, 0.5),
        ("0s", 0.0),
        ("500ms", 0.5),
        ("100ms", 0.1),
        ("1ms", 0.001),
        ("2s", 2.0),
        ("0.1s", 0.1),
        ("10m", 600.0),
        ("1.5h", 5400.0),
        ("1.1h", 3960.0),
        ("2d", 172800.0),
        ("7d", 604800.0),
        (" 10 m ", 600.0),
        (".5s", 0.5),
        ("1e3ms", 1.0),
        ("+3s", 3.0),
        ("1h30m", 5400.0),
        ("2m30s", 150.0),
        ("1d2h3m4s5ms", 93784.005),
    ],
)
def test_parse_duration_reads_numbers_and_units_to_float_seconds(
    text: object, seconds: float
) -> None:
    value = parse_duration(text)
    assert value == seconds
    assert isinstance(value, float)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (-1, "not negative"),
        (-0.5, "not negative"),
        ("-2s", "not negative"),
        ("-0.001ms", "not negative"),
        (math.inf, "finite"),
        (math.nan, "finite"),
        ("10", "expected a duration"),  # a string needs a unit
        ("10 minutes", "expected a duration"),
        ("30m1h", "largest to smallest"),
        ("1h1h", "largest to smallest"),
        ("1h30x", "expected a duration"),
        ("s", "expected a duration"),
        ("", "expected a duration"),
        (True, "expected a duration"),
        (None, "expected a duration"),
        ([1], "expected a duration"),
        ("1e999h", "finite"),
    ],
)
def test_parse_duration_refuses_bad_values_saying_what_was_expected(
    value: object, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.1, "100ms"),
        (1.5, "1.5s"),
        (0.0005, "0.0005s"),
        (1e-07, "1e-07s"),
        (30.0, "30s"),
        (90.0, "90s"),
        (600.0, "10m"),
        (5400.0, "90m"),
        (21600.0, "6h"),
        (604800.0, "7d"),
        (3723.123, "3723.123s"),
    ],
)
def test_format_duration_picks_the_largest_exact_unit(seconds: float, text: str | float) -> None:
    assert format_duration(seconds) == text


@given(st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False))
def test_format_duration_round_trips_exactly(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
