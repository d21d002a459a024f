"""torch's ``_RoleInstanceInfo``: one agent's (role, rank, local world size), as data.

torch's agents exchange these through the store to compute role ranks (each agent
publishes its own, reads all, sorts them by role then rank).  ``elastic`` carries ranks
in the rendezvous round's result instead (:mod:`elastic.rendezvous.assignment`), so the
agent does not use this class; it is kept, with torch's semantics, for code and tests
written against torch.  The wire form is JSON (torch's too), never a pickle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["RoleInstanceInfo"]

#: Longest serialized form accepted by :meth:`RoleInstanceInfo.deserialize`.
MAX_SERIALIZED_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class RoleInstanceInfo:
    """An agent's role, its rank among all agents, and how many workers it runs."""

    role: str
    rank: int
    local_world_size: int

    def serialize(self) -> bytes:
        """UTF-8 JSON ``{"role", "rank", "local_world_size"}`` (torch's form)."""
        return json.dumps(
            {"role": self.role, "rank": self.rank, "local_world_size": self.local_world_size}
        ).encode("UTF-8")

    @staticmethod
    def deserialize(data: bytes) -> RoleInstanceInfo:
        """The info :meth:`serialize` wrote; ``ValueError`` naming the problem otherwise."""
        if len(data) > MAX_SERIALIZED_BYTES:
            raise ValueError(
                f"role instance info: {len(data)} bytes; expected at most {MAX_SERIALIZED_BYTES}"
            )
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"role instance info: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ValueError("role instance info: expected a JSON object")
        role, rank, lws = obj.get("role"), obj.get("rank"), obj.get("local_world_size")
        if not isinstance(role, str) or type(rank) is not int or type(lws) is not int:
            raise ValueError(
                "role instance info: expected role (string), rank and local_world_size "
                f"(integers); got {sorted(obj)[:10]}"
            )
        return RoleInstanceInfo(role, rank, lws)

    @staticmethod
    def compare(obj1: RoleInstanceInfo, obj2: RoleInstanceInfo) -> int:
        """-1, 0 or 1: by role (alphabetical), then by rank within a role."""
        if obj1.role == obj2.role:
            return (obj1.rank > obj2.rank) - (obj1.rank < obj2.rank)
        return 1 if obj1.role > obj2.role else -1

    @staticmethod
    def find_role_boundaries(roles_infos: list[RoleInstanceInfo], role: str) -> tuple[int, int]:
        """Indices of the first and last entry of ``role`` in ``roles_infos`` ((-1, -1)
        if absent); the list is expected sorted with :meth:`compare`."""
        start_idx, end_idx = -1, -1
        for idx, info in enumerate(roles_infos):
            if info.role == role:
                if start_idx == -1:
                    start_idx = idx
                end_idx = idx
        return start_idx, end_idx
