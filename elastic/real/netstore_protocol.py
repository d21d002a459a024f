"""The network store's wire protocol: bytes in, frames and validated messages out.

No I/O here (h11's rule): the server and the client in :mod:`elastic.real.netstore`
read and write sockets and feed bytes to a :class:`FrameDecoder`; everything that decides
what a byte sequence means lives in this module and is testable without a socket.

Theory of operation
-------------------
A connection carries *frames*: a 4-byte big-endian length, then that many bytes of one
msgpack value (never a pickle — DESIGN §3).  A frame longer than the decoder's
``max_frame`` is refused from its header alone, before any body byte is buffered.

A request is a msgpack array ``[id, op, *args]``; ``id`` is a non-negative integer the
client picks, unique among its outstanding requests, so one connection carries many
requests at once and a blocking ``get`` or ``watch`` holds up nothing else.  A response is
``[id, 0, value]`` (success) or ``[id, 1, kind, message]`` (failure, ``kind`` one of
:data:`ERROR_KINDS`).  The protocol has no version number: ops added later
(:data:`FEATURES`) are listed by a host that has them in its ``hello`` reply (``"ops"``),
so a client asks only a host that can answer, and an older client is unaffected.
``cancel`` (the client gave up waiting) has no response.  An error
that concerns the connection rather than one request (bad frame, failed authentication)
is answered with id ``0`` and the server closes the connection.

Invariants
----------
* :func:`decode_request` returns a :class:`Request` whose ``args`` have exactly the types
  and sizes :data:`OPS` lists for its ``op``, or raises :class:`ProtocolError`; nothing
  else escapes (msgpack's own exceptions are translated).
* The decoder's buffer never holds more than one frame header plus ``max_frame`` bytes.
* Decoding is total over byte strings: garbage, truncation, huge lengths, deep nesting and
  wrong schemas all end in :class:`ProtocolError`, never in another exception.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from elastic.errors import StoreError

__all__ = [
    "ERROR_KINDS",
    "FEATURES",
    "MAX_FRAME",
    "MAX_KEY",
    "MAX_KEYS",
    "MAX_VALUE",
    "OPS",
    "FrameDecoder",
    "ProtocolError",
    "Request",
    "Response",
    "decode_request",
    "decode_response",
    "encode_error",
    "encode_ok",
    "encode_request",
]

MAX_FRAME: Final = 8 * 1024 * 1024  # one frame's body, bytes
MAX_VALUE: Final = 4 * 1024 * 1024  # one value (MemoryStore's own limit)
MAX_KEY: Final = 4096  # one key or prefix, characters
MAX_KEYS: Final = 100_000  # keys in one wait/multi_get/multi_set
MAX_TOKEN: Final = 1024
_HEADER = struct.Struct(">I")
_INT64 = (-(2**63), 2**63 - 1)

ERROR_KINDS: Final = frozenset({"store", "timeout", "closed", "auth", "protocol", "lease", "limit"})


class ProtocolError(StoreError):
    """Bytes that are not a valid frame or message of the network store protocol."""


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request: ``args`` are validated against :data:`OPS`."""

    id: int
    op: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Response:
    """One decoded response: ``value`` if ``ok``, else ``kind`` and ``message``."""

    id: int
    ok: bool
    value: Any = None
    kind: str = ""
    message: str = ""


# -- argument checkers: each returns the value or raises ProtocolError -----------------
Check = Callable[[Any], Any]


def _key(v: Any) -> str:
    if not isinstance(v, str) or len(v) > MAX_KEY:
        raise ProtocolError(f"expected a key (str of at most {MAX_KEY} characters)")
    return v


def _value(v: Any) -> bytes:
    if not isinstance(v, bytes) or len(v) > MAX_VALUE:
        raise ProtocolError(f"expected a value (bytes of at most {MAX_VALUE})")
    return v


def _opt_value(v: Any) -> bytes | None:
    return None if v is None else _value(v)


def _int64(v: Any) -> int:
    if type(v) is not int or not _INT64[0] <= v <= _INT64[1]:
        raise ProtocolError("expected a 64-bit integer")
    return v


def _lease_id(v: Any) -> int:
    if type(v) is not int or not 0 < v <= _INT64[1]:
        raise ProtocolError("expected a lease id (a positive integer)")
    return v


def _opt_lease_id(v: Any) -> int | None:
    return None if v is None else _lease_id(v)


def _seconds(v: Any) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
        raise ProtocolError("expected a duration (finite seconds, >= 0)")
    return float(v)


def _opt_seconds(v: Any) -> float | None:
    return None if v is None else _seconds(v)


def _ttl(v: Any) -> float:
    s = _seconds(v)
    if s <= 0:
        raise ProtocolError("expected a lease ttl (seconds > 0)")
    return s


