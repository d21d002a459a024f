"""Reading a saved event log (``elastic report``): bounded, strict, one line per problem.

An event log is JSON lines, one :class:`~elastic.events.AgentEvent` per line (DESIGN §4),
written by ``elastic run --event-log`` or ``elastic sim --events``.  A log comes from a
file a user names, so reading it is bounded and refuses what is not an event log with
:class:`EventLogError` (``file:line: what is wrong``) instead of a traceback or a
report of nothing.

Limits (each refused with one line):

* the file: a regular file (not a FIFO, device or directory) of at most
  :data:`MAX_LOG_BYTES`; at least one event;
* a line: at most :data:`MAX_LINE_BYTES`, UTF-8, one JSON object whose values nest at
  most :data:`MAX_DEPTH` deep; numbers finite (no ``NaN``/``Infinity``), integers within
  ±2⁶³, times within ±:data:`MAX_TIME`;
* the keys: ``t`` (a number), ``node`` (an integer ≥ 0 or a string of at most 256
  characters), ``kind`` (a non-empty string of at most 128), optionally ``role`` (a
  string), ``rank`` (an integer or null) and ``fields`` (an object of at most
  :data:`MAX_FIELDS` keys); no other key;
* the fields the report reads (:data:`FIELD_TYPES`) have the type it needs.

Reading is one pass in time linear in the file, and :func:`iter_event_log` yields the
events one by one, so the report of a large log holds only its running totals.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator
from typing import Any

from elastic.errors import ConfigError
from elastic.events import AgentEvent, kinds

__all__ = [
    "FIELD_TYPES",
    "MAX_DEPTH",
    "MAX_FIELDS",
    "MAX_LINE_BYTES",
    "MAX_LOG_BYTES",
    "MAX_TIME",
    "EventLogError",
    "iter_event_log",
]

#: The largest event log read (a 512-node, 55-hour simulation writes about 94 MB).
MAX_LOG_BYTES = 512 * 1024 * 1024
#: The longest line (one event).
MAX_LINE_BYTES = 64 * 1024
#: How deep values may nest inside an event (the event object is depth 1).
MAX_DEPTH = 8
#: The most keys an event's ``fields`` may have.
MAX_FIELDS = 256
#: The largest magnitude of an event's time, in seconds (about 31,000 years).
MAX_TIME = 1e12
_MAX_INT = 2**63

_INT = "an integer"
_NONNEG = "an integer ≥ 0"
_NUM = "a number ≥ 0"
_STR = "a string"
#: kind -> field -> what the report needs of it (fields absent are fine).
FIELD_TYPES: dict[str, dict[str, str]] = {
    "sim.start": {"name": _STR, "seed": _INT, "step_time": _NUM, "steps": _NONNEG},
    "sim.end": {"reason": _STR, "steps_done": _NONNEG, "final_nodes": _NONNEG},
    kinds.AGENT_FINISH: {"state": _STR, "restarts": _NONNEG, "rounds": _NONNEG},
    kinds.AGENT_RESTART: {"reason": _STR, "remaining_restarts": _NONNEG},
    kinds.AGENT_GROUP_STARTED: {"world_size": _NONNEG, "attempt": _NONNEG},
    kinds.AGENT_GROUP_STOPPED: {"attempt": _NONNEG},
    kinds.RENDEZVOUS: {"round": _NONNEG},
    "sim.progress": {"steps": _NONNEG, "ckpt_step": _NONNEG},
    "sim.world_running": {"from_step": _NONNEG},
    "sim.fault": {"fault": _STR},
}
_KEYS = frozenset({"t", "node", "kind", "role", "rank", "fields"})


class EventLogError(ConfigError):
    """The file is not an event log this reader accepts: ``where`` (file or file:line)
    and what is wrong; ``str()`` is the one line."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of ``value`` (a scalar is 0), stopping past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -_MAX_INT <= v < _MAX_INT


def _is_number(v: Any) -> bool:
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


def _check_field(value: Any, need: str) -> bool:
    if need == _STR:
        return isinstance(value, str)
    if need == _INT:
        return _is_int(value)
    if need == _NONNEG:
        return _is_int(value) and value >= 0
    return _is_number(value) and value >= 0


