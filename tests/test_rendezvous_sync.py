"""torch's synchronous rendezvous API in real mode, through a LoopThread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from elastic.memstore import MemoryStore
from elastic.real.clock import AsyncioClock
from elastic.real.loop_thread import LoopThread
from elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    get_rendezvous_handler,
)

# -- the loop thread ------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_run_returns_the_result_and_raises_the_coroutines_exception() -> None:
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0.01)
        return a + b

    async def fail() -> None:
        raise KeyError("k")

    with LoopThread() as lt:
        assert lt.run(add(2, 3)) == 5
        with pytest.raises(KeyError):
            lt.run(fail())


@pytest.mark.timeout(30)
def test_run_from_the_loops_own_thread_refuses_instead_of_deadlocking() -> None:
    with LoopThread() as lt:

        async def nested() -> str:
            async def inner() -> None:
                pass

            try:
                lt.run(inner())
            except RuntimeError as e:
                return str(e)
            return "ran"

        assert "loop's own thread" in lt.run(nested())


@pytest.mark.timeout(30)
def test_close_cancels_what_still_runs_and_later_runs_refuse() -> None:
    lt = LoopThread()
    reached_finally = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            reached_finally.set()

    async def start() -> None:
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)

    lt.run(start())
    lt.close()
    assert reached_finally.is_set()
    assert not lt.loop.is_running() and lt.loop.is_closed()

    async def noop() -> None:
        pass

    with pytest.raises(RuntimeError, match="after close"):
        lt.run(noop())
    lt.close()  # idempotent


# -- the synchronous handler API ---------------------------------------------------------


def _handlers(lt: LoopThread, n: int, **conf: object) -> list[RendezvousHandler]:
    clock = AsyncioClock()
    store = MemoryStore(clock)
    params = RendezvousParameters("c10d", "localhost:0", "sync-job", n, n, **conf)
    return [
        get_rendezvous_handler(params, store=store, clock=clock, node=f"n{i}", sync_runner=lt.run)
        for i in range(n)
    ]


def _next_rendezvous_in_threads(handlers: list[RendezvousHandler]) -> list[RendezvousInfo]:
    """Each handler's ``next_rendezvous()`` from its own thread, as torch's callers do."""
    out: list[RendezvousInfo | BaseException | None] = [None] * len(handlers)

    def call(i: int) -> None:
        try:
            out[i] = handlers[i].next_rendezvous()
        except BaseException as e:
            out[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(handlers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    infos = []
    for r in out:
        if isinstance(r, BaseException):
            raise r
        assert r is not None, "next_rendezvous() did not return"
        infos.append(r)
    return infos


@pytest.mark.timeout(60)
def test_synchronous_next_rendezvous_forms_a_round_that_stays_valid_between_calls() -> None:
    with LoopThread() as lt:
        a, b = _handlers(lt, 2, keep_alive_interval=1, keep_alive_max_attempt=1)
        infos = _next_rendezvous_in_threads([a, b])
        assert sorted(i.rank for i in infos) == [0, 1]
        assert {i.world_size for i in infos} == {2}
        assert a.num_nodes_waiting() == 0 and not a.is_closed()

        # the round formed across the two threads' calls stays valid: the members' watch
        # lives on the loop thread (a runner that made a loop per call, like asyncio.run,
        # never forms the round at all: each waiter parks on its own loop)
        with pytest.raises(TimeoutError):
            lt.run(asyncio.wait_for(b.watch_async(), 1.0))

        # a's owner stops renewing, as a dead process would: in real mode too its lease
        # expires after the 1 s time-to-live, and b learns that a member was lost
        lease = a.lease
        assert lease is not None

        async def stop_renewing() -> None:
            lease.abandon()  # on the loop thread: its expiry is a task of that loop

        lt.run(stop_renewing())
        t0 = time.monotonic()
        assert lt.run(asyncio.wait_for(b.watch_async(), 30.0)) == "peer_lost"
        assert 0.9 <= time.monotonic() - t0 < 20.0

        a.set_closed()
        assert b.is_closed()
        with pytest.raises(RendezvousClosedError):
            b.next_rendezvous()
        assert a.shutdown() is True  # closing a closed rendezvous succeeds (torch)
        assert b.shutdown() is True


def test_without_a_sync_runner_the_synchronous_api_says_what_is_missing() -> None:
    with LoopThread() as lt:
        clock = AsyncioClock()
        params = RendezvousParameters("c10d", "localhost:0", "job", 1, 1)
        h = get_rendezvous_handler(params, store=MemoryStore(clock), clock=clock, node="n0")
        with pytest.raises(RuntimeError, match="needs a sync_runner"):
            h.next_rendezvous()
        h.sync_runner = lt.run
        assert h.next_rendezvous().world_size == 1
        h.shutdown()


@pytest.mark.timeout(60)
def test_stop_heartbeats_from_torchs_side_lets_the_lease_expire_as_a_dead_node() -> None:
    with LoopThread() as lt:
        a, b = _handlers(lt, 2, keep_alive_interval=1, keep_alive_max_attempt=1)
        _next_rendezvous_in_threads([a, b])
        t0 = time.monotonic()
        a._stop_heartbeats()  # type: ignore[attr-defined]  # torch's name, from this thread
        a._stop_heartbeats()  # type: ignore[attr-defined]  # twice is harmless
        assert lt.run(asyncio.wait_for(b.watch_async(), 30.0)) == "peer_lost"
        assert time.monotonic() - t0 >= 0.9  # not at once: the lease ran out its 1 s
        b.shutdown()
