"""The simulated store's fault model (sim/store.py's docstring): what an outage and a
partition do to leases and to operations in flight.  Times are exact simulated seconds."""

from __future__ import annotations

from typing import Any

import pytest

from elastic.clock import Cancelled
from sim.clock import SimClock
from sim.store import SimStoreClient, SimStoreHost

TTL = 15.0


def _host(latency: float = 0.0) -> tuple[SimClock, SimStoreHost]:
    clock = SimClock()
    return clock, SimStoreHost(clock, latency=latency)


def _keys(host: SimStoreHost) -> list[str]:
    return host.store.keys()  # what the store holds now, whatever any client sees


def _at(clock: SimClock, t: float, fn: Any) -> None:
    async def later() -> None:
        await clock.sleep(t - clock.now())
        fn()

    clock.spawn(later())


async def _hold_lease(a: SimStoreClient, key: str) -> None:
    lease = await a.grant_lease(TTL)
    await a.set(key, b"x", lease=lease)


def test_an_outage_expires_nobody_and_a_dead_nodes_lease_ends_ttl_after_the_store_returns() -> None:
    # the run: a crashes at t=1, the store is down 1..61; a's lease must not
    # expire at 1+15=16 but 15 s after the store returns: 61+15 = 76
    clock, host = _host()
    a, b = host.client("a"), host.client("b")
    seen: list[tuple[str, float]] = []

    async def watcher() -> None:
        rev, _ = await b.snapshot("alive/")
        await b.watch("alive/", rev)
        seen.append(("watch returned", clock.now()))

    clock.spawn(_hold_lease(a, "alive/a"))
    clock.env.run(until=0.5)
    clock.spawn(watcher())
    _at(clock, 1.0, a.crash)
    _at(clock, 1.0, host.outage_start)
    _at(clock, 61.0, host.outage_end)
    clock.env.run(until=75.9)
    assert "alive/a" in _keys(host)
    assert seen == []
    clock.env.run(until=100)
    assert "alive/a" not in _keys(host)
    assert seen == [("watch returned", 76.0)]


def test_a_lease_abandoned_during_an_outage_gets_its_full_ttl_after_the_return() -> None:
    clock, host = _host()
    a = host.client("a")
    clock.spawn(_hold_lease(a, "k"))
    _at(clock, 10.0, host.outage_start)
    _at(clock, 20.0, a.crash)  # 20 + 15 = 35 would be inside the outage
    _at(clock, 40.0, host.outage_end)
    clock.env.run(until=54.9)
    assert "k" in _keys(host)
    clock.env.run(until=55.1)  # 40 + 15
    assert "k" not in _keys(host)


def test_a_cut_off_client_gets_no_wake_up_until_the_link_heals() -> None:
    clock, host = _host()
    b, c = host.client("b"), host.client("c")
    seen: list[float] = []

    async def watcher() -> None:
        await b.watch("p/", 0)
        seen.append(clock.now())

    clock.spawn(watcher())
    _at(clock, 5.0, b.partition_start)

    async def writer() -> None:
        await clock.sleep(10.0)
        await c.set("p/x", b"1")

    clock.spawn(writer())
    _at(clock, 30.0, b.partition_end)
    clock.env.run(until=29.9)
    assert seen == []
    assert _keys(host) == ["p/x"]  # the store itself saw the write at t=10
    clock.env.run(until=40)
    assert seen == [30.0]


def test_an_operation_in_flight_during_an_outage_answers_only_after_it() -> None:
    clock, host = _host()
    a, b = host.client("a"), host.client("b")
    seen: list[tuple[bytes, float]] = []

    async def getter() -> None:
        value = await a.get("k")
        seen.append((value, clock.now()))

    clock.spawn(getter())
    clock.env.run(until=1)
    clock.spawn(host.store.set("k", b"v"))  # the store's own side, just before it stops
    host.outage_start()
    _at(clock, 20.0, host.outage_end)
    clock.env.run(until=19.9)
    assert seen == []
    clock.env.run(until=30)
    assert seen == [(b"v", 20.0)]
    assert b.reachable


