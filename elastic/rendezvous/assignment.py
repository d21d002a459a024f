"""Rank assignment, as torch ≥ 2.4 does it: plain values and one pure function.

It lives in the rendezvous layer because the dynamic rendezvous computes it: the round's
decider, which reads every joiner once anyway, writes every member's assignment in the
round's result (:mod:`.dynamic_rendezvous`), so the agent needs no exchange of its own.
:mod:`elastic.agent.ranks` re-exports these names and runs torch's store exchange for
handlers that do not carry the assignment.

Rules (pinned by ``tests/test_ranks.py``):

* global ranks are contiguous blocks in group-rank order: agent ``g`` gets
  ``[sum(lws of agents < g), … + lws_g)``;
* role ranks are contiguous blocks, in group-rank order, among agents of the same role;
* world size is the sum of every agent's local world size; a role's world size is the
  sum over the agents of that role;
* within an agent, ranks ascend with the local rank.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from elastic._records import Frozen, set_fields, slot_setters

__all__ = ["AgentAssignment", "RoleInfo", "assign_ranks", "expand_runs", "rank_blocks", "rank_runs"]


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
        _a_base_global_rank(self, base_global_rank)
        _a_world_size(self, world_size)
        _a_base_role_rank(self, base_role_rank)
        _a_role_world_size(self, role_world_size)

    def global_ranks(self, local_world_size: int) -> range:
        return range(self.base_global_rank, self.base_global_rank + local_world_size)

    def role_ranks(self, local_world_size: int) -> range:
        return range(self.base_role_rank, self.base_role_rank + local_world_size)


# one assignment per node per job restart: the slots' setters directly
# (elastic._records.slot_setters)
_a_base_global_rank, _a_world_size, _a_base_role_rank, _a_role_world_size = slot_setters(
    AgentAssignment, "base_global_rank", "world_size", "base_role_rank", "role_world_size"
)


def rank_blocks(agents: Sequence[tuple[str, int]]) -> list[list[int]]:
    """Every agent's ``[base_global, world, base_role, role_world]``, given ``(role,
    local_world_size)`` in group-rank order: the rules above, as the plain lists the
    rendezvous writes (no object per agent: the decider of a 2,048-node round runs this
    at every restart)."""
    role_sizes: dict[str, int] = {}
    for role, lws in agents:
        if lws <= 0:
            raise ValueError(f"local_world_size must be > 0, got {lws} (role {role!r})")
        role_sizes[role] = role_sizes.get(role, 0) + lws
    world = sum(role_sizes.values())
    base_global = 0
    role_base: dict[str, int] = dict.fromkeys(role_sizes, 0)
    out: list[list[int]] = []
    for role, lws in agents:
        out.append([base_global, world, role_base[role], role_sizes[role]])
        base_global += lws
        role_base[role] += lws
    return out


def rank_runs(agents: Sequence[tuple[str, int]]) -> list[list[int]]:
    """:func:`rank_blocks`, run-length encoded: one ``[count, lws, base_global, world,
    base_role, role_world]`` per run of consecutive agents of the same role and local
    world size; the ``k``-th agent of a run (from 0) has ``[base_global + k * lws, world,
    base_role + k * lws, role_world]``.

    What the dynamic rendezvous writes in a round's result, which every member reads:
    one run for the usual job (one role, the same local world size everywhere) instead
    of one block per member (at 2,048 members, 50 KB more per member per round).
    """
    runs: list[list[int]] = []
    last: tuple[str, int] | None = None
    for agent, block in zip(agents, rank_blocks(agents), strict=True):
        if agent == last:
            runs[-1][0] += 1
        else:
            runs.append([1, agent[1], *block])
            last = agent
    return runs


def expand_runs(runs: Sequence[Sequence[int]]) -> list[list[int]]:
    """Every agent's ``[base_global, world, base_role, role_world]`` from
    :func:`rank_runs`' encoding, in group-rank order."""
    return [
        [bg + k * lws, world, br + k * lws, rw]
        for count, lws, bg, world, br, rw in runs
        for k in range(count)
    ]


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
    blocks = rank_blocks([(a.role, a.local_world_size) for a in by_rank])
    return [AgentAssignment(*block) for block in blocks]
