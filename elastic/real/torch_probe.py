"""Whether a torch ``TCPStore`` server listens at an address: torch's wire format, once.

c10d's ``QueryType`` in native byte order: the validation every torch client sends first,
then a ping whose nonce the server echoes.  Used by
:func:`elastic.rendezvous.c10d_rendezvous_backend.create_backend` to join a torch store
already at the endpoint with torch's own client.
"""

from __future__ import annotations

import secrets
import socket
import struct

__all__ = ["answers_torch_ping"]

#: torch's TCPStore wire format (c10d's ``QueryType``, native byte order): the
#: validation every client sends first, then a ping whose nonce the server echoes
_TORCH_VALIDATE = struct.pack("=BI", 0, 0x3C85F7CE)
_TORCH_PING = 13


def answers_torch_ping(host: str, port: int, timeout: float) -> bool:
    """Whether a torch ``TCPStore`` server listens at ``host:port``: one connection, torch's
    validation and a ping; ``True`` only if the nonce comes back within ``timeout``.

    Our own store server takes the bytes for an oversized frame and closes the connection
    at once; nothing listening refuses it at once: either answer costs a round trip."""
    nonce = secrets.randbits(32)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_TORCH_VALIDATE + struct.pack("=BI", _TORCH_PING, nonce))
            reply = b""
            while len(reply) < 4:
                chunk = sock.recv(4 - len(reply))
                if not chunk:
                    return False
                reply += chunk
    except OSError:
        return False
    return bool(struct.unpack("=I", reply)[0] == nonce)
