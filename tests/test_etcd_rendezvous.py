"""The dynamic rendezvous, unchanged, over real etcd: one member, and a cluster of three
that loses its leader (SIGKILL) between two rounds.

Every handler has its own EtcdStoreClient, as every node of a job would.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest

from elastic.real.clock import AsyncioClock
from elastic.real.etcdstore import EtcdStoreClient, shared_loop
from elastic.rendezvous import RendezvousInfo
from elastic.rendezvous.dynamic import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from tests.etcd_servers import BINARIES, EtcdCluster, etcd_binary

LAST_CALL = 0.5


@pytest.fixture
def etcd_one() -> Iterator[EtcdCluster]:
    with EtcdCluster(etcd_binary("distro"), members=1) as cluster:
        yield cluster


async def connect_each(
    cluster: EtcdCluster, n: int, prefix: str, *, spread: bool = True
) -> list[EtcdStoreClient]:
    """``n`` clients listing every member; with ``spread`` each starts on a different one."""
    eps = cluster.endpoints
    out = []
    for i in range(n):
        order = eps[i % len(eps) :] + eps[: i % len(eps)] if spread else eps
        out.append(
            await EtcdStoreClient.connect(
                order, prefix=prefix, clock=AsyncioClock(), read_timeout=30
            )
        )
    return out


def handlers(
    clients: Sequence[EtcdStoreClient], lo: int, hi: int, ttl: float
) -> list[DynamicRendezvousHandler]:
    settings = RendezvousSettings("job", lo, hi, RendezvousTimeout(60, LAST_CALL, 5))
    return [
        DynamicRendezvousHandler(
            f"n{i}", f"host-{i}", settings, "etcd", c, AsyncioClock(), lease_ttl=ttl
        )
        for i, c in enumerate(clients)
    ]


async def join_all(hs: Sequence[DynamicRendezvousHandler]) -> list[RendezvousInfo]:
    return list(await asyncio.gather(*(h.next_rendezvous_async() for h in hs)))


def agree(infos: Sequence[RendezvousInfo], n: int) -> None:
    assert {i.world_size for i in infos} == {n}
    assert len({i.round for i in infos}) == 1
    assert sorted(i.rank for i in infos) == list(range(n))


async def close_all(clients: Sequence[EtcdStoreClient]) -> None:
    for c in clients:
        await c.aclose()


def test_a_dead_nodes_lease_expiry_makes_survivors_watch_return_peer_lost(
    etcd_one: EtcdCluster,
) -> None:
    async def body() -> tuple[list[str], float, float, list[RendezvousInfo]]:
        clients = await connect_each(etcd_one, 3, f"/t/{uuid.uuid4().hex}/")
        try:
            hs = handlers(clients, 2, 3, ttl=2)
            agree(await join_all(hs), 3)
            watches = [asyncio.create_task(h.watch_async()) for h in hs[:2]]
            lease = hs[2].lease
            assert lease is not None
            t0 = time.monotonic()
            lease.abandon()  # node n2 dies
            reasons = list(await asyncio.gather(*watches))
            took = time.monotonic() - t0
            return reasons, took, lease.ttl, await join_all(hs[:2])
        finally:
            await close_all(clients)

    reasons, took, ttl, infos = shared_loop().run(body())
    assert reasons == ["peer_lost", "peer_lost"]
    assert ttl - 0.01 <= took < ttl + 3.0  # etcd sweeps expired leases every 0.5 s
    agree(infos, 2)


@pytest.fixture(params=BINARIES)
def three_members(request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    with EtcdCluster(etcd_binary(str(request.param)), members=3) as cluster:
        yield cluster


@pytest.mark.slow
def test_three_handlers_rendezvous_on_three_members_and_again_after_the_leader_is_killed(
    three_members: EtcdCluster,
) -> None:
    cluster = three_members

    async def body() -> tuple[list[RendezvousInfo], list[RendezvousInfo], int, list[bytes]]:
        clients = await connect_each(cluster, 3, f"/t/{uuid.uuid4().hex}/")
        try:
            hs = handlers(clients, 3, 3, ttl=5)
            first = await join_all(hs)
            leader = await asyncio.to_thread(cluster.leader)
            await asyncio.to_thread(cluster.kill, leader)  # SIGKILL
            # every client, including the one that was talking to the dead leader
            values = []
            for i, c in enumerate(clients):
                await c.set(f"after/{i}", str(i).encode())
                await c.add("after/count", 1)
                values.append(await c.get(f"after/{i}", timeout=30))
            values.append(await clients[0].get("after/count", timeout=30))
            second = await join_all(hs)
            # a new client whose first listed endpoint is the dead member
            eps = cluster.endpoints
            late = await EtcdStoreClient.connect(
                [eps[leader]] + [e for i, e in enumerate(eps) if i != leader],
                prefix=clients[0].prefix,
                clock=AsyncioClock(),
            )
            try:
                values.append(await late.get("after/count", timeout=30))
            finally:
                await late.aclose()
            return first, second, leader, values
        finally:
            await close_all(clients)

    first, second, leader, values = shared_loop().run(body())
    agree(first, 3)
    agree(second, 3)
    assert second[0].round == first[0].round + 1
    assert values == [b"0", b"1", b"2", b"3", b"3"]
    assert leader not in cluster.alive()
