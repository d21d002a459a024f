"""The Clock port's conformance suite: what every clock promises, as runnable checks.

Each check is ``async def check_…(clock, slack) -> None``, awaited inside the clock's own
world (an asyncio loop for :class:`~elastic.real.clock.AsyncioClock`, a simulation for
the simulator's clock); it raises :class:`AssertionError` when the clock breaks a promise
of :mod:`elastic.clock`.  ``slack`` is how late a timed wake-up may be (``0``: the world's
time is exact, as in a simulator).  Durations are short (:data:`D`) so a real clock's run
stays fast.

Run them all with :func:`check_clock`, or one by one from :data:`ALL_CHECKS`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from elastic.clock import Cancelled, Clock, Task

__all__ = ["ALL_CHECKS", "D", "ClockCheck", "check_clock"]

D = 0.05  # a short duration, in seconds of either world

ClockCheck = Callable[[Clock, float], Awaitable[None]]


def _assert_close(slack: float, what: str, seen: float, want: float) -> None:
    ok = abs(seen - want) < 1e-9 if slack == 0 else want - 1e-3 <= seen <= want + slack
    assert ok, f"{what} took {seen:.4f}s, expected {want:.4f}s"


async def check_sleep_resumes_after_the_duration(clock: Clock, slack: float) -> None:
    t0 = clock.now()
    await clock.sleep(D)
    _assert_close(slack, "sleep", clock.now() - t0, D)


async def check_cancel_reaches_finally_and_join_raises_cancelled(
    clock: Clock, slack: float
) -> None:
    log: list[str] = []

    async def victim() -> None:
        try:
            await clock.sleep(100)
        finally:
            log.append("finally")

    t = clock.spawn(victim())
    await clock.sleep(D)
    t.cancel()
    try:
        await t.join()
    except Cancelled:
        log.append("join raised Cancelled")
    assert t.done()
    assert log == ["finally", "join raised Cancelled"], log


async def check_cancelled_is_the_ports_own_type(clock: Clock, slack: float) -> None:
    async def victim() -> None:
        await clock.sleep(100)

    t = clock.spawn(victim())
    await clock.sleep(0)
    t.cancel()
    try:
        await t.join()
    except BaseException as e:
        assert type(e) is Cancelled, f"join raised {type(e).__name__}, expected Cancelled"
        return
    raise AssertionError("join of a cancelled task did not raise")


async def check_timeout_raises_builtin_timeouterror_and_runs_finally(
    clock: Clock, slack: float
) -> None:
    ran_finally = False

    async def slow() -> None:
        nonlocal ran_finally
        try:
            await clock.sleep(100)
        finally:
            ran_finally = True

    t0 = clock.now()
    try:
        await clock.timeout(D, slow())
    except TimeoutError as e:
        assert type(e) is TimeoutError, type(e).__name__
        assert ran_finally, "the timed-out coroutine's finally did not run"
        _assert_close(slack, "timeout", clock.now() - t0, D)
        return
    raise AssertionError("no timeout")


async def check_timeout_returns_the_result_when_in_time(clock: Clock, slack: float) -> None:
    async def quick() -> int:
        await clock.sleep(D)
        return 7

    assert await clock.timeout(10 * D, quick()) == 7


async def check_oneshot_wakes_every_waiter_once_with_its_value(clock: Clock, slack: float) -> None:
    ev = clock.event()
    got: list[object] = []

    async def waiter() -> None:
        got.append(await ev.wait())

    tasks = [clock.spawn(waiter()) for _ in range(3)]
    await clock.sleep(D)
    ev.set("v")
    ev.set("ignored")
    for t in tasks:
        await t.join()
    got.append(await ev.wait())  # after set: at once
    assert got == ["v", "v", "v", "v"], got


async def check_first_returns_the_earliest_and_leaves_the_others_running(
    clock: Clock, slack: float
) -> None:
    async def after(d: float, v: int) -> int:
        await clock.sleep(d)
        return v

    slow = clock.spawn(after(4 * D, 2))
    fast = clock.spawn(after(D, 1))
    ev = clock.event()
    idx, val = await clock.first(slow, fast, ev)
    assert (idx, val) == (1, 1), (idx, val)
    assert not slow.done(), "first() stopped the tasks that did not win"
    assert await slow.join() == 2


async def check_first_raises_the_exception_of_a_failed_task(clock: Clock, slack: float) -> None:
    async def boom() -> None:
        await clock.sleep(D)
        raise ValueError("boom")

    t = clock.spawn(boom())
    try:
        await clock.first(t, clock.event())
    except ValueError as e:
        assert str(e) == "boom"
        return
    raise AssertionError("first() did not raise the failed task's exception")


async def check_a_failure_nobody_joined_is_recorded_until_joined(
    clock: Clock, slack: float
) -> None:
    async def boom() -> None:
        await clock.sleep(D)
        raise ValueError("in the background")

    t = clock.spawn(boom(), name="bg")
    await clock.sleep(2 * D)
    assert t.done()
    seen = [(n, str(e)) for n, e in clock.unobserved]
    assert ("bg", "in the background") in seen, f"the failure was not recorded: {seen}"
    try:
        await t.join()
    except ValueError:
        pass
    else:
        raise AssertionError("join did not raise the task's error")
    assert not [e for _, e in clock.unobserved if str(e) == "in the background"], (
        "a retrieved failure is still reported as unobserved"
    )


async def check_unobserved_failures_are_kept_up_to_the_cap_and_counted_beyond(
    clock: Clock, slack: float
) -> None:
    from elastic.clock import UNOBSERVED_KEPT

    async def boom(i: int) -> None:
        raise ValueError(f"failure {i}")

    before, dropped = len(clock.unobserved), clock.unobserved_dropped
    n = UNOBSERVED_KEPT + 7
    tasks = [clock.spawn(boom(i), name=f"bg{i}") for i in range(n)]
    await clock.sleep(D)
    assert all(t.done() for t in tasks)
    kept = len(clock.unobserved) - before
    assert len(clock.unobserved) <= UNOBSERVED_KEPT, len(clock.unobserved)
    assert kept + clock.unobserved_dropped - dropped == n, (kept, clock.unobserved_dropped)
    for t in tasks:  # retrieve them all: nothing is left unobserved by this check
        with contextlib.suppress(ValueError):
            await t.join()
    assert len(clock.unobserved) == before, clock.unobserved[before:]
    clock.unobserved_dropped = dropped


async def check_a_task_cannot_cancel_itself(clock: Clock, slack: float) -> None:
    box: list[Task[None]] = []
    outcome: list[str] = []

    async def selfish() -> None:
        await clock.sleep(0)
        try:
            box[0].cancel()
        except RuntimeError:
            outcome.append("refused")
            return
        outcome.append("cancelled itself")

    box.append(clock.spawn(selfish(), name="selfish"))
    await box[0].join()
    assert outcome == ["refused"], outcome


ALL_CHECKS: tuple[ClockCheck, ...] = (
    check_sleep_resumes_after_the_duration,
    check_cancel_reaches_finally_and_join_raises_cancelled,
    check_cancelled_is_the_ports_own_type,
    check_timeout_raises_builtin_timeouterror_and_runs_finally,
    check_timeout_returns_the_result_when_in_time,
    check_oneshot_wakes_every_waiter_once_with_its_value,
    check_first_returns_the_earliest_and_leaves_the_others_running,
    check_first_raises_the_exception_of_a_failed_task,
    check_a_failure_nobody_joined_is_recorded_until_joined,
    check_unobserved_failures_are_kept_up_to_the_cap_and_counted_beyond,
    check_a_task_cannot_cancel_itself,
)


async def check_clock(
    clock: Clock, slack: float, checks: tuple[ClockCheck, ...] = ALL_CHECKS
) -> None:
    """Run ``checks`` one after another on ``clock`` (raises at the first broken promise)."""
    for check in checks:
        await check(clock, slack)
