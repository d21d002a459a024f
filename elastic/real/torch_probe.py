"""Who listens at a store endpoint: this project's store, or a torch ``TCPStore``.

Used by :func:`elastic.rendezvous.c10d_rendezvous_backend.create_backend` to join a torch
store already at the endpoint with torch's own client.  Our store is asked first (its
``hello``: any frame back means ours), so that our host never sees torch's bytes (it
warns of a torchrun node pointed at the job when it does); only a program that did not
answer is sent torch's validation and a ping (c10d's ``QueryType``, native byte order),
whose nonce a torch server echoes.
"""

from __future__ import annotations

import secrets
import socket
import struct

from elastic.real.netstore_protocol import FrameDecoder, ProtocolError, encode_request

__all__ = ["answers_torch_ping", "speaks_elastic_store"]

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


def speaks_elastic_store(host: str, port: int, timeout: float) -> bool:
    """Whether this project's store server listens at ``host:port``: its ``hello`` (no
    token) gets a frame back within ``timeout`` (a welcome, or the refusal of a store that
    demands a token).  A torch ``TCPStore`` stays silent; nothing listening refuses."""
    decoder = FrameDecoder()
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(encode_request(1, "hello", None))
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                if decoder.feed(chunk):
                    return True
    except (OSError, ProtocolError):
        return False
