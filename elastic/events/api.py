"""torch's ``torch.distributed.elastic.events`` API: ``Event``, ``EventSource``, ``record``.

Kept for compatibility; the agent's own log uses :class:`elastic.events.AgentEvent`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from enum import Enum

__all__ = ["Event", "EventSource", "NodeState", "RdzvEvent", "record"]

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


_log_handlers: dict[str, logging.Handler] = {
    "console": logging.StreamHandler(),
    "dynamic_rendezvous": logging.NullHandler(),
    "null": logging.NullHandler(),
}


def _get_or_create_logger(destination: str = "null") -> logging.Logger:
    handler = _log_handlers[destination]
    logger = logging.getLogger(f"torchelastic-events-{destination}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if handler not in logger.handlers:
        logger.addHandler(handler)
    return logger


def record(event: Event, destination: str = "null") -> None:
    """Log ``event`` (serialized) to the handler named ``destination``."""
    _get_or_create_logger(destination).info(event.serialize())
