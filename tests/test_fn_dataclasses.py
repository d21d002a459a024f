"""A worker function's dataclass return value (torch's tests return one) comes back as
an instance of its class, made as pickle makes it, when the agent has its module
loaded -- and as a ``SimpleNamespace`` otherwise; nothing is imported or run to read it
(``elastic/real/_fn_runner.py``)."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest

from elastic.multiprocessing import DefaultLogsSpecs, start_processes
from elastic.real._fn_runner import decode, to_data

inits: list[str] = []


@dataclasses.dataclass(frozen=True)
class RankInfo:
    rank: int
    role: str
    extra: tuple[int, bytes] = (0, b"")

    def __post_init__(self) -> None:
        inits.append(self.role)  # must not run when the value is read back


@dataclasses.dataclass
class Outer:
    info: RankInfo
    scores: dict[int, float]


def returns_rank_info() -> Outer:
    return Outer(RankInfo(3, "trainer", (7, b"\x01")), {0: 1.5})


def roundtrip(value: Any) -> Any:
    return json.loads(json.dumps({"v": to_data(value)}), object_hook=decode)["v"]


def test_a_nested_frozen_dataclass_comes_back_as_its_class_without_its_init() -> None:
    value = returns_rank_info()
    inits.clear()
    back = roundtrip(value)
    assert back == value and type(back) is Outer and type(back.info) is RankInfo
    assert back.info.extra == (7, b"\x01") and back.scores == {0: 1.5}
    assert inits == []  # made as pickle makes it: no __init__, no __post_init__
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.info.rank = 4  # type: ignore[misc]


def test_a_class_whose_module_is_not_loaded_is_a_namespace_of_its_fields() -> None:
    data = {"__elastic_dataclass__": {"type": "no_such_module_xyz:Thing", "fields": {"a": 1}}}
    back = json.loads(json.dumps(data), object_hook=decode)
    assert back == types.SimpleNamespace(a=1)
    not_a_dataclass = {"__elastic_dataclass__": {"type": "json:JSONDecoder", "fields": {}}}
    assert json.loads(json.dumps(not_a_dataclass), object_hook=decode) == types.SimpleNamespace()


@pytest.mark.parametrize(
    "body",
    [
        {"type": f"{__name__}:RankInfo", "fields": {"rank": 1}},  # fields missing
        {"type": f"{__name__}:RankInfo", "fields": {"rank": 1, "role": "r", "extra": 0, "x": 2}},
        {"fields": {}},
        {"type": 3, "fields": {}},
        {"type": "m:C", "fields": []},
    ],
)
def test_a_malformed_dataclass_is_a_value_error(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="malformed __elastic_dataclass__"):
        json.loads(json.dumps({"__elastic_dataclass__": body}), object_hook=decode)


def test_a_users_dict_shaped_like_the_tag_stays_a_dict() -> None:
    value = {"__elastic_dataclass__": {"type": "x:Y", "fields": {}}}
    assert roundtrip(value) == value


@pytest.mark.timeout(60)
def test_a_worker_returns_a_dataclass_through_start_processes(tmp_path: Path) -> None:
    pc = start_processes(
        "dc", returns_rank_info, {0: (), 1: ()}, {0: {}, 1: {}}, DefaultLogsSpecs(str(tmp_path))
    )
    result = pc.wait()
    assert result is not None and not result.is_failed(), result
    assert result.return_values == {0: returns_rank_info(), 1: returns_rank_info()}
    assert type(result.return_values[0].info) is RankInfo
