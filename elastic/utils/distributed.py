"""A free port (torch's ``torch.distributed.elastic.utils.distributed.get_free_port``).

torch's ``create_c10d_store`` is not here: it builds a torch ``TCPStore``, and ``elastic``
does not depend on torch (its store is :mod:`elastic.real.netstore`).
"""

from __future__ import annotations

from elastic.utils.api import get_socket_with_port

__all__ = ["get_free_port", "get_socket_with_port"]


def get_free_port() -> int:
    """A TCP port of ``localhost`` that was free a moment ago.

    The socket that found it is closed before returning, so another process may take the
    port first; hold :func:`get_socket_with_port`'s socket instead where that matters.
    """
    sock = get_socket_with_port()
    try:
        port: int = sock.getsockname()[1]
    finally:
        sock.close()
    return port
