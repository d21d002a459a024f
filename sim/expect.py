"""Expected outcomes of a scenario, and the check of a run's report against them.

A scenario's ``expect:`` section names report keys (:data:`EXPECT_KEYS`) and, for each, an
exact value or a ``{min: x, max: y}`` range (either end optional).  :func:`check` is a pure
function of the expectation and the report dict: it returns one human line per failed
expectation, naming the key, what was expected and the value seen; an empty list means the
run met every expectation.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields

__all__ = [
    "COUNT_KEYS",
    "EXPECT_KEYS",
    "SECONDS_KEYS",
    "Bound",
    "ExpectedState",
    "Expectation",
    "check",
]


class ExpectedState(enum.StrEnum):
    """How a run ends: the agents' final state, or ``TIMEOUT`` when the simulation hit ``until``."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNHEALTHY = "UNHEALTHY"
    TIMEOUT = "TIMEOUT"


#: Report keys whose values are counts (non-negative integers).
COUNT_KEYS = (
    "restarts",
    "membership_restarts",
    "rendezvous_rounds",
    "world_size",
    "steps_done",
    "events",
    "recovery_count",
    "hangs_detected",
    "final_nodes",
)
#: Report keys whose values are seconds (numbers; durations like ``2m`` are accepted).
SECONDS_KEYS = ("sim_time_s", "recovery_s_max")
#: Every key ``expect:`` accepts, in the order they are checked and written.
EXPECT_KEYS = ("state", *COUNT_KEYS, *SECONDS_KEYS, "goodput", "ettr")


@dataclass(frozen=True, slots=True)
class Bound:
    """An exact value, or a range with an optional ``min`` and ``max`` (both inclusive).

    Exactly one form is used: ``exact`` alone, or ``min`` and/or ``max``.  Floats compare
    exactly within a relative tolerance of 1e-9 (sums of float seconds are not exact).
    """

    exact: int | float | None = None
    min: int | float | None = None
    max: int | float | None = None

    def holds(self, value: int | float) -> bool:
        """Whether ``value`` satisfies this bound."""
        if self.exact is not None:
            if isinstance(self.exact, int) and isinstance(value, int):
                return value == self.exact
            return math.isclose(value, self.exact, rel_tol=1e-9, abs_tol=1e-12)
        if self.min is not None and value < self.min:
            return False
        return not (self.max is not None and value > self.max)

    def describe(self) -> str:
        """The expectation in words: ``1``, ``≥ 0.9``, ``≤ 120``, ``between 1 and 2``."""
        if self.exact is not None:
            return _number(self.exact)
        if self.min is not None and self.max is not None:
            return f"between {_number(self.min)} and {_number(self.max)}"
        if self.min is not None:
            return f"≥ {_number(self.min)}"
        if self.max is not None:
            return f"≤ {_number(self.max)}"
        return "anything"


@dataclass(frozen=True, slots=True)
class Expectation:
    """What a scenario expects of its run's report; ``None`` fields are not checked."""

    state: ExpectedState | None = None
    restarts: Bound | None = None
    membership_restarts: Bound | None = None
    rendezvous_rounds: Bound | None = None
    world_size: Bound | None = None
    steps_done: Bound | None = None
    events: Bound | None = None
    recovery_count: Bound | None = None
    hangs_detected: Bound | None = None
    final_nodes: Bound | None = None
    sim_time_s: Bound | None = None
    recovery_s_max: Bound | None = None
    goodput: Bound | None = None
    # effective training time ratio (sim/losses.py), a fraction like goodput
    ettr: Bound | None = None

    def items(self) -> Iterator[tuple[str, ExpectedState | Bound]]:
        """The expectations that are set, as ``(key, value)`` in :data:`EXPECT_KEYS` order."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                yield f.name, value


def check(expect: Expectation, report: Mapping[str, object]) -> list[str]:
    """Return one line per expectation the ``report`` fails, e.g. ``restarts: expected 1, got 2``.

    A key missing from the report, or holding ``None`` or a non-number, fails its expectation
    (``got nothing``): a report that cannot show the expected value has not met it.
    """
    failures: list[str] = []
    for key, wanted in expect.items():
        present = key in report
        seen = report.get(key)
        if isinstance(wanted, ExpectedState):
            got = _state_name(seen)
            if got != wanted.value:
                shown = got if got is not None else _seen(seen, present, key)
                failures.append(f"{key}: expected {wanted.value}, got {shown}")
            continue
        if isinstance(seen, bool) or not isinstance(seen, int | float):
            failures.append(f"{key}: expected {wanted.describe()}, got {_seen(seen, present, key)}")
        elif not wanted.holds(seen):
            failures.append(f"{key}: expected {wanted.describe()}, got {_number(seen)}")
    return failures


def _state_name(value: object) -> str | None:
    # the runner may report an enum (WorkerState / ExpectedState) or its name as a string
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, str):
        return value
    return None


def _seen(value: object, present: bool, key: str) -> str:
    if not present:
        return f"nothing (the report has no {key!r})"
    if value is None:
        return "nothing (None)"
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number(value)
    return repr(value)


def _number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return format(value, ".12g")
    return str(value)
