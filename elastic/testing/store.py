"""The Store port's conformance suite: what every store promises, as runnable checks.

Each check is ``async def check_…(clock, harness) -> None``; it raises
:class:`AssertionError` (or the unexpected exception) when the store breaks a promise of
:mod:`elastic.store`.  A :class:`StoreHarness` tells the checks how to reach the store
under test: ``open()`` gives a client of it (every client sees the same data: with one
in-process store, ``open`` may return the same object each time), ``close(store)`` shuts
that client down, ``teardown()`` releases everything, and ``unit``/``slack`` say how
long a short wait is in this world and how late a wake-up may be (``slack=0``: the
world's time is exact, as in a simulator).

Run them all with :func:`check_store`, or one by one from :data:`ALL_CHECKS` (a test
suite parametrises over them)::

    async def test_my_store(clock):
        await check_store(clock, MyHarness(clock))

A check needs a fresh, empty store: build a new harness for each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

from elastic.clock import Cancelled, Clock
from elastic.errors import StoreClosedError, StoreError
from elastic.store import Store, arrive_op, watch_snapshot_op

__all__ = ["ALL_CHECKS", "Check", "StoreHarness", "check_store"]


class StoreHarness(Protocol):
    """How the checks reach the store under test."""

    unit: float  # a short duration of this world, in seconds (0.05 in memory)
    slack: float  # how late a timed wake-up may be (0 = exact)

    async def open(self) -> Store:
        """A client of the store under test (a new one each call where that means anything)."""
        ...

    async def close(self, store: Store) -> None:
        """Close ``store``; its later operations raise :class:`StoreClosedError`."""

    async def teardown(self) -> None:
        """Release whatever the harness started (clients, servers); called once, last."""


Check = Callable[[Clock, StoreHarness], Awaitable[None]]


def _close_to(h: StoreHarness, seen: float, want: float) -> bool:
    if h.slack == 0:
        return abs(seen - want) < 1e-9
    return want - 1e-3 <= seen <= want + h.slack


def _assert_close(h: StoreHarness, what: str, seen: float, want: float) -> None:
    assert _close_to(h, seen, want), f"{what} took {seen:.4f}s, expected {want:.4f}s"


async def check_get_blocks_until_another_client_sets_the_key(clock: Clock, h: StoreHarness) -> None:
    reader, writer = await h.open(), await h.open()
    t0 = clock.now()

    async def later() -> None:
        await clock.sleep(h.unit)
        await writer.set("k", b"v")

    clock.spawn(later())
    v = await reader.get("k", timeout=20 * h.unit)
    assert v == b"v", v
    _assert_close(h, "get", clock.now() - t0, h.unit)


async def check_get_wait_and_multi_get_time_out_with_timeouterror(
    clock: Clock, h: StoreHarness
) -> None:
    store = await h.open()
    t0 = clock.now()
    try:
        await store.get("missing", timeout=h.unit)
    except TimeoutError as e:
        assert "'missing'" in str(e), f"the timeout should name the key: {e}"
    else:
        raise AssertionError("get of a missing key did not time out")
    _assert_close(h, "get timeout", clock.now() - t0, h.unit)
    await store.set("present", b"1")
    for call in (
        lambda: store.wait(["present", "missing"], timeout=h.unit),
        lambda: store.multi_get(["present", "missing"], timeout=h.unit),
    ):
        try:
            await call()
        except TimeoutError:
            continue
        raise AssertionError("wait/multi_get of a missing key did not time out")


async def check_get_and_wait_return_at_once_for_present_keys(clock: Clock, h: StoreHarness) -> None:
    store = await h.open()
    await store.set("k", b"v")
    assert await store.get("k", timeout=0) == b"v"
    await store.wait(["k"], timeout=0)
    assert await store.multi_get(["k", "k"], timeout=0) == [b"v", b"v"]
    assert await store.try_get("absent") is None


async def check_values_are_bytes_both_ways(clock: Clock, h: StoreHarness) -> None:
    store = await h.open()
    raw = bytes(range(256)) + b"\x00"
    await store.set("bin", raw)
    got = await store.get("bin")
    assert type(got) is bytes and got == raw
    await store.set("empty", b"")
    assert await store.try_get("empty") == b""
    try:
        await store.set("s", "text")  # type: ignore[arg-type]
    except TypeError:
        pass
    else:
        raise AssertionError("a str value was accepted; values are bytes")
    assert await store.try_get("s") is None


async def check_add_is_atomic_under_concurrent_clients(clock: Clock, h: StoreHarness) -> None:
    stores = [await h.open() for _ in range(4)]
    seen: list[int] = []

    async def adder(store: Store) -> None:
        for _ in range(10):
            seen.append(await store.add("n", 1))
            await clock.sleep(0)

    tasks = [clock.spawn(adder(stores[i % 4])) for i in range(8)]
    for t in tasks:
        await t.join()
    assert int(await stores[0].get("n")) == 80
    assert sorted(seen) == list(range(1, 81)), "every intermediate sum is handed out once"
    assert await stores[1].add("n", -100) == -20
    try:
        await stores[0].set("text", b"abc")
        await stores[0].add("text", 1)
    except StoreError:
        pass
    else:
        raise AssertionError("add on a non-integer value did not raise StoreError")


async def check_compare_set_lets_exactly_one_of_many_racers_win(
    clock: Clock, h: StoreHarness
) -> None:
    stores = [await h.open() for _ in range(4)]
    wins: list[int] = []

    async def racer(i: int) -> None:
        await clock.sleep(0)
        mine = f"owner-{i}".encode()
        if await stores[i % 4].compare_set("lock", None, mine) == mine:
            wins.append(i)

    tasks = [clock.spawn(racer(i)) for i in range(16)]
    for t in tasks:
        await t.join()
    assert len(wins) == 1, f"{len(wins)} racers won"
    assert await stores[0].get("lock") == f"owner-{wins[0]}".encode()


async def check_compare_set_returns_the_value_after_the_operation(
    clock: Clock, h: StoreHarness
) -> None:
    store = await h.open()
    assert await store.compare_set("k", b"x", b"y") == b"", "absent key, wrong expectation"
    assert await store.try_get("k") is None
    await store.set("k", b"a")
    assert await store.compare_set("k", b"x", b"b") == b"a"
    assert await store.compare_set("k", None, b"b") == b"a"
    assert await store.compare_set("k", b"a", b"c") == b"c"
    assert await store.get("k") == b"c"


async def check_wait_multi_get_multi_set_and_delete(clock: Clock, h: StoreHarness) -> None:
    store, other = await h.open(), await h.open()

    async def later() -> None:
        await clock.sleep(h.unit)
        await other.multi_set({"a": b"1", "b": b"2"})

    clock.spawn(later())
    await store.wait(["a", "b"], timeout=20 * h.unit)
    assert await store.delete("a")
    assert not await store.delete("a")
    assert await store.try_get("a") is None
    await store.set("a", b"3")
    assert await store.multi_get(["a", "b"]) == [b"3", b"2"]


async def check_multi_set_is_one_revision(clock: Clock, h: StoreHarness) -> None:
    store = await h.open()
    rev0, _ = await store.snapshot("")
    await store.multi_set({f"m/{i}": str(i).encode() for i in range(10)})
    rev1, snap = await store.snapshot("m/")
    assert rev1 == rev0 + 1, f"multi_set took {rev1 - rev0} revisions"
    assert snap == {f"m/{i}": str(i).encode() for i in range(10)}
    await store.set("m/0", b"x")
    rev2, _ = await store.snapshot("")
    assert rev2 == rev1 + 1


async def check_snapshot_returns_exactly_the_prefix(clock: Clock, h: StoreHarness) -> None:
    store = await h.open()
    await store.multi_set({"p/a": b"1", "p/b/c": b"2", "pq": b"3", "o": b"4"})
    _, snap = await store.snapshot("p/")
    assert snap == {"p/a": b"1", "p/b/c": b"2"}
    _, everything = await store.snapshot("")
    assert set(everything) >= {"p/a", "p/b/c", "pq", "o"}


async def check_a_lease_lives_while_its_owner_lives(clock: Clock, h: StoreHarness) -> None:
    owner, other = await h.open(), await h.open()
    ttl = 4 * h.unit
    lease = await owner.grant_lease(ttl)
    assert lease.alive() and lease.ttl == ttl
    await owner.set("alive/n0", b"1", lease=lease)
    await clock.sleep(3 * ttl)  # renewals (if the store needs any) keep it alive
    assert lease.alive()
    assert await other.try_get("alive/n0") == b"1"


async def check_leased_key_vanishes_ttl_after_the_owner_abandons_and_not_before(
    clock: Clock, h: StoreHarness
) -> None:
    owner, other = await h.open(), await h.open()
    ttl = 4 * h.unit
    lease = await owner.grant_lease(ttl)
    await owner.set("alive/n0", b"1", lease=lease)
    await owner.set("alive/n0x", b"plain")  # not leased: stays
    await clock.sleep(ttl)
    rev, _ = await other.snapshot("alive/")
    died = clock.now()
    lease.abandon()  # the owner stops renewing, as a dead one would
    await clock.sleep(ttl - 2 * h.unit)
    assert await other.try_get("alive/n0") == b"1", "the key vanished before ttl"
    await other.watch("alive/", rev, timeout=ttl + 20 * h.unit)  # woken by the expiry
    _assert_close(h, "lease expiry after abandon", clock.now() - died, ttl)
    assert await other.try_get("alive/n0") is None
    assert await other.try_get("alive/n0x") == b"plain"
    assert not lease.alive()


async def check_compare_set_with_a_lease_attaches_the_key_in_one_operation(
    clock: Clock, h: StoreHarness
) -> None:
    owner, other = await h.open(), await h.open()
    ttl = 4 * h.unit
    granted = clock.now()  # the lease's time runs from its grant: nobody renews it here
    lease = await owner.grant_lease(ttl)
    lease.abandon()
    # won: the key is the lease's from that operation on (a claim that cannot outlive
    # its owner, even one that dies right after it)
    assert await owner.compare_set("claim", None, b"n0", lease=lease) == b"n0"
    # lost: nothing is attached to the lease, the winner's value stays as it was
    await other.set("plain", b"x")
    assert await owner.compare_set("plain", None, b"n0", lease=lease) == b"x"
    rev, _ = await other.snapshot("")
    await other.watch("claim", rev, timeout=ttl + 20 * h.unit)  # woken by the expiry
    _assert_close(h, "a compare_set key's expiry after its grant", clock.now() - granted, ttl)
    assert await other.try_get("claim") is None
    assert await other.try_get("plain") == b"x", "a lost compare_set attached the key"


async def check_revoke_removes_leased_keys_at_once(clock: Clock, h: StoreHarness) -> None:
    owner, other = await h.open(), await h.open()
    lease = await owner.grant_lease(1000 * h.unit)
    await owner.set("k", b"v", lease=lease)
    await owner.set("k2", b"v", lease=lease)
    await lease.revoke()
    assert not lease.alive()
    assert await other.try_get("k") is None and await other.try_get("k2") is None
    await lease.revoke()  # again: nothing to do
    try:
        await owner.set("k3", b"v", lease=lease)
    except StoreError:
        pass
    else:
        raise AssertionError("a key was attached to a revoked lease")


async def check_a_lease_needs_a_positive_ttl(clock: Clock, h: StoreHarness) -> None:
    store = await h.open()
    for bad in (0.0, -1.0):
        try:
            await store.grant_lease(bad)
        except StoreError:
            continue
        raise AssertionError(f"grant_lease({bad}) was accepted")


async def check_watch_wakes_on_a_change_under_the_prefix_only(
    clock: Clock, h: StoreHarness
) -> None:
    store, writer = await h.open(), await h.open()
    rev, _ = await store.snapshot("p/")

    async def write() -> None:
        await clock.sleep(h.unit)
        await writer.set("q/other", b"x")  # not under the prefix
        await clock.sleep(h.unit)
        await writer.set("p/mine", b"y")

    t0 = clock.now()
    clock.spawn(write())
    seen = await store.watch("p/", rev, timeout=40 * h.unit)
    current, _ = await store.snapshot("")
    assert seen == current == rev + 2, (seen, current, rev)
    _assert_close(h, "watch", clock.now() - t0, 2 * h.unit)


async def check_watch_from_a_past_revision_returns_at_once(clock: Clock, h: StoreHarness) -> None:
    store = await h.open()
    rev, _ = await store.snapshot("p/")
    await store.set("p/a", b"1")
    await store.set("other", b"1")
    assert await store.watch("p/", rev, timeout=0) == rev + 1
    try:
        await store.watch("p/", rev + 1, timeout=0)
    except TimeoutError:
        pass
    else:
        raise AssertionError("a watch past the last change under the prefix returned")


async def check_watch_sees_deletes_and_times_out(clock: Clock, h: StoreHarness) -> None:
    store = await h.open()
    await store.set("d/k", b"1")
    rev, _ = await store.snapshot("d/")
    t0 = clock.now()
    try:
        await store.watch("d/", rev, timeout=h.unit)
    except TimeoutError:
        pass
    else:
        raise AssertionError("a watch with no change did not time out")
    _assert_close(h, "watch timeout", clock.now() - t0, h.unit)
    await store.delete("d/k")
    assert await store.watch("d/", rev, timeout=0) == rev + 1


async def check_watch_snapshot_answers_as_a_watch_then_a_snapshot(
    clock: Clock, h: StoreHarness
) -> None:
    """``watch_snapshot`` (the store's own, or watch then snapshot): the same wake as
    ``watch``, and the read prefix's keys as ``snapshot`` gives them when nothing races."""
    store, writer = await h.open(), await h.open()
    op = watch_snapshot_op(store)
    await writer.set("r/keep", b"0")
    rev, _ = await store.snapshot("w/")

    async def write() -> None:
        await clock.sleep(h.unit)
        await writer.set("r/other", b"x")  # read, not watched: no wake
        await clock.sleep(h.unit)
        await writer.set("w/k", b"1")

    t0 = clock.now()
    clock.spawn(write())
    got_rev, got = await op("w/", rev, "r/", 40 * h.unit)
    _assert_close(h, "watch_snapshot", clock.now() - t0, 2 * h.unit)
    assert (got_rev, got) == await store.snapshot("r/"), (got_rev, got)
    assert got == {"r/keep": b"0", "r/other": b"x"}, got
    assert got_rev == rev + 2, (got_rev, rev)
    # from a past revision it answers at once, with the keys as they are now
    assert await op("w/", rev, "w/", 0) == (rev + 2, {"w/k": b"1"})
    try:
        await op("w/", got_rev, "r/", h.unit)
    except TimeoutError:
        pass
    else:
        raise AssertionError("a watch_snapshot with no change did not time out")


async def check_watch_snapshot_reads_at_the_revision_it_returns(
    clock: Clock, h: StoreHarness
) -> None:
    """The snapshot is the read prefix at the revision returned, which is at least the one
    that woke it: a change made with the wake (one multi_set) is in it, and a watch from
    the returned revision misses nothing made after the read."""
    store, writer = await h.open(), await h.open()
    op = watch_snapshot_op(store)
    rev, _ = await store.snapshot("")

    async def write() -> None:
        await clock.sleep(h.unit)
        await writer.multi_set({"w/k": b"1", "r/a": b"1"})  # one revision: wake and data

    clock.spawn(write())
    got_rev, got = await op("w/", rev, "r/", 40 * h.unit)
    assert got_rev >= rev + 1 and got == {"r/a": b"1"}, (got_rev, got, rev)
    await writer.multi_set({"w/k": b"2", "r/a": b"2"})
    # the change after the returned revision wakes the next call at once, with it
    again, now = await op("w/", got_rev, "r/", 40 * h.unit)
    assert again > got_rev and now == {"r/a": b"2"}, (again, now, got_rev)
    assert (again, now) == await store.snapshot("r/")


async def check_arrive_adds_sets_and_counts_as_one_revision(clock: Clock, h: StoreHarness) -> None:
    """``arrive`` (where the store has it, :class:`~elastic.store.ArriveStore`): the
    counter's new value, the revision after the operation, the keys under the prefix
    (the new one included, the prefix's own key counted and flagged) — one revision."""
    store = await h.open()
    op = arrive_op(store)
    if op is None:
        return  # an optional operation: a store without it keeps the port's promises
    rev0, _ = await store.snapshot("")
    n, rev, present, marked = await op("r/count", "r/m/a", b"A", "r/m/")
    assert (n, present, marked) == (1, 1, False), (n, present, marked)
    assert rev == rev0 + 1, f"arrive took {rev - rev0} revisions"
    rev1, snap = await store.snapshot("r/")
    assert rev1 == rev and snap == {"r/count": b"1", "r/m/a": b"A"}, (rev1, snap)
    # the same key again counts again but is one key; the prefix's own key is flagged
    await store.set("r/m/", b"end")
    n, _, present, marked = await op("r/count", "r/m/a", b"A2", "r/m/")
    assert (n, present, marked) == (2, 2, True), (n, present, marked)
    assert await store.get("r/m/a") == b"A2"
    lease = await store.grant_lease(60 * h.unit)
    n, _, present, _ = await op("r/count", "r/m/b", b"B", "r/m/", lease=lease)
    assert (n, present) == (3, 3), (n, present)
    await lease.revoke()
    assert await store.try_get("r/m/b") is None, "arrive did not attach the key to its lease"
    n, _, present, _ = await op("r/count", "r/m/c", b"C", "r/m/")
    assert (n, present) == (4, 3), (n, present)
    await store.set("bad", b"x")
    try:
        await op("bad", "r/m/d", b"D", "r/m/")
    except StoreError:
        pass
    else:
        raise AssertionError("arrive on a non-integer counter did not raise StoreError")
    assert await store.try_get("r/m/d") is None, "a refused arrive changed the store"


async def check_arrive_is_atomic_under_concurrent_clients(clock: Clock, h: StoreHarness) -> None:
    """Arrivals racing from many clients: each counter value is handed out once, and each
    arrival counts exactly the keys of the arrivals up to its own (nothing in between)."""
    stores = [await h.open() for _ in range(4)]
    ops = [arrive_op(s) for s in stores]
    if any(op is None for op in ops):
        return
    seen: list[tuple[int, int]] = []

    async def arrival(i: int) -> None:
        await clock.sleep(0)
        op = ops[i % 4]
        assert op is not None
        n, _, present, _ = await op("c", f"m/{i:02d}", b"x", "m/")
        seen.append((n, present))

    tasks = [clock.spawn(arrival(i)) for i in range(12)]
    for t in tasks:
        await t.join()
    assert sorted(seen) == [(i, i) for i in range(1, 13)], sorted(seen)


async def check_a_cancelled_wait_leaves_the_store_working(clock: Clock, h: StoreHarness) -> None:
    store = await h.open()

    async def waiter() -> None:
        await store.get("never")

    t = clock.spawn(waiter())
    await clock.sleep(h.unit)
    t.cancel()
    with contextlib.suppress(Cancelled):  # the same type in every world
        await t.join()
    await store.set("k", b"v")
    assert await store.get("k", timeout=h.unit) == b"v"


async def check_a_closed_store_refuses_operations(clock: Clock, h: StoreHarness) -> None:
    store = await h.open()
    await store.set("k", b"v")
    await h.close(store)
    try:
        await store.get("k", timeout=h.unit)
    except StoreClosedError:
        return
    raise AssertionError("an operation on a closed store did not raise StoreClosedError")


ALL_CHECKS: tuple[Check, ...] = (
    check_get_blocks_until_another_client_sets_the_key,
    check_get_wait_and_multi_get_time_out_with_timeouterror,
    check_get_and_wait_return_at_once_for_present_keys,
    check_values_are_bytes_both_ways,
    check_add_is_atomic_under_concurrent_clients,
    check_compare_set_lets_exactly_one_of_many_racers_win,
    check_compare_set_returns_the_value_after_the_operation,
    check_wait_multi_get_multi_set_and_delete,
    check_multi_set_is_one_revision,
    check_snapshot_returns_exactly_the_prefix,
    check_a_lease_lives_while_its_owner_lives,
    check_leased_key_vanishes_ttl_after_the_owner_abandons_and_not_before,
    check_compare_set_with_a_lease_attaches_the_key_in_one_operation,
    check_revoke_removes_leased_keys_at_once,
    check_a_lease_needs_a_positive_ttl,
    check_watch_wakes_on_a_change_under_the_prefix_only,
    check_watch_from_a_past_revision_returns_at_once,
    check_watch_sees_deletes_and_times_out,
    check_watch_snapshot_answers_as_a_watch_then_a_snapshot,
    check_watch_snapshot_reads_at_the_revision_it_returns,
    check_arrive_adds_sets_and_counts_as_one_revision,
    check_arrive_is_atomic_under_concurrent_clients,
    check_a_cancelled_wait_leaves_the_store_working,
    check_a_closed_store_refuses_operations,
)


async def check_store(
    clock: Clock,
    make: Callable[[], Awaitable[StoreHarness]],
    checks: tuple[Check, ...] = ALL_CHECKS,
) -> None:
    """Run ``checks`` in order, each on a fresh harness from ``make``; at the first failure
    raise :class:`AssertionError` naming the check (the original error is its cause)."""
    for check in checks:
        h = await make()
        try:
            await check(clock, h)
        except Exception as e:  # a broken promise, however it shows, names its check
            raise AssertionError(f"{check.__name__}: {type(e).__name__}: {e}") from e
        finally:
            await h.teardown()