def _keys(v: Any) -> list[str]:
    if not isinstance(v, list) or len(v) > MAX_KEYS:
        raise ProtocolError(f"expected a list of at most {MAX_KEYS} keys")
    return [_key(k) for k in v]


def _items(v: Any) -> dict[str, bytes]:
    if not isinstance(v, dict) or len(v) > MAX_KEYS:
        raise ProtocolError(f"expected a map of at most {MAX_KEYS} keys to values")
    return {_key(k): _value(x) for k, x in v.items()}


def _opt_token(v: Any) -> str | None:
    if v is not None and (not isinstance(v, str) or len(v) > MAX_TOKEN):
        raise ProtocolError(f"expected a token (str of at most {MAX_TOKEN} characters)")
    return v


def _revision(v: Any) -> int:
    if type(v) is not int or not -1 <= v <= _INT64[1]:
        raise ProtocolError("expected a revision (an integer >= -1)")
    return v


def _request_id(v: Any) -> int:
    if type(v) is not int or not 0 <= v <= _INT64[1]:
        raise ProtocolError("expected a request id (a non-negative integer)")
    return v


# The request table: op -> argument checkers, in order.  The server's dispatch table and
# the client's calls follow it; an op missing here does not exist on the wire.
OPS: Final[dict[str, tuple[Check, ...]]] = {
    "hello": (_opt_token,),
    "ping": (),
    "cancel": (_request_id,),
    "set": (_key, _value, _opt_lease_id),
    "get": (_key, _opt_seconds),
    "try_get": (_key,),
    "add": (_key, _int64),
    "compare_set": (_key, _opt_value, _value, _opt_lease_id),
    "wait": (_keys, _opt_seconds),
    "delete": (_key,),
    "multi_get": (_keys, _opt_seconds),
    "multi_set": (_items,),
    "grant_lease": (_ttl,),
    "keepalive": (_lease_id,),
    "revoke": (_lease_id,),
    "snapshot": (_key,),
    "watch": (_key, _revision, _opt_seconds),
    # (prefix, after, read_prefix, timeout): a watch answered with read_prefix's snapshot
    # at the wake; a host has it iff its hello lists it in "ops" (see FEATURES)
    "watch_snapshot": (_key, _revision, _key, _opt_seconds),
    # (counter, key, value, under, lease id): add 1 to counter, set key, count the keys
    # under ``under``, as one revision (elastic.store.ArriveStore); in FEATURES
    "arrive": (_key, _key, _value, _key, _opt_lease_id),
}

#: the ops a host added after the first protocol, listed in its ``hello`` reply's
#: ``"ops"``: a client sends one only to a host that lists it (an older host closes the
#: connection on an op it does not know), and falls back otherwise; an older client
#: ignores the list
FEATURES: Final = ("watch_snapshot", "arrive")


# -- framing ------------------------------------------------------------------------
class FrameDecoder:
    """Fed bytes, yields complete frame bodies; raises :class:`ProtocolError` on a bad length."""

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return every frame body now complete, in order."""
        self._buf += data
        out: list[bytes] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = _HEADER.unpack_from(buf, pos)
            if n > self.max_frame:
                self._buf = bytearray()
                raise ProtocolError(f"a frame of {n} bytes exceeds the limit of {self.max_frame}")
            if len(buf) - pos - 4 < n:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held (0 between frames)."""
        return len(self._buf)


def _frame(obj: Any, max_frame: int = MAX_FRAME) -> bytes:
    try:
        body: bytes = msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"cannot encode the message: {e}") from None
    if len(body) > max_frame:
        raise ProtocolError(f"a message of {len(body)} bytes exceeds the frame limit {max_frame}")
    return _HEADER.pack(len(body)) + body


def _unpack(body: bytes, max_frame: int) -> Any:
    if len(body) > max_frame:
        raise ProtocolError(f"a frame of {len(body)} bytes exceeds the limit of {max_frame}")
    try:
        # unpackb bounds every str/bin/array/map by len(body); nesting by a fixed stack
        return msgpack.unpackb(body, raw=False)
    except (ValueError, TypeError, OverflowError) as e:  # msgpack's errors are ValueErrors
        raise ProtocolError(f"malformed msgpack body: {type(e).__name__}: {e}"[:200]) from None


# -- requests -----------------------------------------------------------------------
def encode_request(req_id: int, op: str, *args: Any, max_frame: int = MAX_FRAME) -> bytes:
    """One request frame; raises :class:`ProtocolError` if it would not fit a frame."""
    return _frame([req_id, op, *args], max_frame)


