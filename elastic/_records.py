"""Record classes for the agent's start-up path, without the cost of making dataclasses.

``@dataclass`` compiles each class's ``__init__``, ``__repr__`` and ``__eq__`` (and, when
frozen, ``__setattr__``, ``__delattr__`` and ``__hash__``) from generated source while its
module is imported: about 0.45 ms per class on Python 3.11.  ``elastic run`` imports a
dozen internal records before it can start its first worker, and on a launch every
millisecond before the first spawn is a millisecond of the job's wall time.

Here those methods are written once.  A record class annotates its fields (in order,
as for a dataclass), lists the same names in ``__slots__`` and writes its own
``__init__`` (the code a dataclass would generate, so instances are made as fast).
Making such a class costs about what a plain class costs.

The types that are dataclasses in torch (``WorkerSpec``, ``RunResult``,
``LaunchConfig``, ``LogsDest``, ``RendezvousSettings``, ``RendezvousStoreInfo``, the
events) stay dataclasses, with torch's options, so ``dataclasses.fields`` and
``dataclasses.replace`` keep working on them.

Invariants (pinned by ``tests/test_records.py``), the same as a dataclass with ``eq=True``:

* fields are the annotated names of the class and its record bases, bases first, in
  the order written (``ClassVar`` annotations excepted); they must be exactly the
  names in ``__slots__``, or making the class raises ``TypeError``;
* ``a == b`` iff ``b`` is of exactly ``a``'s class and their fields are equal in order;
  against another class ``==`` gives ``NotImplemented`` (so Python falls back to
  identity);
* ``repr`` is ``ClassName(field=value!r, ...)`` with the class's qualified name;
* :class:`Record` instances are mutable and unhashable;
* :class:`Frozen` instances raise :class:`dataclasses.FrozenInstanceError` (an
  ``AttributeError``) on any assignment or deletion, hash as the tuple of their fields,
  and copy, deep-copy and pickle through ``__init__`` with the fields in order (so every
  field must be an ``__init__`` parameter, in field order).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from operator import attrgetter
from typing import Any, ClassVar, NoReturn

__all__ = ["Frozen", "Record", "set_fields", "slot_setters"]

_CLASSVAR = ("ClassVar", "typing.ClassVar")  # how a class variable's annotation starts

set_fields = object.__setattr__
"""What a :class:`Frozen` ``__init__`` assigns its fields with."""


def slot_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The setters of ``cls``'s own slots ``names``, for a hot ``__init__``.

    Performance: calling a slot's member descriptor directly (``setter(self, value)``)
    skips the attribute lookup :data:`set_fields` does on every call: an event of six
    fields is made in about two thirds of the time (the simulator makes ~20 events per
    node per job restart).  Like :data:`set_fields`, it bypasses ``Frozen.__setattr__``.
    """
    return tuple(cls.__dict__[name].__set__ for name in names)


class Record:
    """A mutable record: fields in ``__slots__``, ``__eq__`` and ``__repr__`` on them."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # mutable with eq: unhashable, as a dataclass
    _fields: ClassVar[tuple[str, ...]] = ()

    @staticmethod
    def _values(record: Any) -> tuple[Any, ...]:
        """The fields' values as a tuple (replaced per class by an ``attrgetter``)."""
        return ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: list[str] = []
        slots: set[str] = set()
        for klass in reversed(cls.__mro__):
            slots.update(klass.__dict__.get("__slots__", ()))
            if klass.__module__ == __name__ or not issubclass(klass, Record):
                continue
            for name, kind in inspect.get_annotations(klass).items():
                if name not in fields and not str(kind).startswith(_CLASSVAR):
                    fields.append(name)
        if set(fields) != slots:
            raise TypeError(
                f"{cls.__qualname__}: fields {sorted(fields)} and __slots__ {sorted(slots)} differ"
            )
        cls._fields = tuple(fields)
        setattr(cls, "__match_args__", cls._fields)  # noqa: B010  # mypy: a read-only name
        values: Callable[[Any], tuple[Any, ...]] | None = None
        if len(fields) == 1:
            one = attrgetter(fields[0])
            values = lambda record: (one(record),)  # noqa: E731
        elif fields:
            values = attrgetter(*fields)
        if values is not None:
            cls._values = staticmethod(values)  # type: ignore[method-assign, assignment]

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return bool(self._values(self) == self._values(other))
        return NotImplemented

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__qualname__}({inner})"


class Frozen(Record):
    """An immutable, hashable record (a frozen dataclass)."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._values(self))

    def __reduce__(self) -> tuple[type[Frozen], tuple[Any, ...]]:
        return (type(self), self._values(self))
