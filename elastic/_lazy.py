"""Submodules a package hands out as attributes, loaded on first use.

torch's packages import some of their submodules in ``__init__``, so programs write
``pkg.sub.Name`` after ``import pkg`` alone; importing them eagerly here would make every
import of the package heavier (``elastic run``'s start-up is a benchmark).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from types import ModuleType


def submodules(package: str, names: Iterable[str]) -> Callable[[str], ModuleType]:
    """A module ``__getattr__`` for ``package`` that imports ``package.<name>`` for each
    of ``names`` when it is first asked for, and raises ``AttributeError`` otherwise."""
    known = frozenset(names)

    def __getattr__(name: str) -> ModuleType:
        if name in known:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
