"""Rank assignment: torch's store exchange, for handlers whose round carries no ranks.

The pure rules and values (:class:`RoleInfo`, :class:`AgentAssignment`,
:func:`assign_ranks`) live in :mod:`elastic.rendezvous.assignment` (the dynamic
rendezvous computes them in its round's result, see below) and are re-exported here.

A handler whose :class:`~elastic.rendezvous.api.RendezvousInfo` carries the member's
``assignment`` (the dynamic rendezvous, told the agent's role and local world size by
:meth:`~elastic.rendezvous.api.RendezvousHandler.set_member_info` before it joins) needs
no exchange: its decider, which reads every joiner once anyway, wrote every member's
block in the round's result.  Any other handler (torch's own, the static one, a user's)
gets the exchange below, as torch runs it.

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

from elastic.clock import Clock, Task
from elastic.rendezvous.api import RendezvousHandler, RendezvousInfo
from elastic.rendezvous.assignment import AgentAssignment, RoleInfo, assign_ranks
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
