"""The dynamic rendezvous driver on the in-memory store, in both worlds (asyncio and simpy)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pytest

from elastic.clock import Clock
from elastic.memstore import MemoryStore
from elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousInfo,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from elastic.store import Lease
from sim.clock import SimClock
from sim.store import SimStoreHost
from tests.worlds import run_in

# Small timeouts so the real world stays fast; the sim runs them exactly.
LAST_CALL = 0.2
TTL = 0.3


def make(
    clock: Clock,
    store: MemoryStore,
    ids: Sequence[str],
    lo: int,
    hi: int,
    *,
    join: float = 5.0,
) -> list[DynamicRendezvousHandler]:
    settings = RendezvousSettings("job", lo, hi, RendezvousTimeout(join, LAST_CALL, 1.0))
    return [
        DynamicRendezvousHandler(i, f"host-{i}", settings, "c10d", store, clock, lease_ttl=TTL)
        for i in ids
    ]


async def join_all(clock: Clock, hs: Sequence[DynamicRendezvousHandler]) -> list[RendezvousInfo]:
    tasks = [clock.spawn(h.next_rendezvous_async(), name=h.node_id) for h in hs]
    return [await t.join() for t in tasks]


def agree(infos: Sequence[RendezvousInfo], ids: Sequence[str]) -> None:
    assert {i.world_size for i in infos} == {len(infos)}
    assert {i.round for i in infos} == {infos[0].round}
    # RendezvousStoreInfo is a plain (mutable, unhashable) dataclass, as in torch
    assert all(i.bootstrap_store_info == infos[0].bootstrap_store_info for i in infos)
    by_id = sorted(ids)
    assert [i.rank for i in infos] == [by_id.index(n) for n in ids]


def test_nodes_joining_together_agree_on_round_world_and_ranks_sorted_by_id(world: str) -> None:
    ids = ["n3", "n1", "n4", "n0", "n2"]

    async def body(clock: Clock) -> tuple[list[RendezvousInfo], float]:
        store = MemoryStore(clock)
        t0 = clock.now()
        infos = await join_all(clock, make(clock, store, ids, 3, 8))
        return infos, clock.now() - t0

    infos, took = run_in(world, body)
    agree(infos, ids)
    assert infos[0].bootstrap_store_info.master_addr == "host-n0"
    assert took >= LAST_CALL  # below max_nodes the round waits for the last call
    if world == "sim":
        assert took == LAST_CALL


def test_round_completes_at_once_when_max_nodes_join(world: str) -> None:
    async def body(clock: Clock) -> float:
        store = MemoryStore(clock)
        t0 = clock.now()
        await join_all(clock, make(clock, store, ["a", "b", "c"], 1, 3))
        return clock.now() - t0

    assert run_in(world, body) < LAST_CALL


def test_late_joiner_makes_members_watch_return_nodes_waiting_then_joins_next_round(
    world: str,
) -> None:
    async def body(clock: Clock) -> tuple[str, int, list[RendezvousInfo]]:
        store = MemoryStore(clock)
        a, b, late = make(clock, store, ["a", "b", "late"], 2, 4)
        await join_all(clock, [a, b])
        watch = clock.spawn(a.watch_async())
        late_task = clock.spawn(late.next_rendezvous_async())
        reason = await watch.join()
        waiting = await b.num_nodes_waiting_async()
        again = await join_all(clock, [a, b])
        return reason, waiting, [*again, await late_task.join()]

    reason, waiting, infos = run_in(world, body)
    assert reason == "nodes_waiting" and waiting == 1
    agree(infos, ["a", "b", "late"])
    assert infos[0].round == 1


def test_abandoned_lease_makes_survivors_watch_return_peer_lost_within_ttl(world: str) -> None:
    async def body(clock: Clock) -> tuple[list[str], float, list[RendezvousInfo]]:
        store = MemoryStore(clock)
        hs = make(clock, store, ["a", "b", "c"], 2, 3)
        await join_all(clock, hs)
        watches = [clock.spawn(h.watch_async()) for h in hs[:2]]
        t0 = clock.now()
        lease = hs[2].lease
        assert lease is not None
        lease.abandon()  # node c dies
        reasons = [await w.join() for w in watches]
        took = clock.now() - t0
        return reasons, took, await join_all(clock, hs[:2])

    reasons, took, infos = run_in(world, body)
    assert reasons == ["peer_lost", "peer_lost"]
    assert TTL <= took < TTL + 0.5
    agree(infos, ["a", "b"])


def test_close_ends_the_job_for_members_and_is_a_graceful_exit_for_a_spare(world: str) -> None:
    async def body(clock: Clock) -> tuple[str, BaseException | None, BaseException | None, bool]:
        store = MemoryStore(clock)
        a, b, spare = make(clock, store, ["a", "b", "spare"], 1, 2)
        await join_all(clock, [a, b])
        watch = clock.spawn(b.watch_async())
        spare_task = clock.spawn(spare.next_rendezvous_async())
        await clock.sleep(0.05)
        await a.set_closed_async()
        reason = await watch.join()
        errs: list[BaseException | None] = []
        for coro in (b.next_rendezvous_async(), spare_task.join()):
            try:
                await coro
                errs.append(None)
            except (RendezvousClosedError, RendezvousGracefulExitError) as e:
                errs.append(e)
        return reason, errs[0], errs[1], await spare.is_closed_async()

    reason, member_err, spare_err, closed = run_in(world, body)
    assert reason == "closed" and closed
    assert type(member_err) is RendezvousClosedError
    assert type(spare_err) is RendezvousGracefulExitError


def test_corrupt_state_raises_state_error_naming_the_key(world: str) -> None:
    async def body(clock: Clock) -> str:
        store = MemoryStore(clock)
        await store.set("elastic/rdzv/job/c/state", b"\x80pickle?")
        (h,) = make(clock, store, ["a"], 1, 1)
        with pytest.raises(RendezvousStateError) as e:
            await h.next_rendezvous_async()
        return str(e.value)

    assert "'elastic/rdzv/job/c/state'" in run_in(world, body)


def test_foreign_json_state_is_refused_not_trusted(world: str) -> None:
    async def body(clock: Clock) -> str:
        store = MemoryStore(clock)
        await store.set("elastic/rdzv/job/c/state", b'{"version":1,"round":"0","closed":false}')
        (h,) = make(clock, store, ["a"], 1, 1)
        with pytest.raises(RendezvousStateError) as e:
            await h.next_rendezvous_async()
        return str(e.value)

    assert "field 'round' must be int" in run_in(world, body)


def test_below_min_nodes_times_out_after_join_timeout(world: str) -> None:
    async def body(clock: Clock) -> float:
        store = MemoryStore(clock)
        (h,) = make(clock, store, ["a"], 2, 2, join=0.5)
        t0 = clock.now()
        with pytest.raises(RendezvousTimeoutError, match=r"join_timeout=0\.5s"):
            await h.next_rendezvous_async()
        return clock.now() - t0

    assert 0.5 <= run_in(world, body) < 1.0


def test_nodes_arriving_within_the_last_call_scale_up_in_one_round() -> None:
    async def body(clock: Clock) -> list[RendezvousInfo]:
        store = MemoryStore(clock)
        hs = make(clock, store, ["a", "b", "c", "d"], 2, 8)
        first = clock.spawn(join_all(clock, hs[:2]))
        await clock.sleep(LAST_CALL / 2)
        rest = await join_all(clock, hs[2:])
        return [*(await first.join()), *rest]

    infos = run_in("sim", body)
    agree(infos, ["a", "b", "c", "d"])
    assert infos[0].round == 0


def test_a_spare_takes_the_place_of_a_dead_member_and_members_are_kept() -> None:
    async def body(clock: Clock) -> tuple[list[RendezvousInfo], list[RendezvousInfo]]:
        store = MemoryStore(clock)
        a, b, c, spare = make(clock, store, ["a", "b", "c", "spare"], 2, 3)
        first = await join_all(clock, [a, b, c])
        spare_task = clock.spawn(spare.next_rendezvous_async())
        watches = [clock.spawn(h.watch_async()) for h in (a, b)]
        await clock.sleep(0.01)
        lease = c.lease
        assert lease is not None
        lease.abandon()
        for w in watches:
            assert await w.join() == "peer_lost"
        second = await join_all(clock, [a, b])
        return first, [*second, await spare_task.join()]

    first, second = run_in("sim", body)
    agree(first, ["a", "b", "c"])
    agree(second, ["a", "b", "spare"])
    assert second[0].round == 1


def test_a_running_round_writes_nothing_to_the_store() -> None:
    async def body(clock: Clock) -> tuple[int, int]:
        store = MemoryStore(clock)
        hs = make(clock, store, ["a", "b", "c"], 3, 3)
        await join_all(clock, hs)
        watches = [clock.spawn(h.watch_async()) for h in hs]
        await clock.sleep(0.01)
        before = store.stats.bytes_written, store.revision
        await clock.sleep(3600.0)  # an hour of training: no heartbeat traffic
        for w in watches:
            w.cancel()
        return before[1], store.revision

    before, after = run_in("sim", body)
    assert before == after


def test_same_membership_gives_same_ranks_in_every_round() -> None:
    async def body(clock: Clock) -> list[list[int]]:
        store = MemoryStore(clock)
        hs = make(clock, store, ["z", "m", "a"], 3, 3)
        out = []
        for _ in range(3):
            out.append([i.rank for i in await join_all(clock, hs)])
        return out

    ranks = run_in("sim", body)
    assert ranks == [[2, 1, 0]] * 3


class _Died(Exception):
    """The node's process died (raised where the test kills it)."""


