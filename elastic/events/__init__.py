"""One event schema for both worlds (DESIGN §4), plus torch's ``events`` API.

Every agent, in the simulator or for real, emits :class:`AgentEvent` records to an
:class:`EventSink`.  One record is one JSON line with the keys
``t`` (seconds on the world's clock), ``node``, ``role``, ``rank`` (global rank or
null), ``kind`` and ``fields`` (a flat JSON object).  The report (summary, goodput,
recovery times) is computed from these lines alone.

Kinds use torch's names where torch has one:

* ``torchelastic.worker.status.<STATE>`` — per worker, STATE in START, SUCCEEDED,
  FAILED, TERMINATED (fields: group_rank, local_rank, role_rank, world_size, exit_code,
  worker_pid, attempt);
* ``RENDEZVOUS`` / ``ASSIGN_WORKER_RANKS`` — agent, with ``duration_ms``, ``round``,
  ``group_rank``, ``group_world_size``;
* ``agent.*`` — our own agent lifecycle kinds (``agent.start``, ``agent.group_started``,
  ``agent.group_stopped``, ``agent.restart``, ``agent.finish``, ``agent.membership_change``,
  ``agent.unhealthy``);
* ``sim.*`` — the simulator's own kinds (``sim.fault``, ``sim.progress``, …).

A node's workers start and stop together, each with its own status event.  An agent may
hand a sink those events as one :class:`WorkerEvents` record (``emit_group``) when the
sink has that method; a sink without it gets each :class:`AgentEvent` through ``emit``,
exactly as if no record existed.  Expanding a record (:meth:`WorkerEvents.events`) gives
the events the agent would have emitted one by one: same order, fields, time.  Likewise
an agent hands a sink that takes parts (:class:`PartsSink`: ``emit_parts`` and
``emit_group_parts``) each event, or each such record, as its parts, without making the
:class:`AgentEvent` or the record (a sink that only counts most events, the simulator's
report, then makes none).

torch's ``Event``/``EventSource``/``record`` API is kept for compatibility in
:mod:`elastic.events.api`, and re-exported here as torch does; it is imported on first
use (``elastic run`` itself never uses it, and its two dataclasses cost ≈0.7 ms of each
launch).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol

from elastic._records import Frozen, slot_setters

if TYPE_CHECKING:
    from elastic.events.api import (
        Event,
        EventMetadataValue,
        EventSource,
        NodeState,
        RdzvEvent,
        construct_and_record_rdzv_event,
        get_logging_handler,
        record,
        record_rdzv_event,
    )

__all__ = [
    "AgentEvent",
    "Event",
    "EventMetadataValue",
    "EventSink",
    "EventSource",
    "GroupSink",
    "ListSink",
    "NodeState",
    "NullSink",
    "PartsSink",
    "PartsTaker",
    "RdzvEvent",
    "StreamSink",
    "FanOutSink",
    "WorkerEvents",
    "emit_group",
    "parts_sink",
    "record_fields",
    "construct_and_record_rdzv_event",
    "get_logging_handler",
    "read_events",
    "record",
    "record_rdzv_event",
]

JSONScalar = str | int | float | bool | None

_TORCH_API = frozenset(
    {
        "Event",
        "EventMetadataValue",
        "EventSource",
        "NodeState",
        "RdzvEvent",
        "_get_or_create_logger",
        "construct_and_record_rdzv_event",
        "get_logging_handler",
        "record",
        "record_rdzv_event",
    }
)


def __getattr__(name: str) -> Any:
    """torch's events API, imported the first time one of its names is asked for."""
    if name in _TORCH_API:
        from elastic.events import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class AgentEvent(Frozen):
    """One line of the event log."""

    __slots__ = ("fields", "kind", "node", "rank", "role", "t")
    t: float
    node: int | str
    kind: str
    role: str
    rank: int | None
    fields: Mapping[str, Any]

    def __init__(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str = "",
        rank: int | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        _set_t(self, t)
        _set_node(self, node)
        _set_kind(self, kind)
        _set_role(self, role)
        _set_rank(self, rank)
        # kept as given, not copied: an event is made per worker start and stop, and its
        # maker hands over a dict of its own (``_emit``'s keyword arguments)
        _set_fields(self, {} if fields is None else fields)

    def to_json(self) -> str:
        """One JSON line; keys sorted so the same run gives the same bytes."""
        return json.dumps(
            {
                "t": round(self.t, 6),
                "node": self.node,
                "role": self.role,
                "rank": self.rank,
                "kind": self.kind,
                # a dict as it is (no copy per line of a log); another mapping as a dict
                "fields": self.fields if type(self.fields) is dict else dict(self.fields),
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, line: str) -> AgentEvent:
        d = json.loads(line)
        return cls(
            t=float(d["t"]),
            node=d["node"],
            kind=str(d["kind"]),
            role=str(d.get("role", "")),
            rank=d.get("rank"),
            fields=dict(d.get("fields") or {}),
        )


_set_t, _set_node, _set_kind, _set_role, _set_rank, _set_fields = slot_setters(
    AgentEvent, "t", "node", "kind", "role", "rank", "fields"
)


class WorkerEvents(Frozen):
    """Events of one kind for several workers of one node at one instant, as one record.

    Event ``i`` is ``AgentEvent(t, node, kind, role, ranks[i], fields_i)`` where
    ``fields_i`` has the keys ``keys``, in that order, each with the value of
    ``columns[key][i]`` if the key is a column, else ``fields[key]`` (shared).  A key is
    in exactly one of ``fields`` and ``columns``, and every column has one value per rank
    (checked when the record is made: :class:`ValueError`).

    Performance: the simulator's agents start and stop eight workers per node per job
    restart, each with a status event that its report only counts; as one record, a
    sink that reads none of them (:class:`NullSink`, the simulator's report) pays once per
    group, not once per worker.
    """

    __slots__ = ("columns", "fields", "keys", "kind", "node", "ranks", "role", "t")
    t: float
    node: int | str
    kind: str
    role: str
    ranks: Sequence[int | None]
    keys: tuple[str, ...]
    fields: Mapping[str, Any]
    columns: Mapping[str, Sequence[Any]]

    def __init__(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        ranks: Sequence[int | None],
        keys: tuple[str, ...],
        fields: Mapping[str, Any],
        columns: Mapping[str, Sequence[Any]],
    ) -> None:
        n = len(ranks)
        named = set(keys)
        if (
            len(named) != len(keys)
            or len(keys) != len(fields) + len(columns)
            or named != fields.keys() | columns.keys()
        ):
            raise ValueError(
                f"WorkerEvents keys {keys!r}: expected each once, in exactly one of the "
                f"shared fields {sorted(fields)!r} and the columns {sorted(columns)!r}"
            )
        for k, col in columns.items():
            if len(col) != n:
                raise ValueError(
                    f"WorkerEvents column {k!r} has {len(col)} values; expected one per rank ({n})"
                )
        _fill(self, t, node, kind, role, ranks, keys, fields, columns)

    @classmethod
    def unchecked(
        cls,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        ranks: Sequence[int | None],
        keys: tuple[str, ...],
        fields: Mapping[str, Any],
        columns: Mapping[str, Sequence[Any]],
    ) -> WorkerEvents:
        """The record ``WorkerEvents(...)`` makes, without its checks: for a maker whose
        keys and columns are right by construction (the agent's START and TERMINATED
        records, one column per field it lists, each built from the group's workers).

        Performance: the checks (two sets, a union, a loop over the columns) were a
        third of a record's making, and the agent makes two per node per job restart."""
        self = cls.__new__(cls)
        _fill(self, t, node, kind, role, ranks, keys, fields, columns)
        return self

    def __len__(self) -> int:
        return len(self.ranks)

    def event(self, i: int) -> AgentEvent:
        """Event ``i`` alone (``events()[i]``, without making the others)."""
        return AgentEvent(self.t, self.node, self.kind, self.role, self.ranks[i], self.fields_of(i))

    def fields_of(self, i: int) -> dict[str, Any]:
        """Event ``i``'s fields (``event(i).fields``, without making the event)."""
        return record_fields(self.keys, self.fields, self.columns, i)

    def events(self) -> list[AgentEvent]:
        """The events, one per rank, in order: what the agent emits without the record."""
        shared, columns = self.fields, self.columns
        cells = [(k, columns.get(k)) for k in self.keys]
        t, node, kind, role = self.t, self.node, self.kind, self.role
        return [
            AgentEvent(
                t,
                node,
                kind,
                role,
                rank,
                {k: shared[k] if col is None else col[i] for k, col in cells},
            )
            for i, rank in enumerate(self.ranks)
        ]


_g_t, _g_node, _g_kind, _g_role, _g_ranks, _g_keys, _g_fields, _g_columns = slot_setters(
    WorkerEvents, "t", "node", "kind", "role", "ranks", "keys", "fields", "columns"
)


def record_fields(
    keys: tuple[str, ...], shared: Mapping[str, Any], columns: Mapping[str, Sequence[Any]], i: int
) -> dict[str, Any]:
    """The fields of event ``i`` of the record with these ``keys``, ``fields`` (``shared``)
    and ``columns`` (:meth:`WorkerEvents.fields_of`, without the record)."""
    return {k: shared[k] if k not in columns else columns[k][i] for k in keys}


def _fill(
    self: WorkerEvents,
    t: float,
    node: int | str,
    kind: str,
    role: str,
    ranks: Sequence[int | None],
    keys: tuple[str, ...],
    fields: Mapping[str, Any],
    columns: Mapping[str, Sequence[Any]],
) -> None:
    """Set a (frozen) record's slots: what ``__init__`` and ``unchecked`` share."""
    _g_t(self, t)
    _g_node(self, node)
    _g_kind(self, kind)
    _g_role(self, role)
    _g_ranks(self, ranks)
    _g_keys(self, keys)
    _g_fields(self, fields)
    _g_columns(self, columns)


class EventSink(Protocol):
    """Where agents send their events.

    A sink may also have ``emit_group(group: WorkerEvents)`` (:class:`GroupSink`): it
    then receives a group of workers' events as one record, which it must treat exactly
    as the record's :meth:`~WorkerEvents.events` emitted one by one.  Agents hand the
    record only to a sink whose ``emit_group`` is not ``None``.

    A sink that takes records may also take parts (:class:`PartsSink`): with
    ``emit_parts(t, node, kind, role, rank, fields)`` it receives an event as its parts,
    which it must treat exactly as ``emit(AgentEvent(t, node, kind, role, rank,
    fields))``; with ``emit_group_parts(t, node, kind, role, ranks, keys, fields,
    columns)`` a record as its parts, exactly as ``emit_group`` of the record
    :meth:`WorkerEvents.unchecked` makes of them.  Agents hand parts only to a sink whose
    three methods were not ``None`` when they were given the sink (:func:`parts_sink`;
    they must not become ``None`` later).

    Performance: a frozen record's slots are set through their descriptors, each call
    making a tuple of its arguments: making an :class:`AgentEvent` (six) costs about
    5,500 instructions (callgrind; a plain slotted class of six fields about 2,000), a
    :class:`WorkerEvents` (eight) more, and the simulator's report reads a field or two
    of most events and only counts the rest."""

    def emit(self, event: AgentEvent) -> None: ...


class GroupSink(EventSink, Protocol):
    """A sink that takes a group of workers' events as one record (see :class:`EventSink`)."""

    def emit_group(self, group: WorkerEvents) -> None: ...


class PartsSink(GroupSink, Protocol):
    """A sink that takes an event, and a record, as its parts (see :class:`EventSink`)."""

    def emit_parts(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        rank: int | None,
        fields: Mapping[str, Any],
    ) -> None: ...

    def emit_group_parts(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        ranks: Sequence[int | None],
        keys: tuple[str, ...],
        fields: Mapping[str, Any],
        columns: Mapping[str, Sequence[Any]],
    ) -> None: ...


class PartsTaker:
    """A base for a sink that takes parts: its ``emit`` and ``emit_group`` hand the event
    or record over as its parts, to the subclass's ``emit_parts`` and
    ``emit_group_parts``."""

    __slots__ = ()

    def emit(self, e: AgentEvent) -> None:
        self.emit_parts(e.t, e.node, e.kind, e.role, e.rank, e.fields)  # type: ignore[attr-defined]

    def emit_group(self, g: WorkerEvents) -> None:
        """Exactly :meth:`emit` of each of ``g.events()``, as the record's parts."""
        self.emit_group_parts(  # type: ignore[attr-defined]
            g.t, g.node, g.kind, g.role, g.ranks, g.keys, g.fields, g.columns
        )


_PARTS = ("emit_group", "emit_parts", "emit_group_parts")


def parts_sink(sink: EventSink) -> PartsSink | None:
    """``sink`` if it takes events and records as their parts (none of ``emit_group``,
    ``emit_parts`` and ``emit_group_parts`` is missing or ``None``), else ``None``."""
    if all(getattr(sink, name, None) is not None for name in _PARTS):
        return sink  # type: ignore[return-value]
    return None


def emit_group(sink: EventSink, group: WorkerEvents) -> None:
    """Send ``group`` to ``sink``: as one record if it takes records, else event by event."""
    take = getattr(sink, "emit_group", None)
    if take is not None:
        take(group)
        return
    emit = sink.emit
    for e in group.events():
        emit(e)


class ListSink:
    """Keeps events in memory (the simulator's log; tests)."""

    def __init__(self) -> None:
        self.events: list[AgentEvent] = []

    def emit(self, event: AgentEvent) -> None:
        self.events.append(event)

    def __iter__(self) -> Iterator[AgentEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)


class NullSink:
    """Drops every event: the agent's sink when none is given (a list would grow with
    every restart of a long-running job)."""

    def emit(self, event: AgentEvent) -> None:
        pass

    def emit_group(self, group: WorkerEvents) -> None:
        pass

    def emit_parts(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        rank: int | None,
        fields: Mapping[str, Any],
    ) -> None:
        pass

    def emit_group_parts(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        ranks: Sequence[int | None],
        keys: tuple[str, ...],
        fields: Mapping[str, Any],
        columns: Mapping[str, Sequence[Any]],
    ) -> None:
        pass


class StreamSink:
    """Writes JSON lines to a text stream."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def emit(self, event: AgentEvent) -> None:
        self._stream.write(event.to_json() + "\n")
        self._stream.flush()


class FanOutSink:
    """Sends each event to several sinks.

    It takes a group of workers' events as one record (``emit_group``) only when every
    sink it feeds does, and then hands the record to each in turn (each sink sees the
    same events in the same order; only their interleaving across sinks differs);
    otherwise ``emit_group`` is ``None`` and the agent sends each event to every sink."""

    emit_group: Callable[[WorkerEvents], None] | None

    def __init__(self, *sinks: EventSink) -> None:
        self._sinks = sinks
        takers = [getattr(s, "emit_group", None) for s in sinks]
        self._takers = tuple(t for t in takers if t is not None)
        self.emit_group = self._emit_group_all if len(self._takers) == len(sinks) else None

    def emit(self, event: AgentEvent) -> None:
        for s in self._sinks:
            s.emit(event)

    def _emit_group_all(self, group: WorkerEvents) -> None:
        for take in self._takers:
            take(group)


def read_events(lines: Iterable[str]) -> list[AgentEvent]:
    """Parse a JSON-lines event log (blank lines ignored)."""
    return [AgentEvent.from_json(ln) for ln in lines if ln.strip()]
