"""Identifiers a launch needs, without the imports the standard library's ways cost.

Random identifiers in :mod:`uuid`'s formats, without importing :mod:`uuid`.

``import uuid`` also imports :mod:`platform` and the ``_uuid`` extension (≈2.5 ms, a
measurable share of ``elastic run``'s launch time); version-4 UUIDs need neither, only
16 random bytes from the kernel.  The values are exactly what ``uuid.uuid4()`` gives:
version 4, RFC 4122 variant (pinned by ``tests/test_ids.py`` against :mod:`uuid`).

This host's fully qualified name as :func:`socket.getfqdn` gives it (torch's
``MASTER_ADDR`` and node address), without the ``idna`` codec: ``getfqdn`` passes the
name to ``gethostbyaddr`` as text, which encodes it with ``idna`` and so imports
``encodings.idna``, ``stringprep`` and ``unicodedata`` (≈2 ms); an ASCII host name
passed as bytes is the same query.
"""

from __future__ import annotations

import os
import socket

__all__ = ["fqdn", "uuid4_hex", "uuid4_int", "uuid4_str"]


def uuid4_int() -> int:
    """``uuid.uuid4().int``: 128 random bits with the version and variant bits set."""
    n = int.from_bytes(os.urandom(16), "big")
    n &= ~(0xC000 << 48)
    n |= 0x8000 << 48  # variant: RFC 4122
    n &= ~(0xF000 << 64)
    n |= 4 << 76  # version 4
    return n


def uuid4_hex() -> str:
    """``uuid.uuid4().hex``: 32 lowercase hex digits."""
    return f"{uuid4_int():032x}"


def uuid4_str() -> str:
    """``str(uuid.uuid4())``: ``8-4-4-4-12`` hex digits."""
    h = uuid4_hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def fqdn() -> str:
    """``socket.getfqdn()``: the first dotted name of this host, else its primary name."""
    name = socket.gethostname()
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:  # an internationalised host name: the codec is needed
        return socket.getfqdn(name)
    try:
        # CPython parses the argument with "et": bytes are taken as they are (typeshed says str)
        hostname, aliases, _ = socket.gethostbyaddr(raw)  # type: ignore[arg-type]
    except OSError:
        return name
    return next((n for n in [hostname, *aliases] if "." in n), hostname)
