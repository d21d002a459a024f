"""Ranks from the rendezvous result: the dynamic rendezvous's decider computes every
member's rank block from the roles and local world sizes the joiners published, and the
agent uses it instead of exchanging ranks through the round's store (issue 16, item 1).

Pinned here: the carried assignment is exactly :func:`assign_ranks` over the round's
members in rank order (mixed roles and local world sizes, with and without a last call,
across a restart with changed member info); a round with one joiner that published no
member info carries none (everyone exchanges); a corrupt joiner value or ``ranks``
field raises :class:`RendezvousStateError` naming its key; and a simulated 64-node job
that restarts makes no rank-exchange store operation at all.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.run
from elastic.clock import Clock
from elastic.events import kinds
from elastic.memstore import MemoryStore
from elastic.rendezvous.api import RendezvousHandler, RendezvousInfo, RendezvousStateError
from elastic.rendezvous.assignment import (
    AgentAssignment,
    RoleInfo,
    assign_ranks,
    expand_runs,
    rank_blocks,
    rank_runs,
)
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from sim.clock import SimClock
from sim.run import simulate
from sim.scenario import load_scenario_text
from sim.store import SimStoreHost
from tests.worlds import run_in

ROLES = ("trainer", "ps", "eval")


def _handlers(clock: Clock, store: Any, n: int, lo: int, hi: int) -> list[DynamicRendezvousHandler]:
    """``n`` handlers on ``store`` (a :class:`SimStoreHost`: one client each)."""
    rs = RendezvousSettings("job", lo, hi, RendezvousTimeout(600.0, 30.0, 30.0))
    return [
        DynamicRendezvousHandler(
            f"node{i:02d}",
            f"h{i}",
            rs,
            "c10d",
            store.client(i) if isinstance(store, SimStoreHost) else store,
            clock,
        )
        for i in range(n)
    ]


async def corrupt_join_error(
    clock: Clock, hs: list[DynamicRendezvousHandler], node: int, value: bytes
) -> str:
    """The error a round of the two handlers ``hs`` raises when handler ``node`` joins
    with the ``m/`` value ``value`` (the second arrival decides at once)."""
    hs[node]._joiner_value = lambda n: value  # type: ignore[method-assign]
    first = clock.spawn(hs[0].next_rendezvous_async())
    await clock.sleep(1.0)
    try:
        await hs[1].next_rendezvous_async()
    except RendezvousStateError as e:
        return str(e)
    finally:
        first.cancel()
    raise AssertionError("a corrupt joiner value was accepted")


def _expected(infos: list[RendezvousInfo], member: dict[int, tuple[str, int]]) -> list[Any]:
    """What the store exchange would give each info's agent: assign_ranks over the round's
    members in rank order (``member``: rank -> (role, local world size))."""
    by_rank = assign_ranks([RoleInfo(member[i][0], i, member[i][1]) for i in sorted(member)])
    return [by_rank[info.rank] for info in infos]


agents = st.lists(st.tuples(st.sampled_from(ROLES), st.integers(1, 8)), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    first=agents,
    last_call=st.booleans(),
    starts=st.lists(st.integers(0, 3000), min_size=8, max_size=8),
    change=st.tuples(st.sampled_from(ROLES), st.integers(1, 8)),
)
def test_the_result_carries_exactly_the_ranks_the_exchange_would_assign(
    first: list[tuple[str, int]],
    last_call: bool,
    starts: list[int],
    change: tuple[str, int],
) -> None:
    n = len(first)
    lo = max(1, n - 1) if last_call else n

    async def body(clock: Clock) -> None:
        assert isinstance(clock, SimClock)
        hs = _handlers(clock, SimStoreHost(clock, latency=0.001), n, lo, n)
        info_of = dict(zip(hs, first, strict=True))

        async def join(h: DynamicRendezvousHandler, at: float) -> RendezvousInfo:
            await clock.sleep(at)
            h.set_member_info(*info_of[h])
            return await h.next_rendezvous_async()

        for round_ in (0, 1):
            tasks = [
                clock.spawn(join(h, starts[i] / 1000.0 if round_ == 0 else 0.0))
                for i, h in enumerate(hs)
            ]
            infos = [await t.join() for t in tasks]
            assert {i.round for i in infos} == {round_}
            assert sorted(i.rank for i in infos) == list(range(n))
            member = {i.rank: info_of[h] for h, i in zip(hs, infos, strict=True)}
            got = [i.assignment for i in infos]
            assert all(isinstance(a, AgentAssignment) for a in got), got
            assert got == _expected(infos, member)
            # the next round: one agent's role and local world size change (a new spec)
            info_of[hs[-1]] = change

    run_in("sim", body)


def test_a_round_with_a_joiner_that_published_no_member_info_carries_no_ranks() -> None:
    async def body(clock: Clock) -> list[RendezvousInfo]:
        hs = _handlers(clock, MemoryStore(clock), 3, 3, 3)
        for h in hs[:2]:
            h.set_member_info("trainer", 4)
        tasks = [clock.spawn(h.next_rendezvous_async()) for h in hs]
        return [await t.join() for t in tasks]

    infos = run_in("sim", body)
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    assert all(i.assignment is None for i in infos)  # so every agent exchanges


def test_the_agent_tells_its_handler_its_role_and_local_world_size() -> None:
    """Base handlers (torch's API) accept the call and ignore it."""

    class Quiet(RendezvousHandler):
        def get_backend(self) -> str:
            return "quiet"

        def get_run_id(self) -> str:
            return "run"

    assert Quiet().set_member_info("trainer", 8) is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b'[0,"trainer"]', "expected [arrival index"),
        (b'[0,"trainer",0]', "expected [arrival index"),
        (b'[0,"",8]', "expected [arrival index"),
        (b'[0,"trainer",true]', "expected [arrival index"),
        (b"[0,", "not JSON"),
        (b"x" * 2000, "exceeds"),
    ],
)
def test_a_corrupt_joiner_value_raises_naming_its_key(value: bytes, why: str) -> None:
    async def body(clock: Clock) -> str:
        hs = _handlers(clock, MemoryStore(clock), 2, 2, 2)
        for h in hs:
            h.set_member_info("trainer", 8)
        return await corrupt_join_error(clock, hs, 1, value)

    msg = run_in("sim", body)
    assert "elastic/rdzv/job/c/r0/m/node01" in msg and why in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "ranks",
    [
        [[1, 8, 0, 8, 0, 8]],  # one member of two
        [[3, 8, 0, 24, 0, 24]],  # three members of two
        [[1, 8, 0, 16, 0, 8], [1, 8, 0, 16, 0, 8]],  # global blocks overlap
        [[1, 8, 0, 16, 0, 8], [1, 8, 8, 16, 4, 8]],  # a role block past its role world
        [[1, 8, 0, 16, 0, 32], [1, 8, 8, 16, 8, 32]],  # a role world past the world
        [[1, 8, 0, 16, 0, 16], [1, 8, 8, 24, 8, 16]],  # two world sizes
        [[2, 8, 0, 24, 0, 24]],  # the world is not the sum of the blocks
        [[1, 8, 0, 16, 0, 16], [1, 8, 8, 16, 8, True]],
        [[0, 8, 0, 16, 0, 16], [2, 8, 0, 16, 0, 16]],  # an empty run
        [],
        "[0, 16]",
    ],
)
def test_a_corrupt_ranks_field_raises_naming_the_result_key(ranks: Any) -> None:
    h = _handlers(SimClock(), MemoryStore(SimClock()), 1, 1, 2)[0]
    raw = json.dumps(
        {"version": 1, "round": 3, "members": ["a", "b"], "clean": 1, "ranks": ranks}
    ).encode()
    with pytest.raises(RendezvousStateError, match=r"c/state/r3/result.*'ranks'"):
        h._decode_result(3, raw)


