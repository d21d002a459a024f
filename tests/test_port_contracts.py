"""The clock port keeps the same promises in both worlds.

(The store port's promises are the shipped conformance suite, elastic/testing/store.py,
run against every store by tests/test_store_conformance.py.)

Every test here runs twice, on asyncio (real) and on simpy (sim), through the same
body; durations are short so the real world stays fast, and real timings are checked
with a tolerance while the simulator's are exact.
"""

from __future__ import annotations

from elastic.clock import Cancelled, Clock
from tests.worlds import run_in

D = 0.05  # a short duration, in seconds of either world


def close_to(world: str, seen: float, want: float) -> bool:
    if world == "sim":
        return abs(seen - want) < 1e-9
    return want - 1e-3 <= seen <= want + 0.05


# -- clock --------------------------------------------------------------------------


def test_sleep_resumes_after_the_duration(world: str) -> None:
    async def body(clock: Clock) -> float:
        t0 = clock.now()
        await clock.sleep(D)
        return clock.now() - t0

    assert close_to(world, run_in(world, body), D)


def test_cancel_reaches_finally_and_join_raises_cancelled(world: str) -> None:
    async def body(clock: Clock) -> list[str]:
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
        return log

    assert run_in(world, body) == ["finally", "join raised Cancelled"]


def test_cancelled_type_is_the_same_in_both_worlds(world: str) -> None:
    async def body(clock: Clock) -> type[BaseException]:
        async def victim() -> None:
            await clock.sleep(100)

        t = clock.spawn(victim())
        await clock.sleep(0)
        t.cancel()
        try:
            await t.join()
        except BaseException as e:
            return type(e)
        raise AssertionError("join did not raise")

    assert run_in(world, body) is Cancelled


def test_timeout_raises_builtin_timeouterror_and_runs_finally(world: str) -> None:
    async def body(clock: Clock) -> tuple[str, bool, float]:
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
            return type(e).__name__, ran_finally, clock.now() - t0
        raise AssertionError("no timeout")

    name, ran_finally, took = run_in(world, body)
    assert (name, ran_finally) == ("TimeoutError", True)
    assert close_to(world, took, D)


def test_timeout_returns_the_result_when_in_time(world: str) -> None:
    async def body(clock: Clock) -> int:
        async def quick() -> int:
            await clock.sleep(D)
            return 7

        return await clock.timeout(10 * D, quick())

    assert run_in(world, body) == 7


def test_oneshot_wakes_every_waiter_once_with_its_value(world: str) -> None:
    async def body(clock: Clock) -> list[object]:
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
        return got

    assert run_in(world, body) == ["v", "v", "v", "v"]


def test_first_returns_the_earliest_and_leaves_the_others_running(world: str) -> None:
    async def body(clock: Clock) -> tuple[int, object, bool, int]:
        async def after(d: float, v: int) -> int:
            await clock.sleep(d)
            return v

        slow = clock.spawn(after(4 * D, 2))
        fast = clock.spawn(after(D, 1))
        ev = clock.event()
        idx, val = await clock.first(slow, fast, ev)
        still_running = not slow.done()
        return idx, val, still_running, await slow.join()

    assert run_in(world, body) == (1, 1, True, 2)


def test_first_raises_the_exception_of_a_failed_task(world: str) -> None:
    async def body(clock: Clock) -> str:
        async def boom() -> None:
            await clock.sleep(D)
            raise ValueError("boom")

        t = clock.spawn(boom())
        try:
            await clock.first(t, clock.event())
        except ValueError as e:
            return str(e)
        return "no error"

    assert run_in(world, body) == "boom"
