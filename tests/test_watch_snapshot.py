"""``watch_snapshot``: a wake and the read that follows it in one round trip, on every
store that can, and watch-then-snapshot on any other (elastic.store's invariant).

The port's promises themselves are in the conformance suite (two checks, run against
every store: tests/test_store_conformance.py, tests/test_etcd_conformance.py); these
tests pin what each implementation adds: one round trip (simulated, on the wire, one
read of a polled backend), the network store's fallback for a host that predates the
op, and the fallback for a store written without it — a user's store, under the
rendezvous too.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from elastic.clock import Clock
from elastic.memstore import MemoryStore
from elastic.real import netstore, netstore_protocol
from elastic.real.clock import AsyncioClock
from elastic.real.netstore import NetStoreClient, StoreServer
from elastic.rendezvous.backend_store import BackendStore, RendezvousBackend, Token
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from elastic.rendezvous.prefix_store import PrefixStore
from elastic.store import Store, watch_snapshot_op
from elastic.testing.store import (
    StoreHarness,
    check_store,
    check_watch_snapshot_answers_as_a_watch_then_a_snapshot,
    check_watch_snapshot_reads_at_the_revision_it_returns,
)
from sim.clock import SimClock
from sim.store import SimStoreHost
from tests.worlds import WORLDS, run_in

pytestmark = pytest.mark.timeout(60)

CHECKS = (
    check_watch_snapshot_answers_as_a_watch_then_a_snapshot,
    check_watch_snapshot_reads_at_the_revision_it_returns,
)


class Plain:
    """A user's store: the Store port's methods only (no watch_snapshot), counting calls."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in ("watch_snapshot", "count_prefix", "delete_prefix"):
            raise AttributeError(name)
        self.calls.append(name)
        return getattr(self._store, name)


class PlainHarness:
    def __init__(self, clock: Clock, wrap: str) -> None:
        self.store = MemoryStore(clock)
        self.wrap = wrap
        self.unit = 0.05
        self.slack = 0.0 if isinstance(clock, SimClock) else 0.05

    async def open(self) -> Store:
        plain: Store = Plain(self.store)  # type: ignore[assignment]
        return PrefixStore(plain, "job/") if self.wrap == "prefix" else plain

    async def close(self, store: Store) -> None:
        self.store.close()

    async def teardown(self) -> None:
        self.store.close()


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("wrap", ["plain", "prefix"])
def test_a_store_without_the_op_keeps_its_promise_through_the_fallback(
    world: str, wrap: str
) -> None:
    async def body(clock: Clock) -> None:
        async def make() -> StoreHarness:
            return PlainHarness(clock, wrap)

        await check_store(clock, make, CHECKS)

    run_in(world, body)


def test_the_fallback_is_a_watch_then_a_snapshot_and_native_stores_need_no_fallback() -> None:
    async def body(clock: Clock) -> None:
        mem = MemoryStore(clock)
        plain = Plain(mem)
        op = watch_snapshot_op(plain)  # type: ignore[arg-type]
        await mem.set("w/k", b"1")
        await mem.set("r/a", b"2")
        assert await op("w/", 0, "r/", 0) == (2, {"r/a": b"2"})
        assert plain.calls == ["watch", "snapshot"]
        assert watch_snapshot_op(mem) == mem.watch_snapshot
        view = PrefixStore(mem, "p/")
        assert watch_snapshot_op(view) == view.watch_snapshot

    run_in("sim", body)


def test_a_prefix_view_forwards_to_the_store_s_own_op_in_one_operation() -> None:
    async def body(clock: Clock) -> None:
        mem = MemoryStore(clock)
        view = PrefixStore(mem, "job/")
        await mem.multi_set({"job/w/k": b"1", "job/r/a": b"2", "other/r/b": b"3"})
        before = mem.stats.ops
        assert await view.watch_snapshot("w/", 0, "r/", 0) == (1, {"r/a": b"2"})
        assert mem.stats.ops == before + 1

    run_in("sim", body)


def test_the_simulated_client_answers_a_wake_with_its_read_in_one_round_trip() -> None:
    clock = SimClock()
    host = SimStoreHost(clock, latency=0.25)
    watcher, writer = host.client("n0"), host.client("n1")
    got: list[tuple[float, tuple[int, dict[str, bytes]]]] = []

    async def watch() -> None:
        answer = await watcher.watch_snapshot("w/", 0, "r/", None)
        got.append((clock.now(), answer))

    async def write() -> None:
        await clock.sleep(1.0)
        await writer.multi_set({"w/k": b"1", "r/a": b"1"})  # reaches the host at 1.25
        await writer.set("r/b", b"2")  # at 1.5: after the wake, not in its read

    clock.spawn(watch())
    clock.spawn(write())
    clock.env.run()
    assert not clock.unobserved
    # the request reached the host at 0.25; the wake and its read at 1.25, answered then
    assert got == [(1.25, (1, {"r/a": b"1"}))]
    assert host.store.stats.ops == 3  # watch_snapshot, multi_set, set


# -- the network store ----------------------------------------------------------------


