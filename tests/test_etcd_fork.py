"""etcd and ``fork``: a child forked after its parent used etcd works, or says why at once.

gRPC's threads do not survive ``fork``: a child that used the etcd client inherited
from its parent (or the shared loop, or gRPC's poller) used to hang.  See "Fork" in
:mod:`elastic.real.etcdstore`.
"""

from __future__ import annotations

import asyncio
import faulthandler
import multiprocessing as mp
import uuid
from collections.abc import Callable, Iterator

import pytest

from elastic.errors import StoreError
from elastic.real.clock import AsyncioClock
from elastic.real.etcdstore import EtcdStoreClient, shared_loop
from tests.etcd_servers import BINARIES, EtcdCluster, etcd_binary
from tests.leftovers import is_mp_helper, no_leftover_processes

pytestmark = pytest.mark.timeout(120)

CHILD_JOIN = 60.0  # seconds; a child that hangs fails the test instead of the run


@pytest.fixture(scope="module", params=BINARIES)
def etcd(request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    with EtcdCluster(etcd_binary(str(request.param)), members=1) as cluster:
        yield cluster


async def _connect(endpoints: list[str], prefix: str) -> EtcdStoreClient:
    return await EtcdStoreClient.connect(endpoints, prefix=prefix, clock=AsyncioClock())


async def _set_get(endpoints: list[str], prefix: str, key: str, value: bytes) -> bytes:
    client = await _connect(endpoints, prefix)
    try:
        await client.set(key, value)
        return await client.get(key, timeout=10)
    finally:
        await client.aclose()


def _closes_then_prepares_a_fork(endpoints: list[str], prefix: str) -> None:
    from elastic.real import etcdstore

    for _ in range(5):
        shared_loop().run(_set_get(endpoints, prefix, "k", b"v"))
        # gRPC core's threads outlive the last channel by a few ms; the fork hook waits
        etcdstore._before_fork()
        assert not etcdstore._grpc_core_threads_alive()
        assert not etcdstore._poller_at_fork


def test_a_fork_right_after_the_last_close_waits_for_grpc_to_wind_down(
    etcd: EtcdCluster,
) -> None:
    # the window was a few ms: 1 fork in 200 made right after a close hung in the child's
    # first channel, on a loaded machine ("Other threads are currently calling into gRPC,
    # skipping fork() handlers")
    assert _in_a_fresh_process(_closes_then_prepares_a_fork, etcd.endpoints, "settle") == 0


def _child_connects_anew(endpoints: list[str], prefix: str) -> None:
    assert asyncio.run(_set_get(endpoints, prefix, "child", b"c")) == b"c"


def _child_uses_the_inherited_client(client: EtcdStoreClient) -> None:
    try:
        shared_loop().run(client.get("parent", timeout=10))
    except StoreError as e:
        assert "forked" in str(e) and "spawn" in str(e), e
        return
    raise AssertionError("the inherited client answered in a child forked mid-use")


def _dumping_stacks_if_hung(target: Callable[..., object], *args: object) -> None:
    # a child that hangs writes every thread's stack to stderr (the test's output) before
    # it is killed: the next such failure says where
    faulthandler.dump_traceback_later(CHILD_JOIN - 5)
    target(*args)


def _fork_and_join(target: Callable[..., object], *args: object) -> int | None:
    p = mp.get_context("fork").Process(target=_dumping_stacks_if_hung, args=(target, *args))
    p.start()
    p.join(CHILD_JOIN)
    if p.is_alive():  # hung: do not leave it behind
        p.kill()
        p.join()
        return None
    return p.exitcode


def _parent_closes_then_forks(endpoints: list[str], prefix: str) -> None:
    # the parent uses etcd on the shared loop (torch's API does), and closes its client
    got = shared_loop().run(_set_get(endpoints, prefix, "parent", b"p"))
    assert got == b"p"
    assert _fork_and_join(_child_connects_anew, endpoints, prefix) == 0
    # the child's write is there, and the parent still works
    assert shared_loop().run(_set_get(endpoints, prefix, "parent2", b"p2")) == b"p2"

    async def read_child() -> bytes:
        client = await _connect(endpoints, prefix)
        try:
            return await client.get("child", timeout=10)
        finally:
            await client.aclose()

    assert shared_loop().run(read_child()) == b"c"


def test_a_child_forked_after_the_parent_closed_its_client_uses_etcd(
    etcd: EtcdCluster,
) -> None:
    # the parent is a fresh process: this test process may hold etcd clients other tests
    # opened (torch's API caches them), and then a fork may not use gRPC (the next test)
    prefix = f"/test/{uuid.uuid4().hex}/"
    with no_leftover_processes(ignore=is_mp_helper):
        parent = mp.get_context("spawn").Process(
            target=_parent_closes_then_forks, args=(etcd.endpoints, prefix)
        )
        parent.start()
        parent.join(2 * CHILD_JOIN)
        if parent.is_alive():
            parent.kill()
            parent.join()
    assert parent.exitcode == 0


def test_a_child_forked_while_the_parent_holds_a_client_fails_at_once_not_hangs(
    etcd: EtcdCluster,
) -> None:
    prefix = f"/test/{uuid.uuid4().hex}/"
    loop = shared_loop()
    client = loop.run(_connect(etcd.endpoints, prefix))
    try:
        loop.run(client.set("parent", b"p"))
        with no_leftover_processes(ignore=is_mp_helper):
            assert _fork_and_join(_child_uses_the_inherited_client, client) == 0
        # the parent's client, loop and gRPC state are untouched by the child
        loop.run(client.set("parent", b"p2"))
        assert loop.run(client.get("parent", timeout=10)) == b"p2"
    finally:
        loop.run(client.aclose())


def _child_reaches_the_parents_c10d_store(endpoint: str) -> None:
    from elastic.rendezvous import RendezvousParameters
    from elastic.rendezvous.c10d_rendezvous_backend import create_backend

    params = RendezvousParameters("c10d", endpoint, "fork-job", 1, 2, is_host="false")
    _, store = create_backend(params)
    store.set("from-child", b"c")


def _parent_hosts_a_c10d_store_then_forks() -> None:
    # the parent's store (cached per endpoint for torch's API) belongs to the parent's
    # loop thread, which a forked child does not have: the child connects anew
    from elastic.rendezvous import RendezvousParameters
    from elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from elastic.utils.distributed import get_free_port

    endpoint = f"127.0.0.1:{get_free_port()}"
    _, store = create_backend(RendezvousParameters("c10d", endpoint, "fork-job", 1, 2))
    store.set("from-parent", b"p")
    assert _fork_and_join(_child_reaches_the_parents_c10d_store, endpoint) == 0
    assert store.get("from-child") == b"c"


def test_a_forked_child_opens_its_own_rendezvous_store_not_the_parents() -> None:
    # in a fresh parent: this test process may hold other tests' gRPC threads, and a
    # child forked beside them can hang in gRPC whatever the c10d store does
    assert _in_a_fresh_process(_parent_hosts_a_c10d_store_then_forks) == 0


def _one_node_etcd_round(endpoint: str, run_id: str) -> None:
    from elastic.rendezvous import RendezvousParameters
    from elastic.rendezvous.registry import get_rendezvous_handler

    params = RendezvousParameters("etcd-v2", endpoint, run_id, 1, 1)
    handler = get_rendezvous_handler(params)
    try:
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
    finally:
        handler.shutdown()


def _parent_rendezvouses_shuts_down_then_forks(endpoint: str) -> None:
    # torch's agent tests: an agent run (and its handler shut down) in the test process,
    # then agents started with multiprocessing's fork
    from elastic.real import rdzv_context

    two = [_handler_on(endpoint) for _ in range(2)]
    two[0].shutdown()
    assert rdzv_context._opened, "a user is left: the client stays open"
    two[1].shutdown()
    assert not rdzv_context._opened and not rdzv_context._stores  # the last one closed it
    _one_node_etcd_round(endpoint, uuid.uuid4().hex)  # a new handler connects again
    assert _fork_and_join(_one_node_etcd_round, endpoint, uuid.uuid4().hex) == 0


def _in_a_fresh_process(target: Callable[..., object], *args: object) -> int | None:
    """Run ``target(*args)`` as a spawned process (this test process may hold etcd
    clients of other tests); its exit code (None: it hung and was killed)."""
    with no_leftover_processes(ignore=is_mp_helper):
        parent = mp.get_context("spawn").Process(target=target, args=args)
        parent.start()
        parent.join(2 * CHILD_JOIN)
        if parent.is_alive():
            parent.kill()
            parent.join()
    return parent.exitcode


def _in_a_fresh_parent(target: Callable[[str], object], etcd: EtcdCluster) -> int | None:
    return _in_a_fresh_process(target, etcd.endpoints[0].removeprefix("http://"))


def _handler_on(endpoint: str) -> object:
    from elastic.rendezvous import RendezvousParameters
    from elastic.rendezvous.registry import get_rendezvous_handler

    handler = get_rendezvous_handler(
        RendezvousParameters("etcd-v2", endpoint, uuid.uuid4().hex, 1, 1)
    )
    handler.next_rendezvous()
    return handler


def test_the_last_registry_handler_shut_down_closes_its_etcd_client_so_a_fork_can_use_etcd(
    etcd: EtcdCluster,
) -> None:
    assert _in_a_fresh_parent(_parent_rendezvouses_shuts_down_then_forks, etcd) == 0


def _parent_drops_a_handler_unshut_then_forks(endpoint: str) -> None:
    # torch's agent tests that run an agent without shutting its handler down, then fork
    from elastic.real import rdzv_context

    handler = _handler_on(endpoint)
    kept = _handler_on(endpoint)
    del handler  # collected (a cycle, maybe) without a shutdown
    assert _fork_and_join(_one_node_etcd_round, endpoint, uuid.uuid4().hex) != 0  # one held
    kept.shutdown()
    assert not rdzv_context._opened  # the last holder's shutdown closed it (after the fork)
    third = _handler_on(endpoint)
    del third
    assert _fork_and_join(_one_node_etcd_round, endpoint, uuid.uuid4().hex) == 0
    assert not rdzv_context._opened  # closed before the fork: no handler held it


def test_an_etcd_client_no_handler_holds_is_closed_before_a_fork(etcd: EtcdCluster) -> None:
    assert _in_a_fresh_parent(_parent_drops_a_handler_unshut_then_forks, etcd) == 0
