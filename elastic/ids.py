"""Random identifiers in :mod:`uuid`'s formats, without importing :mod:`uuid`.

``import uuid`` also imports :mod:`platform` and the ``_uuid`` extension (≈2.5 ms, a
measurable share of ``elastic run``'s launch time); version-4 UUIDs need neither, only
16 random bytes from the kernel.  The values are exactly what ``uuid.uuid4()`` gives:
version 4, RFC 4122 variant (pinned by ``tests/test_ids.py`` against :mod:`uuid`).
"""

from __future__ import annotations

import os

__all__ = ["uuid4_hex", "uuid4_int", "uuid4_str"]


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
