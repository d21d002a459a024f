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

from elastic.events.handlers import get_logging_handler

__all__ = [
    "Event",
    "EventMetadataValue",
    "EventSource",
    "NodeState",
    "RdzvEvent",
    "construct_and_record_rdzv_event",
    "get_logging_handler",
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


def _get_or_create_logger(destination: str = "null") -> logging.Logger:
    """torch's: a logger per destination, not propagating, at ``LOGLEVEL`` (INFO)."""
    logger = _events_loggers.get(destination)
    if logger is None:
        handler = get_logging_handler(destination)
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
    if isinstance(get_logging_handler("dynamic_rendezvous"), logging.NullHandler):
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
    record_rdzv_event(
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
