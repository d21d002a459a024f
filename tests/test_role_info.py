"""torch's _RoleInstanceInfo (elastic.agent.server.role_info): order, JSON form, boundaries."""

from __future__ import annotations

import functools

import pytest

from elastic.agent.server.role_info import RoleInstanceInfo as R


def test_compare_orders_by_role_then_rank() -> None:
    assert R.compare(R("trainer", 2, 1), R("trainer", 1, 8)) == 1
    assert R.compare(R("trainer", 1, 1), R("trainer", 1, 8)) == 0
    assert R.compare(R("ps", 9, 1), R("trainer", 0, 1)) == -1
    assert R.compare(R("trainer", 0, 1), R("ps", 9, 1)) == 1


def test_sorting_with_compare_groups_roles_and_boundaries_find_them() -> None:
    infos = [R("trainer", 3, 1), R("ps", 4, 1), R("trainer", 1, 2), R("ps", 0, 4)]
    ordered = sorted(infos, key=functools.cmp_to_key(R.compare))
    assert [(i.role, i.rank) for i in ordered] == [
        ("ps", 0),
        ("ps", 4),
        ("trainer", 1),
        ("trainer", 3),
    ]
    assert R.find_role_boundaries(ordered, "trainer") == (2, 3)
    assert R.find_role_boundaries(ordered, "ps") == (0, 1)
    assert R.find_role_boundaries(ordered, "eval") == (-1, -1)


def test_serialize_is_torchs_json_and_round_trips() -> None:
    info = R("trainer", 5, 8)
    assert info.serialize() == b'{"role": "trainer", "rank": 5, "local_world_size": 8}'
    assert R.deserialize(info.serialize()) == info


@pytest.mark.parametrize(
    "data",
    [b"\x80\x04", b"[1]", b'{"role": 1, "rank": 0, "local_world_size": 1}', b"x" * 70000],
)
def test_deserialize_refuses_anything_but_the_json_object(data: bytes) -> None:
    with pytest.raises(ValueError, match="role instance info"):
        R.deserialize(data)
