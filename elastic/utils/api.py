"""Environment lookups, a listening socket on a free port, and the ``${local_rank}`` macro.

A real adapter (it opens sockets).  Semantics are torch's: ``get_socket_with_port`` binds
``localhost:0`` with the first address family that works (IPv6 first where the resolver
says so) and returns the socket still listening, so the port stays taken until the caller
closes it.
"""

from __future__ import annotations

import os
import socket

__all__ = ["get_env_variable_or_raise", "get_socket_with_port", "macros"]


def get_env_variable_or_raise(env_name: str) -> str:
    """The value of ``env_name``; ``ValueError`` naming the variable if it is not set."""
    value = os.environ.get(env_name, None)
    if value is None:
        raise ValueError(f"Environment variable {env_name} expected, but not set")
    return value


def get_socket_with_port() -> socket.socket:
    """A TCP socket bound to a free port of ``localhost`` and listening.

    Each address ``localhost`` resolves to is tried in the resolver's order; one whose
    family the host cannot open (no IPv6, say) is skipped.  ``RuntimeError`` if none works.
    """
    addrs = socket.getaddrinfo(
        host="localhost", port=None, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM
    )
    for family, type_, proto, _, _ in addrs:
        try:
            s = socket.socket(family, type_, proto)
        except OSError:
            continue
        try:
            s.bind(("localhost", 0))
            s.listen(0)
        except OSError:
            s.close()
            continue
        return s
    raise RuntimeError("Failed to create a socket")


class macros:
    """Macros a worker's arguments may hold, replaced per worker by :meth:`substitute`.

    ``local_rank``: ``${local_rank}``, the worker's local rank.
    """

    local_rank = "${local_rank}"

    @staticmethod
    def substitute(args: list[object], local_rank: str) -> list[object]:
        """``args`` with every string's ``${local_rank}`` replaced by ``local_rank``."""
        out: list[object] = []
        for arg in args:
            if isinstance(arg, str):
                arg = arg.replace(macros.local_rank, local_rank)
            out.append(arg)
        return out
