"""The clock and store ports keep the same promises in both worlds.

Every test here runs twice, on asyncio (real) and on simpy (sim), through the same
body; durations are short so the real world stays fast, and real timings are checked
with a tolerance while the simulator's are exact.
"""

from __future__ import annotations

import pytest

from elastic.clock import Cancelled, Clock
from elastic.memstore import MemoryStore
from elastic.store import Store
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


# -- store --------------------------------------------------------------------------


def test_get_blocks_until_the_key_is_set(world: str) -> None:
    async def body(clock: Clock) -> tuple[bytes, float]:
        store: Store = MemoryStore(clock)
        t0 = clock.now()

        async def later() -> None:
            await clock.sleep(D)
            await store.set("k", b"v")

        clock.spawn(later())
        v = await store.get("k", timeout=10 * D)
        return v, clock.now() - t0

    v, took = run_in(world, body)
    assert v == b"v"
    assert close_to(world, took, D)


def test_get_times_out_with_timeouterror(world: str) -> None:
    async def body(clock: Clock) -> float:
        store = MemoryStore(clock)
        t0 = clock.now()
        with pytest.raises(TimeoutError, match="'missing'"):
            await store.get("missing", timeout=D)
        return clock.now() - t0

    assert close_to(world, run_in(world, body), D)


def test_add_is_atomic_under_concurrent_tasks(world: str) -> None:
    async def body(clock: Clock) -> tuple[int, list[int]]:
        store = MemoryStore(clock)
        seen: list[int] = []

        async def adder() -> None:
            for _ in range(10):
                seen.append(await store.add("n", 1))
                await clock.sleep(0)

        tasks = [clock.spawn(adder()) for _ in range(8)]
        for t in tasks:
            await t.join()
        return int(await store.get("n")), sorted(seen)

    total, seen = run_in(world, body)
    assert total == 80
    assert seen == list(range(1, 81))  # every intermediate value handed out once


def test_compare_set_lets_exactly_one_of_many_racers_win(world: str) -> None:
    async def body(clock: Clock) -> tuple[int, bytes]:
        store = MemoryStore(clock)
        wins = 0

        async def racer(i: int) -> None:
            nonlocal wins
            await clock.sleep(0)
            mine = f"owner-{i}".encode()
            if await store.compare_set("lock", None, mine) == mine:
                wins += 1

        tasks = [clock.spawn(racer(i)) for i in range(16)]
        for t in tasks:
            await t.join()
        return wins, await store.get("lock")

    wins, owner = run_in(world, body)
    assert wins == 1
    assert owner.startswith(b"owner-")


def test_compare_set_returns_the_current_value_on_mismatch(world: str) -> None:
    async def body(clock: Clock) -> tuple[bytes, bytes]:
        store = MemoryStore(clock)
        await store.set("k", b"a")
        miss = await store.compare_set("k", b"x", b"b")
        hit = await store.compare_set("k", b"a", b"c")
        return miss, hit

    assert run_in(world, body) == (b"a", b"c")


def test_wait_multi_get_and_multi_set(world: str) -> None:
    async def body(clock: Clock) -> list[bytes]:
        store = MemoryStore(clock)

        async def later() -> None:
            await clock.sleep(D)
            await store.multi_set({"a": b"1", "b": b"2"})

        clock.spawn(later())
        await store.wait(["a", "b"], timeout=10 * D)
        assert await store.delete("a")
        assert not await store.delete("a")
        await store.set("a", b"3")
        return await store.multi_get(["a", "b"])

    assert run_in(world, body) == [b"3", b"2"]


def test_leased_key_vanishes_ttl_after_the_owner_dies_and_not_before(world: str) -> None:
    ttl = 4 * D

    async def body(clock: Clock) -> tuple[bytes | None, bytes | None, float]:
        store = MemoryStore(clock)
        lease = await store.grant_lease(ttl)
        await store.set("alive/n0", b"1", lease=lease)
        await clock.sleep(2 * ttl)  # an owner that lives keeps its key
        assert await store.try_get("alive/n0") == b"1"
        rev, _ = await store.snapshot("alive/")
        died = clock.now()
        lease.abandon()  # the owner dies: renewals stop
        await clock.sleep(ttl - 2 * D)
        before = await store.try_get("alive/n0")
        await store.watch("alive/", rev)  # woken by the expiry, no polling
        vanished_after = clock.now() - died
        return before, await store.try_get("alive/n0"), vanished_after

    before, after, took = run_in(world, body)
    assert before == b"1"
    assert after is None
    assert close_to(world, took, ttl)


def test_revoke_removes_leased_keys_at_once(world: str) -> None:
    async def body(clock: Clock) -> bytes | None:
        store = MemoryStore(clock)
        lease = await store.grant_lease(100)
        await store.set("k", b"v", lease=lease)
        await lease.revoke()
        assert not lease.alive()
        return await store.try_get("k")

    assert run_in(world, body) is None


def test_watch_wakes_on_a_change_under_the_prefix_only(world: str) -> None:
    async def body(clock: Clock) -> tuple[int, int]:
        store = MemoryStore(clock)
        rev, _ = await store.snapshot("p/")

        async def writer() -> None:
            await clock.sleep(D)
            await store.set("q/other", b"x")  # not under the prefix
            await clock.sleep(D)
            await store.set("p/mine", b"y")

        clock.spawn(writer())
        seen = await store.watch("p/", rev, timeout=10 * D)
        return seen, store.revision

    seen, current = run_in(world, body)
    assert seen == current == 2


def test_watch_returns_at_once_for_a_change_already_made(world: str) -> None:
    async def body(clock: Clock) -> int:
        store = MemoryStore(clock)
        rev, _ = await store.snapshot("p/")
        await store.set("p/a", b"1")
        return await store.watch("p/", rev, timeout=0)

    assert run_in(world, body) == 1


def test_watch_times_out(world: str) -> None:
    async def body(clock: Clock) -> None:
        store = MemoryStore(clock)
        with pytest.raises(TimeoutError):
            await store.watch("p/", 0, timeout=D)

    run_in(world, body)
