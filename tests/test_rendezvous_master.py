"""Rank 0's address in the rendezvous result: each joiner publishes its address and the
master port it would use as rank 0 in its ``m/`` value, the decider puts rank 0's in the
result (``"master": [addr, port]``), and the members start without exchanging it through
the round's store (issue 16, item 1).

Pinned here, in both worlds: the result carries rank 0's address and port and every
member's info has them; no member touches the round's store then (store operations
counted); a round whose result lacks them (a joiner without member info, or one of
another version whose value has no address) still exchanges; a corrupt ``master`` field
or joiner address raises :class:`RendezvousStateError` naming the key, in one line; and
the port rules (``--master-port`` given, the port chooser, the default) are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from elastic.clock import Clock
from elastic.memstore import MemoryStore
from elastic.rendezvous.api import RendezvousInfo, RendezvousStateError
from elastic.rendezvous.dynamic_rendezvous import (
    DEFAULT_MASTER_PORT,
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from sim.clock import SimClock
from tests.test_rendezvous_ranks import corrupt_join_error
from tests.worlds import run_in

WORLDS = ["sim", "real"]
RESULT = "elastic/rdzv/job/c/state/r0/result"
ROUND_STORE = "elastic/rdzv/job/s/0/"


class _Recording(MemoryStore):
    """A MemoryStore that records the keys of every get/set of a round's store."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.round_ops: list[tuple[str, str]] = []

    def _note(self, op: str, keys: Sequence[str]) -> None:
        self.round_ops.extend((op, k) for k in keys if "/s/" in k)

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        self._note("multi_get", keys)
        return await super().multi_get(keys, timeout)

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        self._note("multi_set", list(items))
        await super().multi_set(items)

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        self._note("get", [key])
        return await super().get(key, timeout)

    async def set(self, key: str, value: bytes, *, lease: Any = None) -> None:
        self._note("set", [key])
        await super().set(key, value, lease=lease)


def _handlers(
    clock: Clock, store: MemoryStore, n: int, **kwargs: Any
) -> list[DynamicRendezvousHandler]:
    rs = RendezvousSettings("job", n, n, RendezvousTimeout(600.0, 30.0, 30.0))
    return [
        DynamicRendezvousHandler(f"node{i}", f"host-{i}", rs, "c10d", store, clock, **kwargs)
        for i in range(n)
    ]


def _round(
    world: str,
    n: int,
    *,
    info: Callable[[int], bool] = lambda i: True,
    patch: Callable[[list[DynamicRendezvousHandler]], None] = lambda hs: None,
    **kwargs: Any,
) -> tuple[list[RendezvousInfo], _Recording]:
    """One round of ``n`` handlers on one store; ``info(i)``: handler ``i`` tells its
    member info."""

    async def body(clock: Clock) -> tuple[list[RendezvousInfo], _Recording]:
        store = _Recording(clock)
        hs = _handlers(clock, store, n, **kwargs)
        for i, h in enumerate(hs):
            if info(i):
                h.set_member_info("trainer", 4)
        patch(hs)
        tasks = [clock.spawn(h.next_rendezvous_async()) for h in hs]
        infos = [await t.join() for t in tasks]
        for h in hs:
            await h.shutdown_async()
        return infos, store

    return run_in(world, body)


