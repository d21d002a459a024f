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

torch's ``Event``/``EventSource``/``record`` API is kept for compatibility in
:mod:`elastic.events.api`, and re-exported here as torch does; it is imported on first
use (``elastic run`` itself never uses it, and its two dataclasses cost ≈0.7 ms of each
launch).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
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
    "ListSink",
    "NodeState",
    "NullSink",
    "RdzvEvent",
    "StreamSink",
    "FanOutSink",
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


class EventSink(Protocol):
    """Where agents send their events."""

    def emit(self, event: AgentEvent) -> None: ...


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


class StreamSink:
    """Writes JSON lines to a text stream."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def emit(self, event: AgentEvent) -> None:
        self._stream.write(event.to_json() + "\n")
        self._stream.flush()


class FanOutSink:
    """Sends each event to several sinks."""

    def __init__(self, *sinks: EventSink) -> None:
        self._sinks = sinks

    def emit(self, event: AgentEvent) -> None:
        for s in self._sinks:
            s.emit(event)


def read_events(lines: Iterable[str]) -> list[AgentEvent]:
    """Parse a JSON-lines event log (blank lines ignored)."""
    return [AgentEvent.from_json(ln) for ln in lines if ln.strip()]