def _ops_on_host(server: StoreServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the ops the server decodes (what crossed the wire, one entry a request).

    Only this thread's decodes count: the patch is module-wide, and a store host that
    another test left serving in a background thread (its clients renewing leases) decodes
    through it too."""
    seen: list[str] = []
    decode = netstore.decode_request
    here = threading.get_ident()

    def recording(body: bytes, max_frame: int = netstore_protocol.MAX_FRAME) -> Any:
        req = decode(body, max_frame)
        if req.op not in ("hello", "ping") and threading.get_ident() == here:
            seen.append(req.op)
        return req

    monkeypatch.setattr(netstore, "decode_request", recording)
    return seen


async def _wake_and_read(server: StoreServer) -> tuple[int, dict[str, bytes]]:
    clock = AsyncioClock()
    a = await NetStoreClient.connect("127.0.0.1", server.port, clock=clock, read_timeout=5)
    b = await NetStoreClient.connect("127.0.0.1", server.port, clock=clock, read_timeout=5)
    try:
        rev, _ = await a.snapshot("")
        waiting = asyncio.create_task(a.watch_snapshot("w/", rev, "r/", 10))
        await asyncio.sleep(0.05)
        await b.multi_set({"w/k": b"1", "r/a": b"1"})
        return await asyncio.wait_for(waiting, 10)
    finally:
        await a.aclose()
        await b.aclose()


def _wake_and_read_on_a_host(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[tuple[int, dict[str, bytes]], list[str]]:
    """:func:`_wake_and_read` on a fresh network store host, and the ops the host saw."""

    async def body() -> tuple[tuple[int, dict[str, bytes]], list[str]]:
        server = StoreServer("127.0.0.1", 0)
        await server.start()
        seen = _ops_on_host(server, monkeypatch)
        try:
            return await _wake_and_read(server), seen
        finally:
            await server.aclose()

    return asyncio.run(body())


def test_the_network_store_answers_a_wake_with_its_read_in_one_wire_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (rev, items), seen = _wake_and_read_on_a_host(monkeypatch)
    assert (rev, items) == (1, {"r/a": b"1"})
    assert seen == ["snapshot", "watch_snapshot", "multi_set"], seen


def test_a_new_client_falls_back_on_a_host_that_predates_the_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host without the op neither lists it at hello nor decodes it (it would close the
    connection): the client sees that at hello and sends watch then snapshot."""
    monkeypatch.setattr(netstore, "FEATURES", ())
    monkeypatch.delitem(netstore_protocol.OPS, "watch_snapshot")

    (rev, items), seen = _wake_and_read_on_a_host(monkeypatch)
    assert items == {"r/a": b"1"} and rev >= 1
    assert seen == ["snapshot", "watch", "multi_set", "snapshot"], seen


def test_an_old_client_s_hello_check_accepts_a_new_host_s_reply() -> None:
    """The only change an old client sees from a new host is the ``ops`` list in hello's
    reply: its check reads the keys it knows and ignores the rest."""
    reply = {"instance": "x", "idle_timeout": 60.0, "revision": 3, "max_frame": 1024}
    new = {**reply, "ops": list(netstore_protocol.FEATURES)}
    assert netstore_protocol.check_result("hello", new) == new
    with pytest.raises(netstore_protocol.ProtocolError, match="ops"):
        netstore_protocol.check_result("hello", {**reply, "ops": [1]})


# -- a polled backend -------------------------------------------------------------------


class CountingBackend(RendezvousBackend):
    def __init__(self) -> None:
        self.value: bytes | None = None
        self.version = 0
        self.reads = 0

    @property
    def name(self) -> str:
        return "counting"

    def get_state(self) -> tuple[bytes, Token] | None:
        self.reads += 1
        return None if self.value is None else (self.value, self.version)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool]:
        if (token is None and self.value is None) or (token == self.version and token):
            self.value, self.version = state, self.version + 1
            return state, self.version, True
        assert self.value is not None
        return self.value, self.version, False


def test_a_backend_store_answers_from_the_one_read_that_saw_the_change() -> None:
    async def body(clock: Clock) -> tuple[int, dict[str, bytes], int]:
        backend = CountingBackend()
        store = BackendStore(backend, clock, poll_interval=0.1)
        await store.multi_set({"w/k": b"1", "r/a": b"1"})
        backend.reads = 0
        rev, items = await store.watch_snapshot("w/", 0, "r/", 1.0)
        return rev, items, backend.reads

    assert run_in("sim", body) == (1, {"r/a": b"1"}, 1)


# -- the rendezvous over a store without the op ------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_the_rendezvous_runs_over_a_store_without_the_op(world: str) -> None:
    """A user's store (the port's methods only) gets the same rounds: the joiners' and
    members' waits fall back to a watch then a snapshot."""
    n = 4

    async def body(clock: Clock) -> tuple[list[str], list[str]]:
        plain = Plain(MemoryStore(clock))
        settings = RendezvousSettings("job", 2, n, RendezvousTimeout(30.0, 0.5, 5.0))
        hs = [
            DynamicRendezvousHandler(f"n{i}", f"h{i}", settings, "c10d", plain, clock)  # type: ignore[arg-type]
            for i in range(n)
        ]
        first = [clock.spawn(h.next_rendezvous_async()) for h in hs]
        infos = [await t.join() for t in first]
        watches = [clock.spawn(h.watch_async()) for h in hs[1:]]
        await clock.sleep(0.5)
        again = [clock.spawn(hs[0].next_rendezvous_async())]
        why = [await w.join() for w in watches]
        again += [clock.spawn(h.next_rendezvous_async()) for h in hs[1:]]
        second = [await t.join() for t in again]
        worlds = [f"{i.round}:{i.world_size}:{i.rank}" for i in infos + second]
        return worlds, why + sorted(set(plain.calls))

    worlds, rest = run_in(world, body)
    assert worlds == [f"{r}:{n}:{k}" for r in (0, 1) for k in range(n)]
    assert rest[: n - 1] == ["restarted"] * (n - 1)
    assert "watch" in rest and "watch_snapshot" not in rest
