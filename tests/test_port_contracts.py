"""The clock port keeps the same promises in both worlds.

The promises are the shipped conformance suite, :mod:`elastic.testing.clock` (as the
store port's are :mod:`elastic.testing.store`, run against every store by
tests/test_store_conformance.py).  Every check runs twice, on asyncio (real) and on simpy
(sim), through the same body: real timings are checked with a tolerance, the
simulator's are exact.  Each check is also shown to fail on a clock that breaks its
promise, so none of them can pass vacuously.
"""

from __future__ import annotations

from typing import Any

import pytest

from elastic.clock import Clock
from elastic.testing.clock import ALL_CHECKS, ClockCheck
from tests.worlds import run_in

SLACK = {"real": 0.05, "sim": 0.0}


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_the_clock_passes(world: str, check: ClockCheck) -> None:
    async def body(clock: Clock) -> None:
        await check(clock, SLACK[world])

    run_in(world, body)


class _SleepsTooLong:
    """A clock whose sleeps last twice as long as asked (everything else is the real one)."""

    def __init__(self, inner: Clock) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def sleep(self, d: float) -> None:
        await self._inner.sleep(2 * d)


def test_a_clock_that_sleeps_too_long_fails_the_sleep_check() -> None:
    async def body(clock: Clock) -> None:
        with pytest.raises(AssertionError, match="sleep took"):
            await ALL_CHECKS[0](_SleepsTooLong(clock), 0.0)  # type: ignore[arg-type]

    run_in("sim", body)


def test_a_clock_that_keeps_every_unobserved_failure_fails_the_cap_check(world: str) -> None:
    from elastic.clock import note_unobserved
    from elastic.testing.clock import (
        check_unobserved_failures_are_kept_up_to_the_cap_and_counted_beyond as check,
    )

    def uncapped(clock: Any, name: str, exc: BaseException) -> None:
        clock.unobserved.append((name, exc))

    async def body(clock: Clock) -> None:
        with pytest.raises(AssertionError):
            await check(clock, SLACK[world])
        clock.unobserved.clear()  # what the failed check left: the point of this test

    import elastic.real.clock
    import sim.clock

    mp = pytest.MonkeyPatch()
    for module in (elastic.real.clock, sim.clock):
        assert module.note_unobserved is note_unobserved
        mp.setattr(module, "note_unobserved", uncapped)
    try:
        run_in(world, body)
    finally:
        mp.undo()
