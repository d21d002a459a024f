"""Durations in scenario files: a number of seconds, or a string with a unit.

Accepted: an ``int`` or ``float`` number of seconds (``30``, ``0.5``) or a string made of a
number and one unit, ``ms``, ``s``, ``m``, ``h`` or ``d`` (``"500ms"``, ``"1.5h"``,
``"10 m"``), or several such parts from the largest unit down (``"1h30m"``, ``"2m30s"``).
Values are returned as ``float`` seconds.

Guarantees:

- the conversion is exact to the nearest float: the number is read as a decimal and scaled
  before rounding once, so ``"100ms"`` is ``0.1`` and ``"1.1h"`` is ``3960.0``;
- negative, non-finite (``.inf``, ``.nan``) and boolean values are refused with a
  :class:`ValueError` whose message says what was expected;
- ``parse_duration(format_duration(x)) == x`` for every finite ``x >= 0``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

__all__ = ["DURATION_EXPECTED", "UNITS", "format_duration", "parse_duration"]

#: Seconds per unit, largest first (``format_duration`` tries them in this order).
UNITS: dict[str, Decimal] = {
    "d": Decimal(86400),
    "h": Decimal(3600),
    "m": Decimal(60),
    "s": Decimal(1),
    "ms": Decimal("0.001"),
}

DURATION_EXPECTED = (
    "a duration: seconds as a number, or a string like '500ms', '30s', '10m', '1.5h', '2d', '1h30m'"
)
_ORDER = ("d", "h", "m", "s", "ms")
_PART_RE = re.compile(r"\s*(\d+\.?\d*|\.\d+)\s*(ms|s|m|h|d)")

_DURATION_RE = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(ms|s|m|h|d)\s*")


def parse_duration(value: object) -> float:
    """Return ``value`` as float seconds; raise :class:`ValueError` saying what was expected."""
    if isinstance(value, bool):
        # bool is an int subclass; YAML turns "yes"/"on" into True, never a duration
        raise ValueError(f"expected {DURATION_EXPECTED}")
    if isinstance(value, int | float):
        try:
            value = float(value)
        except OverflowError:  # an integer beyond float's range (10**400)
            raise ValueError(f"expected {DURATION_EXPECTED} (finite)") from None
        if not math.isfinite(value):
            raise ValueError(f"expected {DURATION_EXPECTED} (finite)")
        if value < 0:
            raise ValueError(f"expected {DURATION_EXPECTED}, not negative")
        return float(value)
    if isinstance(value, str):
        match = _DURATION_RE.fullmatch(value)
        if match is None:
            return _compound(value)
        try:
            number = Decimal(match.group(1))
        except InvalidOperation:  # pragma: no cover - the regex admits only decimals
            raise ValueError(f"expected {DURATION_EXPECTED}") from None
        if number < 0:
            raise ValueError(f"expected {DURATION_EXPECTED}, not negative")
        seconds = float(number * UNITS[match.group(2)])
        if not math.isfinite(seconds):
            raise ValueError(f"expected {DURATION_EXPECTED} (finite)")
        return seconds
    raise ValueError(f"expected {DURATION_EXPECTED}")


def _compound(value: str) -> float:
    """``"1h30m"``: parts in decreasing units, each unit once, no signs."""
    pos, total, last = 0, Decimal(0), -1
    text = value.rstrip()
    while pos < len(text):
        m = _PART_RE.match(text, pos)
        if m is None:
            raise ValueError(f"expected {DURATION_EXPECTED}")
        rank = _ORDER.index(m.group(2))
        if rank <= last:
            raise ValueError(f"expected {DURATION_EXPECTED} (units from largest to smallest)")
        last = rank
        total += Decimal(m.group(1)) * UNITS[m.group(2)]
        pos = m.end()
    if last < 0:
        raise ValueError(f"expected {DURATION_EXPECTED}")
    seconds = float(total)
    if not math.isfinite(seconds):
        raise ValueError(f"expected {DURATION_EXPECTED} (finite)")
    return seconds


def format_duration(seconds: float) -> str | float:
    """Return a readable exact spelling of ``seconds``: ``"10m"``, ``"100ms"``, ``"3723.123s"``.

    Whole days, hours, minutes or seconds use that unit; under a second, whole milliseconds
    use ``ms``; anything else is written in seconds.  The result always parses back to
    exactly ``seconds`` (a plain float is returned in the rare case no string does).
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot format {seconds!r} as a duration")
    seconds = float(seconds)
    if seconds == 0:
        return "0s"
    exact = Decimal(repr(seconds))
    candidates: list[str] = []
    for unit, scale in UNITS.items():
        count = exact / scale
        if count == count.to_integral_value() and count >= 1:
            if unit != "ms" or seconds < 1:
                candidates.append(f"{int(count)}{unit}")
            break
    candidates.append(f"{seconds!r}s")
    for text in candidates:
        if parse_duration(text) == seconds:
            return text
    return seconds
