"""Rank assignment, as torch ≥ 2.4 does it: a pure function and its store exchange.

Rules (pinned by ``tests/test_ranks.py``):

* global ranks are contiguous blocks in group-rank order: agent ``g`` gets
  ``[sum(lws of agents < g), … + lws_g)``;
* role ranks are contiguous blocks, in group-rank order, among agents of the same role;
* world size is the sum of every agent's local world size; a role's world size is the
  sum over the agents of that role;
* within an agent, ranks ascend with the local rank.

The exchange: every agent publishes ``{"role", "rank", "local_world_size"}`` (JSON) at
``torchelastic/role_info/<group_rank>``; group rank 0 reads them all, computes every
assignment with :func:`assign_ranks`, and publishes ``[base_global, world, base_role,
role_world]`` at ``torchelastic/assigned_ranks/<i>`` in one ``multi_set``; each agent
reads its own.  O(1) store operations per agent, O(n) on rank 0.

:func:`exchange_ranks_in_round` is the exchange as the agent runs it: raced against the
rendezvous handler's :meth:`~elastic.rendezvous.api.RendezvousHandler.watch_members_async`,
so a member whose lease expires during the exchange ends the round instead of leaving the
others waiting for its role info or assignment.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from elastic._records import Frozen, set_fields
from elastic.clock import Clock, Task
from elastic.rendezvous.api import RendezvousHandler, RendezvousInfo
from elastic.store import Store

__all__ = [
    "AgentAssignment",
    "RoleInfo",
    "assign_ranks",
    "exchange_ranks",
    "exchange_ranks_in_round",
]

ROLE_INFO_PREFIX = "torchelastic/role_info/"
ASSIGNED_PREFIX = "torchelastic/assigned_ranks/"


class RoleInfo(Frozen):
    """What one agent publishes: its role, group rank and local world size."""

    __slots__ = ("local_world_size", "rank", "role")
    role: str
    rank: int
    local_world_size: int

    def __init__(self, role: str, rank: int, local_world_size: int) -> None:
        set_fields(self, "role", role)
        set_fields(self, "rank", rank)
        set_fields(self, "local_world_size", local_world_size)

    def serialize(self) -> bytes:
        return json.dumps(
            {"role": self.role, "rank": self.rank, "local_world_size": self.local_world_size}
        ).encode()

    @staticmethod
    def deserialize(data: bytes) -> RoleInfo:
        d = json.loads(data)
        return RoleInfo(str(d["role"]), int(d["rank"]), int(d["local_world_size"]))


class AgentAssignment(Frozen):
    """One agent's block: first global rank, world size, first role rank, role world size."""

    __slots__ = ("base_global_rank", "base_role_rank", "role_world_size", "world_size")
    base_global_rank: int
    world_size: int
    base_role_rank: int
    role_world_size: int

    def __init__(
        self, base_global_rank: int, world_size: int, base_role_rank: int, role_world_size: int
    ) -> None:
        set_fields(self, "base_global_rank", base_global_rank)
        set_fields(self, "world_size", world_size)
        set_fields(self, "base_role_rank", base_role_rank)
        set_fields(self, "role_world_size", role_world_size)

    def global_ranks(self, local_world_size: int) -> range:
        return range(self.base_global_rank, self.base_global_rank + local_world_size)

    def role_ranks(self, local_world_size: int) -> range:
        return range(self.base_role_rank, self.base_role_rank + local_world_size)


def assign_ranks(agents: Sequence[RoleInfo]) -> list[AgentAssignment]:
    """Every agent's assignment, indexed by group rank (``agents`` in any order)."""
    by_rank = sorted(agents, key=lambda a: a.rank)
    if [a.rank for a in by_rank] != list(range(len(by_rank))):
        raise ValueError(
            f"group ranks must be exactly 0..{len(by_rank) - 1}, got {[a.rank for a in by_rank]}"
        )
    for a in by_rank:
        if a.local_world_size <= 0:
            raise ValueError(
                f"agent {a.rank}: local_world_size must be > 0, got {a.local_world_size}"
            )
    role_sizes: dict[str, int] = {}
    for a in by_rank:
        role_sizes[a.role] = role_sizes.get(a.role, 0) + a.local_world_size
    world = sum(role_sizes.values())
    base_global = 0
    role_base: dict[str, int] = dict.fromkeys(role_sizes, 0)
    out: list[AgentAssignment] = []
    for a in by_rank:
        out.append(AgentAssignment(base_global, world, role_base[a.role], role_sizes[a.role]))
        base_global += a.local_world_size
        role_base[a.role] += a.local_world_size
    return out


async def exchange_ranks(
    store: Store,
    group_rank: int,
    group_world_size: int,
    role: str,
    local_world_size: int,
    timeout: float | None = None,
) -> AgentAssignment:
    """Run the exchange from one agent's side; return that agent's assignment."""
    me = RoleInfo(role, group_rank, local_world_size)
    await store.set(f"{ROLE_INFO_PREFIX}{group_rank}", me.serialize())
    if group_rank == 0:
        keys = [f"{ROLE_INFO_PREFIX}{i}" for i in range(group_world_size)]
        infos = [RoleInfo.deserialize(b) for b in await store.multi_get(keys, timeout)]
        assignments = assign_ranks(infos)
        await store.multi_set(
            {
                f"{ASSIGNED_PREFIX}{i}": json.dumps(
                    [a.base_global_rank, a.world_size, a.base_role_rank, a.role_world_size]
                ).encode()
                for i, a in enumerate(assignments)
            }
        )
    raw = json.loads(await store.get(f"{ASSIGNED_PREFIX}{group_rank}", timeout))
    return AgentAssignment(int(raw[0]), int(raw[1]), int(raw[2]), int(raw[3]))


async def exchange_ranks_in_round(
    clock: Clock,
    handler: RendezvousHandler,
    info: RendezvousInfo,
    role: str,
    local_world_size: int,
    timeout: float | None = None,
    *,
    watch: Task[str] | None = None,
) -> AgentAssignment | str:
    """Exchange ranks in the round ``info`` while its members live.

    Returns this agent's assignment, or why the round ended first (``"peer_lost"``,
    ``"restarted"``, ``"closed"``: the caller asks for the next round).  Raises
    :class:`TimeoutError` if the exchange itself timed out.

    ``watch``: the caller's running ``handler.watch_async()`` task for this round, reused
    (not cancelled) so that guarding the exchange costs no task of its own; a late arrival
    it reports (``"nodes_waiting"``) does not end the exchange: the round runs first.
    """
    exchange = clock.spawn(
        exchange_ranks(info.store, info.rank, info.world_size, role, local_world_size, timeout),
        name="rank-exchange",
    )
    lost: Task[str] | None = None
    try:
        if watch is not None:
            idx, value = await clock.first(exchange, watch)
            if idx == 0 or value != "nodes_waiting":
                return _exchanged(idx, value)
        lost = clock.spawn(handler.watch_members_async(), name="member-watch")
        idx, value = await clock.first(exchange, lost)
        return _exchanged(idx, value)
    finally:
        exchange.cancel()
        if lost is not None:
            lost.cancel()


def _exchanged(idx: int, value: object) -> AgentAssignment | str:
    if idx == 1:
        return str(value)
    assert isinstance(value, AgentAssignment)
    return value