def test_a_valid_ranks_field_gives_each_member_its_block() -> None:
    h = _handlers(SimClock(), MemoryStore(SimClock()), 1, 1, 4)[0]
    agents = [("ps", 2), ("trainer", 8), ("trainer", 8), ("ps", 2)]
    raw = json.dumps(
        {"version": 1, "round": 0, "members": list("abcd"), "ranks": rank_runs(agents)}
    ).encode()
    members = h._decode_result(0, raw)
    assert members is not None
    got = [members.assignment(i) for i in range(4)]
    assert got == assign_ranks([RoleInfo(role, i, n) for i, (role, n) in enumerate(agents)])


@given(agents)
def test_rank_runs_are_the_blocks_run_length_encoded(xs: list[tuple[str, int]]) -> None:
    runs = rank_runs(xs)
    assert expand_runs(runs) == rank_blocks(xs)
    # one run per change of role or local world size
    assert len(runs) == 1 + sum(1 for a, b in itertools.pairwise(xs) if a != b)


def test_a_uniform_rounds_ranks_are_one_run_whatever_its_size() -> None:
    async def body(clock: Clock) -> tuple[int, int]:
        sizes = []
        for n in (8, 256):
            store = MemoryStore(clock)
            hs = _handlers(clock, store, n, n, n)
            for h in hs:
                h.set_member_info("trainer", 8)
            tasks = [clock.spawn(h.next_rendezvous_async()) for h in hs]
            infos = [await t.join() for t in tasks]
            assert all(i.assignment is not None for i in infos)
            raw = await store.get("elastic/rdzv/job/c/state/r0/result")
            sizes.append(len(json.dumps(json.loads(raw)["ranks"])))
        return sizes[0], sizes[1]

    small, large = run_in("sim", body)
    assert small == large - 3 * 2, (small, large)  # only the digits grow (8 -> 256 members)


