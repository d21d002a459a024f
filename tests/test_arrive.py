"""``arrive``: joining a round in one store operation (elastic.store.ArriveStore).

The port's promises are in the conformance suite (two checks run against every store:
tests/test_store_conformance.py, tests/test_etcd_conformance.py); the rendezvous's use
of it in tests/test_rendezvous_round_cost.py (a bounded number of keys read per joiner
of an elastic range) and tests/test_rendezvous_model_vs_driver.py (the same decisions
with it and with the steps apart).  Here: the checks catch an arrive whose steps are
not one operation; a network store host of an older version gets nothing it cannot
decode, and a rendezvous over it still forms.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from elastic.clock import Clock
from elastic.errors import StoreUnsupportedError
from elastic.memstore import MemoryStore
from elastic.real import netstore, netstore_protocol
from elastic.real.clock import AsyncioClock
from elastic.real.netstore import NetStoreClient, StoreServer
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from elastic.store import Lease, Store
from elastic.testing.store import check_arrive_is_atomic_under_concurrent_clients, check_store
from sim.clock import SimClock
from sim.store import SimStoreClient, SimStoreHost
from tests.worlds import run_in

pytestmark = pytest.mark.timeout(60)


class _StepsApart(SimStoreClient):
    """A simulated client whose ``arrive`` is three round trips: not one operation."""

    async def arrive(  # type: ignore[override]
        self, counter: str, key: str, value: bytes, under: str, *, lease: Lease | None = None
    ) -> tuple[int, int, int, bool]:
        n = await self.add(counter, 1)
        await self.set(key, value, lease=lease)
        rev, present, marked = await self.count_prefix(under)
        return n, rev, present, marked


def test_the_atomicity_check_fails_an_arrive_made_of_separate_steps() -> None:
    async def body(clock: Clock) -> str:
        assert isinstance(clock, SimClock)
        host = SimStoreHost(clock, latency=0.01)

        class Harness:
            unit, slack = 0.05, 0.0

            async def open(self) -> Store:
                return _StepsApart(host, "n")

            async def close(self, store: Store) -> None:
                host.store.close()

            async def teardown(self) -> None:
                host.store.close()

        async def make() -> Any:
            return Harness()

        try:
            await check_store(clock, make, (check_arrive_is_atomic_under_concurrent_clients,))
        except AssertionError as e:
            return str(e)
        return "passed"

    assert "arrive_is_atomic" in run_in("sim", body)


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ops the network store host decodes, in order: this thread's only (a host that
    another test left serving in a background thread decodes through the patch too)."""
    seen: list[str] = []
    decode = netstore.decode_request
    here = threading.get_ident()

    def recording(body: bytes, max_frame: int = netstore_protocol.MAX_FRAME) -> Any:
        req = decode(body, max_frame)
        if threading.get_ident() == here:
            seen.append(req.op)
        return req

    monkeypatch.setattr(netstore, "decode_request", recording)
    return seen


def _old_host(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A host of the version before ``arrive``: it neither lists nor decodes it (an
    unknown op closes the connection); returns the ops it decodes."""
    monkeypatch.setattr(netstore, "FEATURES", ("watch_snapshot",))
    monkeypatch.delitem(netstore_protocol.OPS, "arrive")
    return _recorded(monkeypatch)


async def _three_nodes_on_a_host(lo: int, hi: int, before: Any = None) -> tuple[list[int], int]:
    """Three handlers, one network client each, on a fresh host: the ranks of their first
    round and the round's arrival count.  ``before(client)`` runs first."""
    server = StoreServer("127.0.0.1", 0)
    await server.start()
    clock = AsyncioClock()
    clients = [
        await NetStoreClient.connect("127.0.0.1", server.port, clock=clock, read_timeout=5)
        for _ in range(3)
    ]
    try:
        if before is not None:
            await before(clients[0])
        settings = RendezvousSettings("job", lo, hi, RendezvousTimeout(30.0, 0.5, 5.0))
        hs = [
            DynamicRendezvousHandler(f"n{i}", f"h{i}", settings, "c10d", c, clock)
            for i, c in enumerate(clients)
        ]
        infos = await asyncio.wait_for(asyncio.gather(*(h.next_rendezvous_async() for h in hs)), 20)
        count = await clients[0].try_get("elastic/rdzv/job/c/r0/ev//n")  # arrivals
        for h in hs:
            await h.leave_async()
        return sorted(i.rank for i in infos), int(count or b"0")
    finally:
        for c in clients:
            await c.aclose()
        await server.aclose()


def test_an_old_host_gets_no_arrive_and_the_rendezvous_forms_over_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _old_host(monkeypatch)

    async def refused(client: NetStoreClient) -> None:
        with pytest.raises(StoreUnsupportedError, match="predates it"):
            await client.arrive("c", "m/x", b"", "m/")

    assert asyncio.run(_three_nodes_on_a_host(2, 3, refused)) == ([0, 1, 2], 3)
    assert "arrive" not in seen and "add" in seen, seen


def test_a_rendezvous_joins_with_one_arrive_per_node_on_a_new_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _recorded(monkeypatch)
    assert asyncio.run(_three_nodes_on_a_host(3, 3)) == ([0, 1, 2], 3)
    assert seen.count("arrive") == 3 and "add" not in seen, seen


def test_the_in_memory_arrive_refuses_an_expired_lease_and_changes_nothing() -> None:
    async def body(clock: Clock) -> None:
        store = MemoryStore(clock)
        lease = await store.grant_lease(1.0)
        await lease.revoke()
        rev0 = store.revision
        with pytest.raises(Exception, match="expired"):
            await store.arrive("c", "m/a", b"", "m/", lease=lease)
        assert store.revision == rev0 and store.keys() == []

    run_in("sim", body)
