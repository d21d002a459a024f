"""torch's ``torch.distributed.elastic.events`` API: ``Event``, ``EventSource``, ``record``,
``RdzvEvent``, ``construct_and_record_rdzv_event``, ``get_logging_handler``.

Kept for compatibility; the agent's own log uses :class:`elastic.events.AgentEvent`.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import traceback
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from elastic.events import kinds
from elastic.events.handlers import _log_handlers, get_logging_handler

__all__ = [
    "Event",
    "EventMetadataValue",
    "EventSource",
    "NodeState",
    "RdzvEvent",
    "RecordSink",
    "construct_and_record_rdzv_event",
    "get_logging_handler",
    "handler_names",
    "record",
    "record_rdzv_event",
]

EventMetadataValue = str | int | float | bool | None


class EventSource(str, Enum):
    """Known identifiers of the event producers."""

    AGENT = "AGENT"
    WORKER = "WORKER"


@dataclass
class Event:
    """torch's event: a name, a source, a timestamp and flat metadata."""

    name: str
    source: EventSource
    timestamp: int = 0
    metadata: dict[str, EventMetadataValue] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.serialize()

    @staticmethod
    def deserialize(data: str | Event) -> Event:
        if isinstance(data, Event):
            return data
        d = json.loads(data)
        d["source"] = EventSource[d["source"]]
        return Event(**d)

    def serialize(self) -> str:
        return json.dumps(asdict(self))


class NodeState(str, Enum):
    """The states a rendezvous node goes through."""

    INIT = "INIT"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass
class RdzvEvent:
    """torch's rendezvous event."""

    name: str
    run_id: str
    message: str
    hostname: str
    pid: int
    node_state: NodeState
    master_endpoint: str = ""
    rank: int | None = None
    local_id: int | None = None
    error_trace: str = ""

    def __str__(self) -> str:
        return self.serialize()

    @staticmethod
    def deserialize(data: str | RdzvEvent) -> RdzvEvent:
        if isinstance(data, RdzvEvent):
            return data
        d = json.loads(data)
        d["node_state"] = NodeState[d["node_state"]]
        return RdzvEvent(**d)

    def serialize(self) -> str:
        return json.dumps(asdict(self))


_events_loggers: dict[str, logging.Logger] = {}


def _pkg() -> Any:
    """``elastic.events``, where torch's names live: a test or deployment that patches
    ``elastic.events.get_logging_handler`` (torch's path) is obeyed here."""
    import elastic.events

    return elastic.events


def _get_or_create_logger(destination: str = "null") -> logging.Logger:
    """torch's: a logger per destination, not propagating, at ``LOGLEVEL`` (INFO)."""
    logger = _events_loggers.get(destination)
    if logger is None:
        handler = _pkg().get_logging_handler(destination)
        logger = logging.getLogger(f"torchelastic-events-{destination}")
        level = os.environ.get("LOGLEVEL", "INFO").upper()
        logger.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")
        logger.propagate = False
        logger.addHandler(handler)
        _events_loggers[destination] = logger
    return logger


def record(event: Event, destination: str = "null") -> None:
    """Log ``event`` (serialized) to the handler named ``destination``."""
    _get_or_create_logger(destination).info(event.serialize())


def record_rdzv_event(event: RdzvEvent) -> None:
    """Log a rendezvous event to the ``dynamic_rendezvous`` handler."""
    _get_or_create_logger("dynamic_rendezvous").info(event.serialize())


def construct_and_record_rdzv_event(
    run_id: str,
    message: str,
    node_state: NodeState,
    name: str = "",
    hostname: str = "",
    pid: int | None = None,
    master_endpoint: str = "",
    local_id: int | None = None,
    rank: int | None = None,
) -> None:
    """Build an :class:`RdzvEvent` and record it (torch's signature and defaults).

    Nothing is computed while the ``dynamic_rendezvous`` handler is the default
    ``NullHandler``.  ``name`` defaults to the caller's function, prefixed by its file;
    ``hostname`` to this host's FQDN, ``pid`` to this process; a ``FAILED`` event carries
    the traceback being handled.
    """
    if isinstance(_pkg().get_logging_handler("dynamic_rendezvous"), logging.NullHandler):
        return
    if not hostname:
        from elastic.launcher.api import fqdn

        hostname = fqdn()
    if not pid:
        pid = os.getpid()
    caller = inspect.currentframe()
    caller = caller.f_back if caller is not None else None
    filename = "no_file"
    if caller is not None:
        filename = os.path.basename(caller.f_code.co_filename)
        if not name:
            name = caller.f_code.co_name
    del caller  # a frame kept alive holds its locals
    error_trace = traceback.format_exc() if node_state == NodeState.FAILED else ""
    _pkg().record_rdzv_event(
        RdzvEvent(
            name=f"{filename}:{name}",
            run_id=run_id,
            message=message,
            hostname=hostname,
            pid=pid,
            node_state=node_state,
            master_endpoint=master_endpoint,
            rank=rank,
            local_id=local_id,
            error_trace=error_trace,
        )
    )


def handler_names() -> list[str]:
    """The destinations :func:`record` knows (``--event-log-handler`` values)."""
    return sorted(_log_handlers)


class RecordSink:
    """An event sink that passes torch's events to :func:`record` (``--event-log-handler``).

    torch records the per-worker status events (``torchelastic.worker.status.<STATE>``,
    source WORKER) and the agent's ``RENDEZVOUS`` and ``ASSIGN_WORKER_RANKS`` (source
    AGENT) through ``events.record(event, spec.event_log_handler)``; so does this sink,
    with torch's metadata keys where the agent's event has the value.  Other kinds are
    ours and are not recorded.  An unknown destination raises :class:`KeyError`, as
    torch's ``get_logging_handler`` does.
    """

    _WORKER = kinds.WORKER_STATUS
    _AGENT = frozenset({kinds.RENDEZVOUS, kinds.ASSIGN_WORKER_RANKS})

    def __init__(self, destination: str, run_id: str, rdzv_backend: str, hostname: str) -> None:
        _log_handlers[destination]
        self.destination = destination
        self._common: dict[str, EventMetadataValue] = {
            "run_id": run_id,
            "rdzv_backend": rdzv_backend,
            "hostname": hostname,
        }

    def emit(self, event: Any) -> None:
        kind = event.kind
        if kind.startswith(self._WORKER):
            source, state = EventSource.WORKER, kind[len(self._WORKER) :]
        elif kind in self._AGENT:
            source, state = EventSource.AGENT, None
        else:
            return
        fields = event.fields
        metadata: dict[str, EventMetadataValue] = {
            **self._common,
            "global_rank": event.rank,
            "group_rank": fields.get("group_rank"),
            "role": event.role,
            "state": state,
            "duration_ms": fields.get("duration_ms"),
            "metadata": json.dumps(
                {k: v for k, v in fields.items() if k not in ("group_rank", "duration_ms")},
                sort_keys=True,
            ),
        }
        record(Event(kind, source, int(event.t), metadata), self.destination)
