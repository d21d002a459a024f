"""Every implementation of the Store port passes the shipped conformance suite.

:mod:`elastic.testing.store` holds the checks; this module runs each of them against
each store: the in-memory store on asyncio and on simpy, the simulator's per-node client
(through its store host), the network client against a real server on loopback, with
and without a token, the store over torch's one-blob backend contract on both, and the
in-memory and network stores living on a loop thread, used from another loop.  A
new store implementation adds a harness here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from elastic.clock import Clock
from elastic.memstore import MemoryStore
from elastic.real.clock import AsyncioClock
from elastic.real.home_loop_store import HomeLoopStore
from elastic.real.loop_thread import LoopThread
from elastic.real.netstore import NetStoreClient, StoreServer
from elastic.rendezvous.backend_store import BackendStore
from elastic.store import Store
from elastic.testing.store import ALL_CHECKS, Check, StoreHarness, check_store
from sim.clock import SimClock
from sim.store import SimStoreHost
from tests.worlds import run_in

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")


class MemoryHarness:
    """One MemoryStore shared by every 'client' (in either world)."""

    slack: float

    def __init__(self, clock: Clock, exact: bool) -> None:
        self.store = MemoryStore(clock)
        self.unit = 0.05
        self.slack = 0.0 if exact else 0.05

    async def open(self) -> Store:
        return self.store

    async def close(self, store: Store) -> None:
        assert store is self.store
        self.store.close()

    async def teardown(self) -> None:
        self.store.close()


class SimClientHarness:
    """The simulator's store host; each open() is another node's client."""

    def __init__(self, clock: SimClock) -> None:
        self.host = SimStoreHost(clock)
        self.unit = 0.05
        self.slack = 0.0
        self._n = 0

    async def open(self) -> Store:
        self._n += 1
        return self.host.client(f"n{self._n}")

    async def close(self, store: Store) -> None:
        self.host.store.close()  # a simulated client has no connection of its own to close

    async def teardown(self) -> None:
        self.host.store.close()


class NetHarness:
    """A StoreServer on loopback; each open() is a new NetStoreClient connection."""

    def __init__(self, clock: AsyncioClock, token: str | None) -> None:
        self.clock = clock
        self.token = token
        self.server = StoreServer("127.0.0.1", 0, token=token)
        self.clients: list[NetStoreClient] = []
        # loopback round trips are sub-millisecond, but this machine is shared: wider
        # units and slack than in memory keep the timing checks honest and not flaky
        self.unit = 0.2
        self.slack = 0.25

    async def start(self) -> NetHarness:
        await self.server.start()
        return self

    async def open(self) -> Store:
        c = await NetStoreClient.connect(
            "127.0.0.1", self.server.port, token=self.token, clock=self.clock, read_timeout=10
        )
        self.clients.append(c)
        return c

    async def close(self, store: Store) -> None:
        assert isinstance(store, NetStoreClient)
        await store.aclose()

    async def teardown(self) -> None:
        for c in self.clients:
            await c.aclose()
        await self.server.aclose()


class BackendHarness:
    """:class:`BackendStore` (the store port over torch's one-blob backend contract, as
    ``DynamicRendezvousHandler.from_backend`` builds it) over a user's in-memory backend;
    each open() is another node's store on the same blob."""

    def __init__(self, clock: Clock, exact: bool) -> None:
        from tests.test_rendezvous_backend import DictBackend

        self.clock = clock
        self.backend = DictBackend()
        self.unit = 0.05
        # a backend has no watch: waits poll the blob, so a wake-up is up to a poll late
        self.poll = 0.005
        self.slack = 2 * self.poll if exact else 0.05 + self.poll
        self.stores: list[BackendStore] = []

    async def open(self) -> Store:
        store = BackendStore(self.backend, self.clock, poll_interval=self.poll)
        self.stores.append(store)
        return store

    async def close(self, store: Store) -> None:
        assert isinstance(store, BackendStore)
        store.close()

    async def teardown(self) -> None:
        for store in self.stores:
            store.close()


class HomeLoopHarness:
    """Another harness's stores living on a loop thread (as torch-style handlers' stores
    do), each used from the test's own loop through :class:`HomeLoopStore`."""

    def __init__(self, net: bool) -> None:
        self.home = LoopThread(name="conformance-home")
        self.net = net
        self.inner: StoreHarness | None = None

    async def start(self, clock: AsyncioClock) -> HomeLoopHarness:
        net = self.net

        async def make() -> StoreHarness:
            if net:
                return await NetHarness(AsyncioClock(), None).start()
            return MemoryHarness(AsyncioClock(), exact=False)

        self.inner = await _home(self.home, make)
        self.unit, self.slack = self.inner.unit, self.inner.slack + 0.02
        return self

    async def open(self) -> Store:
        assert self.inner is not None
        return HomeLoopStore(await _home(self.home, self.inner.open), self.home.loop)

    async def close(self, store: Store) -> None:
        assert self.inner is not None and isinstance(store, HomeLoopStore)
        inner, harness = store.inner, self.inner
        await _home(self.home, lambda: harness.close(inner))

    async def teardown(self) -> None:
        if self.inner is not None:
            await _home(self.home, self.inner.teardown)
        await asyncio.to_thread(self.home.close)


async def _home(home: LoopThread, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), home.loop))


BACKENDS = (
    "memory-real",
    "memory-home",
    "net-home",
    "memory-sim",
    "simclient-sim",
    "net",
    "net-token",
    "backend-real",
    "backend-sim",
)


async def _harness(backend: str, clock: Clock) -> StoreHarness:
    if backend == "memory-real":
        return MemoryHarness(clock, exact=False)
    if backend == "memory-sim":
        return MemoryHarness(clock, exact=True)
    if backend.startswith("backend-"):
        return BackendHarness(clock, exact=backend == "backend-sim")
    if backend == "simclient-sim":
        assert isinstance(clock, SimClock)
        return SimClientHarness(clock)
    assert isinstance(clock, AsyncioClock)
    if backend.endswith("-home"):
        return await HomeLoopHarness(net=backend == "net-home").start(clock)
    return await NetHarness(clock, "s3cret" if backend == "net-token" else None).start()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_store_conforms(backend: str, check: Check) -> None:
    world = "sim" if backend.endswith("-sim") else "real"

    async def body(clock: Clock) -> None:
        async def make() -> StoreHarness:
            return await _harness(backend, clock)

        await check_store(clock, make, (check,))

    run_in(world, body)


def test_check_store_names_the_failing_check() -> None:
    class Forgetful(MemoryHarness):
        async def open(self) -> Store:
            store = self.store

            class Lossy:  # drops every write
                def __getattr__(self, name: str) -> object:
                    return getattr(store, name)

                async def set(self, key: str, value: bytes, *, lease: object = None) -> None:
                    return None

            return Lossy()  # type: ignore[return-value]

    async def body(clock: Clock) -> None:
        async def make() -> StoreHarness:
            return Forgetful(clock, exact=True)

        first = "check_get_blocks_until_another_client_sets_the_key: TimeoutError"
        with pytest.raises(AssertionError, match=first):
            await check_store(clock, make)

    run_in("sim", body)