def decode_request(body: bytes, max_frame: int = MAX_FRAME) -> Request:
    """Validate one frame body as a request (see :data:`OPS`)."""
    msg = _unpack(body, max_frame)
    if not isinstance(msg, list) or len(msg) < 2:
        raise ProtocolError("a request is an array [id, op, *args]")
    req_id = _request_id(msg[0])
    op = msg[1]
    if not isinstance(op, str) or op not in OPS:
        shown = op[:40] if isinstance(op, str) else type(op).__name__
        raise ProtocolError(f"unknown operation {shown!r}")
    checks = OPS[op]
    if len(msg) - 2 != len(checks):
        raise ProtocolError(f"{op} takes {len(checks)} arguments, got {len(msg) - 2}")
    try:
        args = tuple(c(a) for c, a in zip(checks, msg[2:], strict=True))
    except ProtocolError as e:
        raise ProtocolError(f"{op}: {e}") from None
    return Request(req_id, op, args)


# -- responses ----------------------------------------------------------------------
def encode_ok(req_id: int, value: Any, max_frame: int = MAX_FRAME) -> bytes:
    """A success response frame."""
    return _frame([req_id, 0, value], max_frame)


def encode_error(req_id: int, kind: str, message: str) -> bytes:
    """A failure response frame (the message is cut to 1,000 characters)."""
    assert kind in ERROR_KINDS, kind
    return _frame([req_id, 1, kind, message[:1000]])


def decode_response(body: bytes, max_frame: int = MAX_FRAME) -> Response:
    """Validate one frame body as a response; the value is checked by the caller per op."""
    msg = _unpack(body, max_frame)
    if not isinstance(msg, list) or len(msg) < 3:
        raise ProtocolError("a response is an array [id, 0, value] or [id, 1, kind, message]")
    req_id = _request_id(msg[0])
    if msg[1] == 0 and len(msg) == 3:
        return Response(req_id, True, msg[2])
    if msg[1] == 1 and len(msg) == 4:
        kind, message = msg[2], msg[3]
        if kind not in ERROR_KINDS or not isinstance(message, str):
            raise ProtocolError("an error response needs a known kind and a str message")
        return Response(req_id, False, kind=kind, message=message)
    raise ProtocolError("a response is an array [id, 0, value] or [id, 1, kind, message]")


# -- result checkers for the client: the server is not trusted either ------------------
def _r_none(v: Any) -> None:
    if v is not None:
        raise ProtocolError("expected no value")


def _r_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ProtocolError("expected a bool")
    return v


def _r_values(v: Any) -> list[bytes]:
    if not isinstance(v, list):
        raise ProtocolError("expected a list of values")
    return [_value(x) for x in v]


def _r_snapshot(v: Any) -> tuple[int, dict[str, bytes]]:
    if not isinstance(v, list) or len(v) != 2 or not isinstance(v[1], dict):
        raise ProtocolError("expected [revision, {key: value}]")
    return _revision(v[0]), {_key(k): _value(x) for k, x in v[1].items()}


def _r_arrival(v: Any) -> tuple[int, int, int, bool]:
    if (
        not isinstance(v, list)
        or len(v) != 4
        or type(v[2]) is not int
        or not 0 <= v[2] <= _INT64[1]
        or not isinstance(v[3], bool)
    ):
        raise ProtocolError("expected [counter, revision, count, marked]")
    return _int64(v[0]), _revision(v[1]), v[2], v[3]


def _r_hello(v: Any) -> dict[str, Any]:
    if (
        not isinstance(v, dict)
        or not isinstance(v.get("instance"), str)
        or type(v.get("idle_timeout")) not in (int, float)
        or type(v.get("revision", 0)) is not int
        or type(v.get("max_frame", MAX_FRAME)) is not int
        or v.get("max_frame", MAX_FRAME) < 64
        or not isinstance(v.get("ops", []), list)
        or len(v.get("ops", [])) > 64
        or not all(isinstance(op, str) for op in v.get("ops", []))
    ):
        raise ProtocolError(
            "expected {instance: str, idle_timeout: seconds, revision: int, max_frame: int, "
            "ops: [str]}"
        )
    return v


RESULTS: Final[dict[str, Check]] = {
    "hello": _r_hello,
    "ping": _r_none,
    "set": _r_none,
    "get": _value,
    "try_get": _opt_value,
    "add": _int64,
    "compare_set": _value,
    "wait": _r_none,
    "delete": _r_bool,
    "multi_get": _r_values,
    "multi_set": _r_none,
    "grant_lease": _lease_id,
    "keepalive": _r_none,
    "revoke": _r_none,
    "snapshot": _r_snapshot,
    "watch": _revision,
    "watch_snapshot": _r_snapshot,
    "arrive": _r_arrival,
}


def check_result(op: str, value: Any) -> Any:
    """The value of a successful response to ``op``, validated; :class:`ProtocolError` if not."""
    try:
        return RESULTS[op](value)
    except ProtocolError as e:
        raise ProtocolError(f"bad response to {op}: {e}") from None
