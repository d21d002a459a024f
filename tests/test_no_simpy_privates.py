"""The simulator uses simpy through its public API only (issue 18): no reading or writing
an event's or environment's private attributes (``_ok``, ``_value``, ``_queue``, ``_eid``,
``_now``, ...), so a simpy release that renames them cannot silently change a run.  The one
name simpy's ``Process`` itself requires of an environment, ``_active_proc``, is defined by
``sim.clock._Env`` on itself (``self._active_proc``) and read nowhere else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the private attributes of simpy's Environment, Event, Timeout, Process and Condition
SIMPY_PRIVATES = re.compile(
    r"\._(queue|eid|now|ok|value|defused|delay|generator|target|events|"
    r"evaluate|resume|interrupt|desc|build_value|check|populate_value|remove_check_callbacks)\b"
)
ACTIVE_PROC = re.compile(r"(?<!\bself)\._active_proc\b")


def _offences(text: str) -> list[str]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        if SIMPY_PRIVATES.search(line) or ACTIVE_PROC.search(line):
            found.append(f"{n}: {line.strip()}")
    return found


def test_the_simulator_reads_no_simpy_private_attribute() -> None:
    offences = {
        str(p.relative_to(ROOT)): bad
        for p in sorted((ROOT / "sim").rglob("*.py"))
        if (bad := _offences(p.read_text()))
    }
    assert offences == {}


def test_the_check_catches_what_the_clock_used_to_do() -> None:
    # the lines sim/clock.py had before it got an environment of its own
    before = [
        "ev._ok, ev._value = True, None",
        "self._entries = self._queue",
        "heappush(self._entries, (t, priority, next(self._eid), batch))",
        "return env._now if type(env) is _Env else float(env.now)",
        "if not event._ok and not hasattr(event, '_defused'):",
        "env._active_proc = None",
    ]
    assert all(_offences(line) for line in before)
    assert _offences("self._active_proc: Process | None = None") == []
    assert _offences("failure = event.value  # public") == []