class _DyingStore:
    """A node's store that passes everything through, for a subclass to kill its node
    (abandon its lease) right after a chosen write."""

    def __init__(self, store: MemoryStore, lease_of: DynamicRendezvousHandler) -> None:
        self._store = store
        self._handler = lease_of

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


class _DiesAfterEndingTheRound(_DyingStore):
    """A node's view of the store: it dies right after its write that ends round 0.

    Ending a round is two writes (the state's round, then the round's end marker that
    waiting and redundant nodes wait on, or the closed markers); a node killed between
    them must not strand anyone.
    """

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        out = await self._store.compare_set(key, expected, desired, lease=lease)
        if key.endswith("/c/state") and out == desired and expected is not None:
            lease = self._handler.lease
            assert lease is not None
            lease.abandon()
            raise _Died
        return out


@pytest.mark.parametrize("how", ["advance", "close"])
def test_a_node_dying_between_the_two_writes_that_end_a_round_strands_nobody(
    world: str, how: str
) -> None:
    """The waiting node wakes on the state's change itself, not only on the end marker."""

    async def body(clock: Clock) -> tuple[str, float]:
        store = MemoryStore(clock)
        a, b = make(clock, store, ["a", "b"], 1, 2, join=60.0)
        a._store = _DiesAfterEndingTheRound(store, a)  # type: ignore[assignment]
        await join_all(clock, [a])  # round 0: a alone (min 1), after the last call
        t0 = clock.now()
        late = clock.spawn(b.next_rendezvous_async())
        assert await a.watch_async() == "nodes_waiting"
        try:
            if how == "advance":
                await a.next_rendezvous_async()  # its group restarts: it ends round 0
            else:
                await a.set_closed_async()
        except _Died:
            pass
        try:
            info = await late.join()
            outcome = f"round {info.round}, world {info.world_size}"
        except RendezvousClosedError:
            outcome = "closed"
        return outcome, clock.now() - t0

    outcome, took = run_in(world, body)
    assert outcome == ("round 1, world 1" if how == "advance" else "closed")
    assert took < 5.0  # not the 60 s join timeout