def _master(infos: list[RendezvousInfo]) -> set[tuple[str, int]]:
    return {(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in infos}


def _rank0_addr(infos: list[RendezvousInfo]) -> str:
    # ranks follow the members' order: node<i> has address host-<i>
    return "host-" + str(next(k for k, i in enumerate(infos) if i.rank == 0))


@pytest.mark.parametrize("world", WORLDS)
def test_the_result_carries_rank_0s_address_and_no_member_touches_the_round_store(
    world: str,
) -> None:
    infos, store = _round(world, 3)
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    addr = _rank0_addr(infos)
    assert _master(infos) == {(addr, DEFAULT_MASTER_PORT)}
    assert all(i.assignment is not None for i in infos)
    result = json.loads(store.try_get_nowait(RESULT) or b"{}")
    assert result["master"] == [addr, DEFAULT_MASTER_PORT]
    # no publish, no read back: the members start without the exchange
    assert store.round_ops == []
    stored = store.keys()  # (a MemoryStore's keys: no mapping)
    assert not [k for k in stored if k.startswith(ROUND_STORE)]


@pytest.mark.parametrize("world", WORLDS)
def test_a_round_with_a_joiner_without_member_info_still_exchanges(world: str) -> None:
    infos, store = _round(world, 3, info=lambda i: i != 1)
    addr = _rank0_addr(infos)
    assert _master(infos) == {(addr, DEFAULT_MASTER_PORT)}
    assert "master" not in json.loads(store.try_get_nowait(RESULT) or b"{}")
    # rank 0 publishes, every member reads back
    assert [op for op, _ in store.round_ops].count("multi_set") == 2  # one op, two keys
    assert [op for op, _ in store.round_ops].count("multi_get") >= 2 * 3  # each reads
    assert store.try_get_nowait(ROUND_STORE + "MASTER_ADDR") == addr.encode()


@pytest.mark.parametrize("world", WORLDS)
def test_a_joiner_of_another_version_without_an_address_makes_its_round_exchange(
    world: str,
) -> None:
    """Values ``[n,role,lws]`` (no address): the round carries ranks, not rank 0's address."""

    def old(hs: list[DynamicRendezvousHandler]) -> None:
        for h in hs:
            h._joiner_value = lambda n: b'[0,"trainer",4]'  # type: ignore[method-assign]

    infos, store = _round(world, 3, patch=old)
    result = json.loads(store.try_get_nowait(RESULT) or b"{}")
    assert "ranks" in result and "master" not in result
    assert all(i.assignment is not None for i in infos)
    assert _master(infos) == {(_rank0_addr(infos), DEFAULT_MASTER_PORT)}
    assert [op for op, _ in store.round_ops].count("multi_get") >= 2 * 3  # each reads


@pytest.mark.parametrize(
    "master",
    [
        ["h", 70000],
        ["h", -1],
        ["", 29500],
        [1, 29500],
        ["h", "29500"],
        ["h", True],
        ["h"],
        "h:29500",
    ],
)
def test_a_corrupt_master_field_raises_naming_the_result_key(master: Any) -> None:
    clock = SimClock()
    (h,) = _handlers(clock, MemoryStore(clock), 1)
    raw = json.dumps(
        {
            "version": 1,
            "round": 3,
            "members": ["a"],
            "ranks": [[1, 4, 0, 4, 0, 4]],
            "master": master,
        }
    ).encode()
    with pytest.raises(RendezvousStateError, match=r"c/state/r3/result.*'master'") as e:
        h._decode_result(3, raw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("node", "value"),
    [
        (1, b'[0,"trainer",4,70000,"h"]'),
        (1, b'[0,"trainer",4,1,""]'),
        (1, b'[0,"trainer",4,"h"]'),
        (0, b'[0,"trainer",4,1,"\\q"]'),  # rank 0's address is decoded: not JSON
        (0, b'[0,"trainer",4,1,7]'),
    ],
)
def test_a_corrupt_joiner_port_or_address_raises_naming_its_key(node: int, value: bytes) -> None:
    async def body(clock: Clock) -> str:
        hs = _handlers(clock, MemoryStore(clock), 2)
        for h in hs:
            h.set_member_info("trainer", 4)
        return await corrupt_join_error(clock, hs, node, value)

    msg = run_in("sim", body)
    assert f"elastic/rdzv/job/c/r0/m/node{node}" in msg, msg
    assert "address" in msg and "\n" not in msg, msg


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("member_info", [True, False])
@pytest.mark.parametrize(
    ("kwargs", "port"),
    [
        ({"master_port": 31000, "port_chooser": lambda: 42000}, 31000),  # --master-port wins
        ({"port_chooser": lambda: 42000}, 42000),  # the chooser (real mode: a free port)
        ({}, DEFAULT_MASTER_PORT),
    ],
)
def test_the_port_rules_are_unchanged(
    world: str, member_info: bool, kwargs: dict[str, Any], port: int
) -> None:
    infos, store = _round(world, 2, info=lambda i: member_info, **kwargs)
    assert _master(infos) == {(_rank0_addr(infos), port)}
    carried = "master" in json.loads(store.try_get_nowait(RESULT) or b"{}")
    assert carried is member_info and (store.round_ops == []) is member_info


def test_with_member_info_the_port_is_chosen_at_each_join() -> None:
    """The chooser runs when a joiner writes its value (every joiner, every round): the
    port a member would use as rank 0 is in its value before anyone is rank 0."""
    calls: list[int] = []

    def chooser() -> int:
        calls.append(1)
        return 40000 + len(calls)

    infos, _ = _round("sim", 3, port_chooser=chooser)
    assert len(calls) == 3
    (master,) = _master(infos)
    assert master[1] in {40001, 40002, 40003}