def test_a_partitioned_nodes_lease_expires_ttl_after_the_cut_on_the_store_side() -> None:
    clock, host = _host()
    a = host.client("a")
    clock.spawn(_hold_lease(a, "k"))
    _at(clock, 10.0, a.partition_start)
    _at(clock, 100.0, a.partition_end)
    clock.env.run(until=24.9)
    assert "k" in _keys(host)
    clock.env.run(until=25.1)  # 10 + 15
    assert "k" not in _keys(host)


def test_a_cut_off_lease_expires_ttl_after_its_last_renewal_every_third_of_the_ttl() -> None:
    # granted at 0, renewed at 5 and 10 (every ttl/3); cut at 12: the last renewal that
    # reached the store was at 10, so the lease ends at 25, not 12 + 15 = 27
    clock, host = _host()
    a = host.client("a")
    clock.spawn(_hold_lease(a, "k"))
    _at(clock, 12.0, a.partition_start)
    clock.env.run(until=24.9)
    assert "k" in _keys(host)
    clock.env.run(until=25.1)
    assert "k" not in _keys(host)


@pytest.mark.parametrize(
    ("heal", "expiry"),
    [
        # the renewal due at 5 is held until 9, before the next is due (10): the schedule
        # goes on (10, 15, 20); cut again at 22, the last was at 20: the lease ends at 35
        (9.0, 35.0),
        # held until 11, past the next one's time: renewals restart from 11 (16, 21);
        # cut again at 22, the last was at 21: the lease ends at 36
        (11.0, 36.0),
    ],
)
def test_a_renewal_held_past_the_next_ones_time_restarts_the_schedule(
    heal: float, expiry: float
) -> None:
    clock, host = _host()
    a = host.client("a")
    clock.spawn(_hold_lease(a, "k"))
    _at(clock, 3.0, a.partition_start)
    _at(clock, heal, a.partition_end)
    _at(clock, 22.0, a.partition_start)
    clock.env.run(until=expiry - 0.1)
    assert "k" in _keys(host)
    clock.env.run(until=expiry + 0.1)
    assert "k" not in _keys(host)


def test_a_partition_healed_within_the_ttl_expires_nothing() -> None:
    clock, host = _host()
    a = host.client("a")
    clock.spawn(_hold_lease(a, "k"))
    _at(clock, 10.0, a.partition_start)
    _at(clock, 24.0, a.partition_end)
    clock.env.run(until=500)
    assert "k" in _keys(host)


def test_a_node_leaving_while_cut_off_cannot_revoke_and_its_lease_expires_later() -> None:
    clock, host = _host()
    a = host.client("a")
    clock.spawn(_hold_lease(a, "k"))
    _at(clock, 10.0, a.partition_start)
    clock.env.run(until=11)
    done = clock.spawn(a.leave())
    clock.env.run(until=11.5)
    assert done.done()  # leaving does not hang on an unreachable store
    clock.env.run(until=24.9)
    assert "k" in _keys(host)
    clock.env.run(until=25.1)
    assert "k" not in _keys(host)


def test_a_revoke_waits_for_the_store_and_a_cancelled_wait_leaves_nothing_pending() -> None:
    clock, host = _host(latency=0.001)
    a = host.client("a")
    holder: list[Any] = []

    async def grant() -> None:
        lease = await a.grant_lease(TTL)
        await a.set("k", b"x", lease=lease)
        holder.append(lease)

    clock.spawn(grant())
    clock.env.run(until=1)
    host.outage_start()
    t = clock.spawn(holder[0].revoke())
    clock.env.run(until=5)
    assert "k" in _keys(host) and not t.done()
    t.cancel()
    clock.env.run(until=6)
    with pytest.raises(Cancelled):
        t.result()
    host.outage_end()
    clock.spawn(holder[0].revoke())
    clock.env.run(until=7)
    assert "k" not in _keys(host)