class _DiesRightAfterClaiming(_DyingStore):
    """A node's view of the store: the first node to win a decider claim dies right after.

    The claim and its lease are one operation (``compare_set(lease=)``); were they two
    (claim, then attach the lease), a decider dying between them would leave a claim
    that no lease ends, and the round would wait for its join timeout.
    """

    def __init__(
        self, store: MemoryStore, lease_of: DynamicRendezvousHandler, dead: list[str]
    ) -> None:
        super().__init__(store, lease_of)
        self._dead = dead  # shared: only the first winner dies

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        out = await self._store.compare_set(key, expected, desired, lease=lease)
        if key.endswith("/dec") and out == desired and not self._dead:
            self._dead.append(self._handler.node_id)
            mine = self._handler.lease
            assert mine is not None
            mine.abandon()  # dead: its lease runs out, and every key on it goes
            raise _Died
        return out


def test_a_decider_dying_right_after_its_claim_delays_the_round_by_its_lease_at_most(
    world: str,
) -> None:
    async def body(clock: Clock) -> tuple[list[str], list[RendezvousInfo], float]:
        store = MemoryStore(clock)
        hs = make(clock, store, ["a", "b", "c"], 2, 4, join=600.0)
        dead: list[str] = []
        for h in hs:
            h._store = _DiesRightAfterClaiming(store, h, dead)  # type: ignore[assignment]
        t0 = clock.now()
        tasks = [clock.spawn(h.next_rendezvous_async(), name=h.node_id) for h in hs]
        infos: list[RendezvousInfo] = []
        for t in tasks:
            with contextlib.suppress(_Died):
                infos.append(await t.join())
        return dead, infos, clock.now() - t0

    dead, infos, took = run_in(world, body)
    assert len(dead) == 1
    assert len(infos) == 2 and {i.world_size for i in infos} == {2}
    assert {i.round for i in infos} == {0}
    # the last call, then the dead decider's lease (TTL after its last renewal), then
    # a live joiner's claim and decision -- not the 600 s join timeout
    assert took < LAST_CALL + TTL + 1.0, took


