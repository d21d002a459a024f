"""The schema walker: typed readers over PyYAML's node tree, with one-line errors.

Theory of operation.  Text is parsed with PyYAML's composer (``yaml.compose`` with
``SafeLoader``, libyaml's when available, after :func:`check_depth` has counted the values
and measured the nesting), which yields a tree of nodes that still carry their line numbers,
and never with a constructor that could build arbitrary objects.  A :class:`Map` reads one
mapping node: it refuses unknown and duplicate keys first, then hands each value to a
:class:`Reader` that knows what it expects (:class:`Int`, :class:`Duration`,
:class:`Choice`…).  The first problem found raises :class:`elastic.errors.ConfigError` whose
``where`` is ``"<file>:<line>"`` and whose message names the dotted key (``faults[1].kind``),
the value seen and what was expected, e.g.::

    scenarios/x.yaml:14: faults[1].kind: got 'worker_crsh'; expected one of worker_crash, ...

The scenario reader (:mod:`sim.scenario.reader`) and the failure generators' reader
(:mod:`sim.failures`) are built from these; :mod:`sim.schema` turns the same readers into a
JSON Schema, so the file format and its schema cannot drift apart.
"""

from __future__ import annotations

import difflib
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import yaml

from elastic.errors import ConfigError
from sim.durations import DURATION_EXPECTED, format_duration, parse_duration
from sim.scenario.limits import (
    MAX_DEPTH,
    MAX_EXIT,
    MAX_FAULTS,
    MAX_INT,
    MAX_NODES,
    MAX_SECONDS,
    MAX_YAML_NODES,
)

__all__ = [
    "LOADER",
    "TAG",
    "AnyInt",
    "Choice",
    "Ctx",
    "Duration",
    "Int",
    "Map",
    "NodeList",
    "Reader",
    "Real",
    "Text",
    "check_depth",
    "describe_node",
    "show",
]

