"""The record bases of elastic._records behave as the dataclasses they replace."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
import pkgutil
import typing
from typing import ClassVar

import pytest

import elastic
from elastic._records import Frozen, Record, set_fields


class Point(Frozen):
    __slots__ = ("x", "y")
    x: int
    y: list[int] | int

    def __init__(self, x: int, y: list[int] | int = 0) -> None:
        set_fields(self, "x", x)
        set_fields(self, "y", y)


@dataclasses.dataclass(frozen=True)
class DPoint:
    x: int
    y: list[int] | int = 0


class Point3(Point):
    __slots__ = ("z",)
    z: int
    LABEL: ClassVar[str] = "p3"
    KIND: typing.ClassVar[str] = "point"

    def __init__(self, x: int, y: int, z: int) -> None:
        super().__init__(x, y)
        set_fields(self, "z", z)


class Box(Record):
    __slots__ = ("items", "name")  # any order: fields follow the annotations
    name: str
    items: list[int]

    def __init__(self, name: str, items: list[int]) -> None:
        self.name = name
        self.items = items


def test_fields_follow_annotations_bases_first_without_classvars() -> None:
    assert Point._fields == ("x", "y")
    assert Point3._fields == ("x", "y", "z")
    assert Box._fields == ("name", "items")
    assert Point3.__match_args__ == ("x", "y", "z")


def test_slots_must_name_exactly_the_fields() -> None:
    with pytest.raises(TypeError, match="Bad: fields"):

        class Bad(Frozen):
            __slots__ = ("a",)
            a: int
            b: int


@pytest.mark.parametrize(
    ("args", "other"),
    [((1, 2), (1, 2)), ((1, 2), (1, 3)), ((1, [2]), (1, [2])), ((0,), (0,))],
)
def test_eq_hash_repr_as_a_frozen_dataclass(
    args: tuple[object, ...], other: tuple[object, ...]
) -> None:
    a, b = Point(*args), Point(*other)
    da, db = DPoint(*args), DPoint(*other)
    assert (a == b) is (da == db)
    assert (a != b) is (da != db)
    assert repr(a) == repr(da).replace("DPoint", "Point")
    if not isinstance(args[-1], list):
        assert hash(a) == hash(da)
    else:
        with pytest.raises(TypeError):
            hash(a)


def test_eq_needs_the_same_class() -> None:
    assert Point(1, 2) != Point3(1, 2, 3)
    assert Point3(1, 2, 3) != Point(1, 2)
    assert Point(1, 2) != (1, 2)
    assert Point(1, 2).__eq__((1, 2)) is NotImplemented


def test_frozen_refuses_assignment_and_deletion() -> None:
    p = Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.x
    with pytest.raises(AttributeError):
        p.w = 1  # type: ignore[attr-defined]
    assert p.x == 1


def test_frozen_copies_and_pickles_through_init() -> None:
    p = Point3(1, 2, 3)
    for q in (copy.copy(p), copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert q == p and q is not p and type(q) is Point3


def test_record_is_mutable_and_unhashable() -> None:
    b = Box("a", [1])
    b.items.append(2)
    b.name = "b"
    assert b == Box("b", [1, 2])
    assert repr(b) == "Box(name='b', items=[1, 2])"
    with pytest.raises(TypeError):
        hash(b)


def _records() -> list[type[Record]]:
    found: dict[str, type[Record]] = {}
    for info in pkgutil.walk_packages(elastic.__path__, "elastic."):
        if info.name.rsplit(".", 1)[-1] in ("_exec_shim", "_fn_runner", "_records"):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Record) and obj.__module__ == info.name:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def test_every_record_in_the_package_takes_its_fields_in_order() -> None:
    """__reduce__ (copy, pickle) and positional construction rely on it."""
    records = _records()
    assert len(records) >= 14, records
    for cls in records:
        params = list(inspect.signature(cls.__init__).parameters)[1:]
        assert params == list(cls._fields), cls


def test_records_repr_like_their_dataclass_past() -> None:
    from elastic.rendezvous._core import Action, ActionKind
    from elastic.workers import WorkerExit

    assert repr(Action(ActionKind.JOINED, "n0", 2)) == (
        "Action(kind=<ActionKind.JOINED: 'joined'>, node='n0', round=2, members=(), at=None)"
    )
    e = WorkerExit(0, 1, 2.5)
    assert e.extra == {} and e.extra is not WorkerExit(0, 1, 2.5).extra
    assert e == WorkerExit(0, 1, 2.5, extra={})