class _RecordingStore(MemoryStore):
    """The simulated store host's data, recording every key an operation names."""

    def __init__(self, clock: Any) -> None:
        super().__init__(clock)
        self.touched: set[str] = set()

    async def set(self, key: str, value: bytes, *, lease: Any = None) -> None:
        self.touched.add(key)
        await super().set(key, value, lease=lease)

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        self.touched.add(key)
        return await super().get(key, timeout)

    async def multi_get(self, keys: Any, timeout: float | None = None) -> list[bytes]:
        self.touched.update(keys)
        return await super().multi_get(keys, timeout)

    async def multi_set(self, items: Any) -> None:
        self.touched.update(items)
        await super().multi_set(items)


class _Host(SimStoreHost):
    """A store host recording the keys its operations name, in ``touched`` (the one
    thing kept after the run: a host kept alive would keep the run's agents alive, and
    tests/test_sim_memory.py counts them)."""

    touched: ClassVar[set[str]] = set()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        store = self.store = _RecordingStore(self.clock)
        store.touched = _Host.touched


SCENARIO = """name: 64 nodes restart
seed: 7
until: 2h
cluster: {nodes: 64, nproc_per_node: 8}
job: {steps: 1000000, step_time: 2s, startup_time: 20s, checkpoint_every: 100,
      checkpoint_time: 5s}
agent: {max_restarts: 10}
rendezvous: {min_nodes: 64, max_nodes: 64}
faults:
  - {at: 10m, kind: worker_crash, node: 5, local_rank: 3, exit_code: 1}
"""

EXCHANGE = ("torchelastic/role_info/", "torchelastic/assigned_ranks/")


def _run_64(monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], list[Any]]:
    touched = _Host.touched = set()
    monkeypatch.setattr(sim.run, "SimStoreHost", _Host)
    result = simulate(load_scenario_text(SCENARIO, "s.yaml"), keep_events=True)
    assert result.events is not None
    return touched, result.events


@pytest.mark.timeout(120)
def test_a_restarted_64_node_simulated_round_makes_no_rank_exchange_store_operation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    touched, events = _run_64(monkeypatch)
    assert not [k for k in touched if any(p in k for p in EXCHANGE)]
    assigned = [e for e in events if e.kind == kinds.ASSIGN_WORKER_RANKS]
    rounds = {e.fields["round"] for e in events if e.kind == kinds.RENDEZVOUS}
    assert len(rounds) >= 2 and len(assigned) >= 2 * 64  # the first round and a restart
    by_round: dict[int, dict[int, Any]] = {}
    last_round = {}
    for e in events:
        if e.kind == kinds.RENDEZVOUS:
            last_round[e.node] = e.fields["round"]
        elif e.kind == kinds.ASSIGN_WORKER_RANKS:
            by_round.setdefault(last_round[e.node], {})[e.fields["group_rank"]] = e.fields
    for ranks in by_round.values():
        assert sorted(ranks) == list(range(64))
        # what the exchange assigns 64 agents of 8 workers of one role
        for g, f in ranks.items():
            assert (f["base_global_rank"], f["world_size"]) == (8 * g, 512)


@pytest.mark.timeout(120)
def test_without_member_info_the_same_job_exchanges_ranks_through_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control of the test above: its recorder sees the exchange when it runs."""
    monkeypatch.setattr(
        DynamicRendezvousHandler, "set_member_info", RendezvousHandler.set_member_info
    )
    touched, _ = _run_64(monkeypatch)
    assert len([k for k in touched if "torchelastic/role_info/" in k]) >= 2 * 64


def test_member_info_told_again_is_kept_and_a_bad_one_is_still_refused() -> None:
    # the agent tells the handler before every round; the same info is encoded once
    clock = SimClock()
    (h,) = _handlers(clock, MemoryStore(clock), 1, 1, 1)
    h.set_member_info("trainer", 8)
    tail = h._member_tail
    h.set_member_info("trainer", 8)
    assert h._member_tail is tail and h._joiner_value(3) == b'[3,"trainer",8,29500,"h0"]'
    with pytest.raises(ValueError, match="local world size"):
        h.set_member_info("trainer", True)  # equal to 1, but no int
    h.set_member_info("ps", 2)
    assert h._joiner_value(None) == b'[0,"ps",2,29500,"h0"]'