class _SlowJoinWrite(_DyingStore):
    """A node's view of the store whose write of its joiner key (``r<r>/m/<node>``) takes
    ``delay`` seconds: its arrival index is counted, its key is not there yet."""

    def __init__(self, store: MemoryStore, lease_of: DynamicRendezvousHandler, delay: float):
        super().__init__(store, lease_of)
        self._delay = delay

    async def set(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        if key.endswith("/m/" + self._handler.node_id):
            await self._handler._clock.sleep(self._delay)
        await self._store.set(key, value, lease=lease)


def test_the_min_nodes_th_arrival_starts_the_last_call_before_the_others_keys_are_written(
    world: str,
) -> None:
    """A joiner counts itself (``add``) and then writes its key (``set``).  The arrival
    that reaches ``min_nodes`` while an earlier joiner's key is still in flight sees
    fewer than ``min_nodes - 1`` joiners before it; it starts the last call all the same,
    else a round of ``min_nodes`` live joiners below ``max_nodes`` waits for a last call
    nobody started, until its join timeout (seen with two agents re-forming at once)."""

    async def body(clock: Clock) -> tuple[list[RendezvousInfo], float]:
        store = MemoryStore(clock)
        a, b = make(clock, store, ["a", "b"], 2, 3)
        a._store = _SlowJoinWrite(store, a, 0.05)  # type: ignore[assignment]
        a._arrive = b._arrive = None  # the join's steps apart, as on a store without arrive
        t0 = clock.now()
        first = clock.spawn(a.next_rendezvous_async(), name="a")
        await clock.sleep(0.01)  # a has counted itself; its key is not written yet
        second = clock.spawn(b.next_rendezvous_async(), name="b")
        infos = [await first.join(), await second.join()]
        return infos, clock.now() - t0

    infos, took = run_in(world, body)
    agree(infos, ["a", "b"])
    assert infos[0].round == 0
    assert took < LAST_CALL + 1.0, took  # the last call, not the 5 s join timeout


@pytest.mark.parametrize("arrive", [True, False], ids=["arrive", "steps-apart"])
def test_a_last_call_not_written_yet_is_not_taken_as_over(arrive: bool) -> None:
    """Arrivals past min_nodes count the min_nodes live joiners before them while the
    arrival that started the last call is still writing its key (a store with latency,
    everyone joining in the same instant): they wait for it, and the round forms when the
    last call ends with everyone in it, not at once with whoever had arrived."""

    async def body(clock: Clock) -> tuple[list[RendezvousInfo], float]:
        assert isinstance(clock, SimClock)
        host = SimStoreHost(clock, latency=0.01)
        settings = RendezvousSettings("job", 2, 6, RendezvousTimeout(5.0, LAST_CALL, 1.0))
        hs = [
            DynamicRendezvousHandler(
                n, f"host-{n}", settings, "c10d", host.client(n), clock, lease_ttl=TTL
            )
            for n in "abcd"
        ]
        if not arrive:
            for h in hs:
                h._arrive = None
        t0 = clock.now()
        infos = await join_all(clock, hs)
        return infos, clock.now() - t0

    infos, took = run_in("sim", body)
    agree(infos, list("abcd"))
    assert LAST_CALL <= took < LAST_CALL + 0.2, took


class _SlowResult(_DyingStore):
    """A node's view of the store whose write of a round's result takes ``delay`` seconds:
    as its decider, it has read the joiners, and the result is not there yet."""

    def __init__(self, store: MemoryStore, lease_of: DynamicRendezvousHandler, delay: float):
        super().__init__(store, lease_of)
        self._delay = delay

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        if key.endswith("/result") and expected is None:
            await self._handler._clock.sleep(self._delay)
        return await self._store.compare_set(key, expected, desired, lease=lease)


class _SlowCount(_DyingStore):
    """A node's view of the store whose ``add`` takes ``delay`` seconds: with the join's
    steps apart, its key is in the round well before its arrival is counted."""

    def __init__(self, store: MemoryStore, lease_of: DynamicRendezvousHandler, delay: float):
        super().__init__(store, lease_of)
        self._delay = delay

    async def add(self, key: str, amount: int) -> int:
        await self._handler._clock.sleep(self._delay)
        return await self._store.add(key, amount)


@pytest.mark.parametrize("arrive", [True, False], ids=["arrive", "steps-apart"])
def test_a_spare_arriving_while_the_round_is_decided_is_no_member_lost(arrive: bool) -> None:
    """Three members (min = max = 3) and a spare that reads the state while the round is
    still open and joins after the decider read the joiners: the spare parks, nobody
    died, and the members' watch must not end the round.  With the join's steps apart (a
    store without ``arrive``) the spare's key comes before its count: the members' wake
    cannot wait for the counter to tell."""

    async def body(clock: Clock) -> tuple[list[object], str]:
        store = MemoryStore(clock)
        a, b, c, spare = make(clock, store, ["a", "b", "c", "spare"], 3, 3)
        if not arrive:
            for h in (a, b, c, spare):
                h._arrive = None
            spare._store = _SlowCount(store, spare, 0.3)  # type: ignore[assignment]
        for h in (a, b, c):
            h._store = _SlowResult(store, h, 0.1)  # type: ignore[assignment]
        joins = [clock.spawn(h.next_rendezvous_async(), name=h.node_id) for h in (a, b, c)]
        await clock.sleep(0.05)  # the decider has read the joiners; no result yet
        parked = clock.spawn(spare.next_rendezvous_async(), name="spare")
        rounds: list[object] = []
        for t in joins:  # (a member that left round 0 on a "peer_lost" times out in 1)
            try:
                rounds.append((await t.join()).round)
            except RendezvousTimeoutError as e:
                rounds.append(str(e).split(" of the rendezvous")[0])
        try:
            return rounds, await clock.timeout(1.0, a.watch_async())
        except TimeoutError:
            return rounds, "no wake"
        finally:
            parked.cancel()

    assert run_in("sim", body) == ([0, 0, 0], "no wake")


@pytest.mark.parametrize("arrive", [True, False], ids=["arrive", "steps-apart"])
def test_a_member_lost_after_a_late_arrival_is_still_a_member_lost(arrive: bool) -> None:
    """The late arrival moved the round's arrival counter, so the members check their
    keys at every wake from then on: a member that dies afterwards is seen as lost."""

    async def body(clock: Clock) -> tuple[str, float]:
        store = MemoryStore(clock)
        a, b, c, spare = make(clock, store, ["a", "b", "c", "spare"], 3, 3)
        if not arrive:
            for h in (a, b, c, spare):
                h._arrive = None
        for h in (a, b, c):
            h._store = _SlowResult(store, h, 0.1)  # type: ignore[assignment]
        joins = [clock.spawn(h.next_rendezvous_async(), name=h.node_id) for h in (a, b, c)]
        await clock.sleep(0.05)
        parked = clock.spawn(spare.next_rendezvous_async(), name="spare")
        for t in joins:
            await t.join()
        watch = clock.spawn(a.watch_async())
        await clock.sleep(0.5)  # the late key's wake has been checked: nobody lost
        assert not watch.done()
        t0 = clock.now()
        lease = b.lease
        assert lease is not None
        lease.abandon()  # b dies
        try:
            return await watch.join(), clock.now() - t0
        finally:
            parked.cancel()

    reason, took = run_in("sim", body)
    assert reason == "peer_lost" and TTL - 1e-9 <= took < TTL + 0.5, (reason, took)


def test_stop_heartbeats_is_a_lease_no_longer_renewed(world: str) -> None:
    async def body(clock: Clock) -> tuple[str, float]:
        store = MemoryStore(clock)
        hs = make(clock, store, ["a", "b"], 2, 2)
        await join_all(clock, hs)
        watch = clock.spawn(hs[0].watch_async())
        t0 = clock.now()
        hs[1]._stop_heartbeats()
        return await watch.join(), clock.now() - t0

    reason, took = run_in(world, body)
    assert reason == "peer_lost"
    assert TTL <= took < TTL + 0.5
