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
    AGENT, named ``torchelastic.worker.status.RENDEZVOUS`` and so on, as torch's
    ``_construct_event`` names them) through ``events.record(event,
    spec.event_log_handler)``; so does this sink, in torch's shape: the same metadata
    keys in the same order, the inner ``metadata`` JSON with ``group_world_size`` and
    ``entry_point`` (and, for a worker, ``local_rank``, ``role_rank``,
    ``role_world_size``, ``exit_code`` and ``worker_pid`` as one-element lists, as
    torch's are), ``agent_restarts`` as ``max_restarts`` less the restarts left,
    ``total_run_time`` 0 and ``timestamp`` 0 (what torch's records carry during a run).
    An agent event carries the group rank and size from before its round, as torch's
    (recorded before the round's result is applied).

    Differences, on purpose: torch records worker events only when a run ends (its
    ``_record_worker_events``); this sink records each as it happens (a worker's start,
    and every attempt's failures and stops, not only the last); ``raw_error`` is
    ``None`` (the agent's events do not carry the worker's error file, which the final
    report reads).  Other kinds are ours and are not recorded.  An unknown destination
    raises :class:`KeyError`, as torch's ``get_logging_handler`` does.
    """

    _WORKER = kinds.WORKER_STATUS
    _AGENT = frozenset({kinds.RENDEZVOUS, kinds.ASSIGN_WORKER_RANKS})

    def __init__(
        self,
        destination: str,
        run_id: str,
        rdzv_backend: str,
        hostname: str,
        entry_point: str | None = None,
    ) -> None:
        _log_handlers[destination]
        self.destination = destination
        self._run_id = run_id
        self._rdzv_backend = rdzv_backend
        self._hostname = hostname
        self._entry_point = entry_point
        # what torch's agent knows when it records: per node (one in real mode)
        self._group: dict[str, tuple[int | None, int | None]] = {}
        self._round: dict[str, tuple[int | None, int | None]] = {}
        self._max_restarts: dict[str, int] = {}
        self._restarts: dict[str, int] = {}
        self._workers: dict[tuple[str, int | None], tuple[int, int, int, int]] = {}

    def emit(self, event: Any) -> None:
        kind, node, fields = event.kind, event.node, event.fields
        if kind == kinds.AGENT_START:
            self._max_restarts[node] = int(fields.get("max_restarts", 0))
            return
        if kind == kinds.AGENT_RESTART:
            left = fields.get("remaining_restarts")
            if left is not None:
                self._restarts[node] = self._max_restarts.get(node, 0) - int(left)
            return
        group_rank, group_world_size = self._group.get(node, (None, None))
        md: dict[str, Any] = {
            "group_world_size": group_world_size,
            "entry_point": self._entry_point,
        }
        worker_id: str | None = None
        if kind.startswith(self._WORKER):
            source, state = EventSource.WORKER, kind[len(self._WORKER) :]
            key = (node, event.rank)
            if "role_rank" in fields:  # a start: what the later events of the worker lack
                self._workers[key] = (
                    int(fields.get("local_rank", -1)),
                    int(fields["role_rank"]),
                    int(fields.get("role_world_size", fields.get("world_size", 0))),
                    int(fields.get("worker_pid", -1)),
                )
            local_rank, role_rank, role_world_size, pid = self._workers.get(
                key, (int(fields.get("local_rank", -1)), -1, 0, -1)
            )
            pid = int(fields.get("worker_pid", pid))
            worker_id = str(pid) if pid >= 0 else None
            failed = state == "FAILED"
            md.update(
                local_rank=[local_rank],
                role_rank=[role_rank],
                role_world_size=[role_world_size],
                exit_code=[fields.get("exit_code") if failed else None],
                worker_pid=[pid if failed else None],
            )
        elif kind in self._AGENT:
            source, state = EventSource.AGENT, kind
            kind = self._WORKER + kind
        else:
            return
        metadata: dict[str, EventMetadataValue] = {
            "run_id": self._run_id,
            "global_rank": event.rank,
            "group_rank": group_rank,
            "worker_id": worker_id,
            "role": event.role,
            "hostname": self._hostname,
            "state": state,
            "total_run_time": 0,
            "rdzv_backend": self._rdzv_backend,
            "raw_error": None,
            "metadata": json.dumps(md),
            "agent_restarts": self._restarts.get(node, 0),
            "duration_ms": fields.get("duration_ms"),
        }
        record(Event(kind, source, 0, metadata), self.destination)
        # the round's result is the group's once its ranks are assigned (torch's order)
        if state == kinds.RENDEZVOUS:
            self._round[node] = (fields.get("group_rank"), fields.get("group_world_size"))
        elif state == kinds.ASSIGN_WORKER_RANKS and node in self._round:
            self._group[node] = self._round.pop(node)