def _big_ints(d: Any, where: str) -> None:
    stack = [d]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool) and not _is_int(v):
            raise EventLogError(where, "an integer beyond ±2**63")


def parse_event(line: bytes, where: str) -> AgentEvent:
    """One line → one event, or :class:`EventLogError` naming ``where`` and the problem."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise EventLogError(where, "not UTF-8 text") from None
    try:
        d = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise EventLogError(where, f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise EventLogError(where, f"not JSON ({e})") from None
    if not isinstance(d, dict):
        raise EventLogError(where, f"expected a JSON object (an event), got {type(d).__name__}")
    if _depth(d, MAX_DEPTH) > MAX_DEPTH:
        raise EventLogError(where, f"JSON nested deeper than {MAX_DEPTH} levels")
    _big_ints(d, where)
    extra = sorted(set(d) - _KEYS)
    if extra:
        raise EventLogError(
            where, f"unknown key {extra[0]!r}; an event has t, node, kind, role, rank, fields"
        )
    for key in ("t", "node", "kind"):
        if key not in d:
            raise EventLogError(where, f"no {key!r}; an event has t, node and kind")
    t, node, kind = d["t"], d["node"], d["kind"]
    if not _is_number(t) or abs(t) > MAX_TIME:
        raise EventLogError(where, f"t = {t!r}; expected seconds, a number within ±{MAX_TIME:g}")
    if not ((_is_int(node) and node >= 0) or (isinstance(node, str) and 0 < len(node) <= 256)):
        raise EventLogError(
            where, f"node = {_short(node)}; expected an integer ≥ 0 or a name of 1 to 256 chars"
        )
    if not isinstance(kind, str) or not 0 < len(kind) <= 128:
        raise EventLogError(where, f"kind = {_short(kind)}; expected a name of 1 to 128 characters")
    role = d.get("role", "")
    if not isinstance(role, str) or len(role) > 256:
        raise EventLogError(where, f"role = {_short(role)}; expected a string")
    rank = d.get("rank")
    if rank is not None and not (_is_int(rank) and rank >= 0):
        raise EventLogError(where, f"rank = {_short(rank)}; expected an integer ≥ 0 or null")
    fields = d.get("fields")
    if fields is None:
        fields = {}
    if not isinstance(fields, dict) or len(fields) > MAX_FIELDS:
        raise EventLogError(
            where, f"fields = {_short(fields)}; expected an object of at most {MAX_FIELDS} keys"
        )
    for name, need in FIELD_TYPES.get(kind, {}).items():
        if name in fields and not _check_field(fields[name], need):
            raise EventLogError(
                where, f"{kind} field {name!r} = {_short(fields[name])}; expected {need}"
            )
    return AgentEvent(t=float(t), node=node, kind=kind, role=role, rank=rank, fields=fields)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _open_regular(path: str) -> Any:
    try:
        st = os.stat(path)
    except OSError as e:
        raise EventLogError(path, f"cannot read it: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise EventLogError(path, f"{what}; expected an event log (a JSON-lines file)")
    if st.st_size > MAX_LOG_BYTES:
        raise EventLogError(
            path, f"{st.st_size:,} bytes; an event log may have at most {MAX_LOG_BYTES:,}"
        )
    try:
        # O_NONBLOCK: should the path have become a FIFO since the stat, open does not wait
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise EventLogError(path, f"cannot read it: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EventLogError(path, "not a regular file; expected an event log")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def iter_event_log(path: str) -> Iterator[AgentEvent]:
    """The events of the log at ``path``, in file order; :class:`EventLogError` if it is
    not one (raised when the bad line is reached, or at the end if it held no event)."""
    total = 0
    count = 0
    with _open_regular(path) as f:
        lineno = 0
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            lineno += 1
            total += len(line)
            if total > MAX_LOG_BYTES:
                raise EventLogError(path, f"longer than {MAX_LOG_BYTES:,} bytes")
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                raise EventLogError(
                    f"{path}:{lineno}", f"a line longer than {MAX_LINE_BYTES:,} bytes"
                )
            if not line.strip():
                continue
            yield parse_event(line, f"{path}:{lineno}")
            count += 1
    if not count:
        raise EventLogError(path, "no events; expected JSON lines, one event per line")