# libyaml's parser (when PyYAML was built with it) is about 7x faster than the pure-Python
# one.  Its composer recurses in C with no depth limit and crashes the process on ~100k
# nested brackets, so check_depth walks the parser's events (produced iteratively) first.
LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_depth(text: str, name: str) -> None:
    """Refuse YAML nested deeper than :data:`MAX_DEPTH` before any recursive composing."""
    depth = 0
    count = 0
    for event in yaml.parse(text, Loader=LOADER):
        if isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent | yaml.AliasEvent):
            count += 1
            if count > MAX_YAML_NODES:
                line = event.start_mark.line + 1 if event.start_mark is not None else 1
                raise ConfigError(
                    f"{name}:{line}",
                    f"the YAML holds more than {MAX_YAML_NODES} values; expected a scenario "
                    f"(at most {MAX_FAULTS} faults and {MAX_NODES} nodes)",
                )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark is not None else 1
                raise ConfigError(
                    f"{name}:{line}",
                    f"the YAML nests more than {MAX_DEPTH} levels deep; expected a scenario "
                    "mapping a few levels deep",
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {TAG + t for t in ("null", "bool", "int", "float", "str")}


class Ctx:
    """Where we are reading from, and the scalar constructor (safe tags only)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._constructor = yaml.SafeLoader("")

    def where(self, node: yaml.Node) -> str:
        return f"{self.source}:{node.start_mark.line + 1}"

    def error(self, node: yaml.Node, path: str, message: str) -> ConfigError:
        return ConfigError(self.where(node), f"{path}: {message}")

    def scalar(self, node: yaml.Node, path: str, expected: str) -> object:
        """The Python value of a scalar node: None, bool, int, float or str; else an error."""
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, path, f"got {describe_node(node)}; expected {expected}")
        if node.tag not in _PLAIN_TAGS:
            shown = node.tag.removeprefix(TAG)
            raise self.error(
                node, path, f"got a {shown} value {show(node.value)}; expected {expected}"
            )
        try:
            value = self._constructor.construct_object(node, deep=True)
        except (ValueError, TypeError, ArithmeticError, yaml.YAMLError):
            # an explicit tag on a value it cannot convert, e.g. `!!int abc`
            raise self.error(
                node, path, f"got {show(node.value)} tagged {node.tag}; expected {expected}"
            ) from None
        if isinstance(value, int | float) and ":" in node.value:
            # YAML 1.1 reads 1:30 as the base-60 number 90, which nobody means in a scenario
            raise self.error(
                node,
                path,
                f"got {node.value}, which YAML reads as the base-60 number {value}; "
                f"expected {expected}",
            )
        return value


def describe_node(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return show(node.value)


def show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Reader(Protocol[T_co]):
    @property
    def expected(self) -> str: ...

    def read(self, ctx: Ctx, node: yaml.Node, path: str) -> T_co: ...


@dataclass(frozen=True, slots=True)
class Int:
    lo: int = 0
    hi: int | None = MAX_INT

    @property
    def expected(self) -> str:
        big = {MAX_INT: "10**12", 2**64: "2**64"}.get(self.hi or 0)
        if big is not None:
            return f"an integer ≥ {self.lo} (at most {big})"
        if self.hi is not None:
            return f"an integer from {self.lo} to {self.hi}"
        return f"an integer ≥ {self.lo}"

    def read(self, ctx: Ctx, node: yaml.Node, path: str) -> int:
        value = _read_int(ctx, node, path, self.expected)
        if value < self.lo or (self.hi is not None and value > self.hi):
            raise ctx.error(node, path, f"got {show(value)}; expected {self.expected}")
        return value


@dataclass(frozen=True, slots=True)
class AnyInt:
    @property
    def expected(self) -> str:
        return "an integer"

    def read(self, ctx: Ctx, node: yaml.Node, path: str) -> int:
        value = _read_int(ctx, node, path, self.expected)
        if not -MAX_EXIT <= value < MAX_EXIT:
            raise ctx.error(node, path, f"got {show(value)}; expected an integer within ±2**31")
        return value


def _read_int(ctx: Ctx, node: yaml.Node, path: str, expected: str) -> int:
    value = ctx.scalar(node, path, expected)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ctx.error(node, path, f"got {show(value)}; expected {expected}")
    return value


@dataclass(frozen=True, slots=True)
class Real:
    """A finite number in [lo, hi], or (lo, hi] when ``lo_open``."""

    lo: float = 0.0
    hi: float | None = None
    lo_open: bool = False

    @property
    def expected(self) -> str:
        low = f"> {self.lo:g}" if self.lo_open else f"≥ {self.lo:g}"
        if self.hi is not None:
            return f"a number {low} and ≤ {self.hi:g}"
        return f"a number {low}"

    def read(self, ctx: Ctx, node: yaml.Node, path: str) -> float:
        value = ctx.scalar(node, path, self.expected)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ctx.error(node, path, f"got {show(value)}; expected {self.expected}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        too_low = number <= self.lo if self.lo_open else number < self.lo
        if not math.isfinite(number) or too_low or (self.hi is not None and number > self.hi):
            raise ctx.error(node, path, f"got {show(value)}; expected {self.expected}")
        return number


@dataclass(frozen=True, slots=True)
class Duration:
    positive: bool = False
    least: float = 0.0  # seconds; > 0 for the rendezvous timeouts (whole seconds in torch)

    @property
    def expected(self) -> str:
        if self.least:
            low = f", at least {format_duration(self.least)}"
        else:
            low = ", greater than 0" if self.positive else ""
        return f"{DURATION_EXPECTED}{low}, at most 100 years"

    def read(self, ctx: Ctx, node: yaml.Node, path: str) -> float:
        value = ctx.scalar(node, path, self.expected)
        try:
            seconds = parse_duration(value)
        except ValueError as error:
            raise ctx.error(node, path, f"got {show(value)}; {error}") from None
        if (self.positive and seconds == 0) or seconds < self.least or seconds > MAX_SECONDS:
            raise ctx.error(node, path, f"got {show(value)}; expected {self.expected}")
        return seconds


@dataclass(frozen=True, slots=True)
class Text:
    @property
    def expected(self) -> str:
        return "a string"

    def read(self, ctx: Ctx, node: yaml.Node, path: str) -> str:
        value = ctx.scalar(node, path, self.expected)
        if not isinstance(value, str):
            raise ctx.error(node, path, f"got {show(value)}; expected {self.expected}")
        return value


E = TypeVar("E", bound=enum.StrEnum)


@dataclass(frozen=True, slots=True)
class Choice(Generic[E]):
    choices: type[E]

    @property
    def expected(self) -> str:
        return "one of " + ", ".join(c.value for c in self.choices)

    def read(self, ctx: Ctx, node: yaml.Node, path: str) -> E:
        value = ctx.scalar(node, path, self.expected)
        for choice in self.choices:
            if value == choice.value:
                return choice
        raise ctx.error(node, path, f"got {show(value)}; expected {self.expected}")


class Map:
    """A mapping node being read: keys indexed once, unknown and duplicate keys refused."""

    def __init__(self, ctx: Ctx, node: yaml.Node, path: str, expected: str) -> None:
        self.ctx = ctx
        self.node = node
        self.path = path
        if not isinstance(node, yaml.MappingNode):
            label = path or "top level"
            raise ctx.error(node, label, f"got {describe_node(node)}; expected {expected}")
        self.entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key_node.tag != TAG + "str" or not isinstance(key, str):
                shown = describe_node(key_node) if key is None else show(key)
                raise ctx.error(
                    key_node, path or "top level", f"got key {shown}; expected {expected}"
                )
            if key in self.entries:
                first = self.entries[key][0].start_mark.line + 1
                raise ctx.error(
                    key_node, self.sub(key), f"duplicate key (first given on line {first})"
                )
            self.entries[key] = (key_node, value_node)

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def check_keys(self, allowed: Sequence[str], what: str, elsewhere: dict[str, str]) -> None:
        """Refuse the first key not in ``allowed``, suggesting the closest one or its home."""
        for key, (key_node, _) in self.entries.items():
            if key in allowed:
                continue
            parts = [f"unknown key {show(key)}"]
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            if key in elsewhere:
                parts.append(f"it belongs {elsewhere[key]}")
            elif close:
                parts.append(f"did you mean {close[0]!r}?")
            parts.append(f"expected {what}: {', '.join(allowed)}")
            raise self.ctx.error(key_node, self.sub(key), "; ".join(parts))

    def value_node(self, key: str) -> yaml.Node | None:
        """The value's node, or None if the key is absent or null (null means "use the default")."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        value = entry[1]
        if isinstance(value, yaml.ScalarNode) and value.tag == TAG + "null":
            return None
        return value

    def req(self, key: str, reader: Reader[T]) -> T:
        node = self.value_node(key)
        if node is None:
            raise self.ctx.error(self.node, self.sub(key), f"missing; expected {reader.expected}")
        return reader.read(self.ctx, node, self.sub(key))

    def opt(self, key: str, reader: Reader[T]) -> T | None:
        node = self.value_node(key)
        return None if node is None else reader.read(self.ctx, node, self.sub(key))

    def get(self, key: str, reader: Reader[T], default: T) -> T:
        value = self.opt(key, reader)
        return default if value is None else value

    def section(self, key: str, expected: str) -> Map | None:
        node = self.value_node(key)
        return None if node is None else Map(self.ctx, node, self.sub(key), expected)

    def line_of(self, key: str) -> yaml.Node:
        """The node to blame for ``key``: its value if given, else the whole mapping."""
        return self.value_node(key) or self.node


@dataclass(frozen=True, slots=True)
class NodeList:
    @property
    def expected(self) -> str:
        return "a non-empty list of distinct node indices, like [0, 1]"

    def read(self, ctx: Ctx, node: yaml.Node, path: str) -> tuple[int, ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise ctx.error(node, path, f"got {describe_node(node)}; expected {self.expected}")
        if len(node.value) > MAX_NODES:
            raise ctx.error(
                node, path, f"got {len(node.value)} nodes; expected at most {MAX_NODES}"
            )
        numbers: list[int] = []
        seen: set[int] = set()  # a set: a list's `in` made a long list quadratic
        reader = Int(0, MAX_NODES)
        for position, item in enumerate(node.value):
            number = reader.read(ctx, item, f"{path}[{position}]")
            if number in seen:
                raise ctx.error(
                    item, f"{path}[{position}]", f"got {number} twice; expected {self.expected}"
                )
            seen.add(number)
            numbers.append(number)
        return tuple(numbers)
