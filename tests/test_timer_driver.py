"""The timer server core on the Clock port, in both worlds (asyncio and simpy)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from elastic.clock import Clock
from elastic.timer import TimerError, TimerRequest, configure, expires
from elastic.timer.driver import ClockTimerClient, TimerDriver
from tests.worlds import run_in

# real-world slack: event-loop scheduling on a loaded 2-core machine
EPS = {"real": 0.05, "sim": 0.0}


class Reaper:
    """Records reaps; ``results`` scripts the callback's answers (default: reaped)."""

    def __init__(self, clock: Clock, results: list[bool | Exception] | None = None) -> None:
        self.clock = clock
        self.calls: list[tuple[Any, str, float, float]] = []
        self.results = list(results or [])
        self.first = clock.event()

    async def __call__(self, worker_id: Any, scope: str, expired_at: float) -> bool:
        self.calls.append((worker_id, scope, expired_at, self.clock.now()))
        self.first.set(worker_id)
        if self.results:
            r = self.results.pop(0)
            if isinstance(r, Exception):
                raise r
            return r
        return True


def served(
    world: str, body: Callable[[Clock, TimerDriver, Reaper], Awaitable[Any]], **kw: Any
) -> Any:
    async def main(clock: Clock) -> Any:
        reaper = Reaper(clock, kw.pop("results", None))
        driver = TimerDriver(clock, reaper, **kw)
        task = clock.spawn(driver.run(), name="timer-driver")
        try:
            return await body(clock, driver, reaper)
        finally:
            task.cancel()

    return run_in(world, main)


def test_release_before_expiry_reaps_nothing(world: str) -> None:
    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        client = ClockTimerClient(driver, "w0", clock)
        with expires(after=0.3, client=client):
            await clock.sleep(0.1)
        await clock.sleep(0.5)
        assert reaper.calls == []
        assert len(driver.table) == 0

    served(world, body)


def test_expired_timer_is_reaped_at_its_deadline(world: str) -> None:
    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        client = ClockTimerClient(driver, "w0", clock)
        start = clock.now()
        with expires(after=0.2, scope="step", client=client):
            assert await clock.timeout(2.0, reaper.first.wait()) == "w0"
        ((worker, scope, expired_at, reaped_at),) = reaper.calls
        assert (worker, scope) == ("w0", "step")
        assert expired_at == pytest.approx(start + 0.2)
        assert expired_at <= reaped_at <= expired_at + EPS[world]
        assert len(driver.table) == 0  # reaped worker's timers are cleared

    served(world, body)


def test_recursive_expires_share_one_default_scope(world: str) -> None:
    scopes: list[int] = []

    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        client = ClockTimerClient(driver, "w0", clock)

        def recurse(depth: int) -> None:
            with expires(after=0.2, client=client):
                scopes.append(len(driver.table))
                if depth:
                    recurse(depth - 1)

        recurse(4)
        assert scopes == [1, 1, 1, 1, 1]  # one timer, file#line, overwritten each level
        assert len(driver.table) == 0  # the innermost exit released the shared timer
        await clock.sleep(0.5)
        assert reaper.calls == []

    served(world, body)


def test_default_scope_is_the_callers_file_and_line(world: str) -> None:
    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        client = ClockTimerClient(driver, "w0", clock)
        with expires(after=5, client=client):
            (timer,) = driver.table.timers()
        assert timer.scope_id.endswith(f"{__file__}#{body.__code__.co_firstlineno + 2}")

    served(world, body)


def test_many_clients_only_unreleased_are_reaped_in_deadline_order(world: str) -> None:
    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        clients = [ClockTimerClient(driver, i, clock) for i in range(40)]
        t0 = clock.now()
        for i, c in enumerate(clients):
            c.acquire("s", t0 + 0.1 + 0.005 * (40 - i))
        for c in clients[::2]:
            c.release("s")
        await clock.sleep(0.5)
        reaped = [w for w, *_ in reaper.calls]
        assert sorted(reaped) == list(range(1, 40, 2))
        if world == "sim":  # exact order needs exact time
            assert reaped == sorted(reaped, reverse=True)
        for _, _, expired_at, reaped_at in reaper.calls:
            assert expired_at <= reaped_at <= expired_at + EPS[world] + 0.05

    served(world, body)


def test_idle_driver_does_not_wake_up(world: str) -> None:
    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        await clock.sleep(1.0 if world == "real" else 3600.0)
        assert driver.turns == 1

    served(world, body)


def test_each_request_costs_one_wakeup_not_a_poll(world: str) -> None:
    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        client = ClockTimerClient(driver, "w", clock)
        await clock.sleep(0.01)
        client.acquire("a", clock.now() + 100)
        await clock.sleep(0.05)
        client.release("a")
        await clock.sleep(0.05)
        assert driver.turns == 3  # start, acquire, release — none while waiting

    served(world, body)


def test_failed_reap_is_retried_after_retry_interval(world: str) -> None:
    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        ClockTimerClient(driver, "w", clock).acquire("a", clock.now() + 0.1)
        await clock.sleep(0.55)
        times = [t for *_, t in reaper.calls]
        assert len(times) == 2
        assert times[1] - times[0] == pytest.approx(0.3, abs=EPS[world] + 1e-9)
        assert len(driver.table) == 0

    served(world, body, results=[False], retry_interval=0.3)


def test_reap_callback_exception_counts_as_reaped(world: str) -> None:
    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        ClockTimerClient(driver, "w", clock).acquire("a", clock.now() + 0.1)
        await clock.sleep(0.3)
        assert len(reaper.calls) == 1
        assert len(driver.table) == 0

    served(world, body, results=[RuntimeError("boom")])


def test_expires_without_client_raises_torchs_message() -> None:
    import elastic.timer.api as api

    saved = api._timer_client
    api._timer_client = None
    try:
        with (
            pytest.raises(
                RuntimeError, match=r"^Configure timer client before using countdown timers\.$"
            ),
            expires(after=1),
        ):
            pass
        with pytest.raises(TimerError), expires(after=1):
            pass
    finally:
        api._timer_client = saved


def test_configure_sets_the_default_client(world: str) -> None:
    import elastic.timer.api as api

    saved = api._timer_client

    async def body(clock: Clock, driver: TimerDriver, reaper: Reaper) -> None:
        configure(ClockTimerClient(driver, "w", clock))
        with expires(after=10, scope="x"):
            assert [r.scope_id for r in driver.table.timers()] == ["x"]

    try:
        served(world, body)
    finally:
        api._timer_client = saved


def test_timer_request_equality_is_on_all_fields() -> None:
    assert TimerRequest(1, "a", 2.0) == TimerRequest(1, "a", 2.0)
    assert TimerRequest(1, "a", 2.0) != TimerRequest(1, "a", 3.0)
