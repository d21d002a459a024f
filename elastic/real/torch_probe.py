"""Who listens at a store endpoint: this project's store, or a torch ``TCPStore``.

Used by :func:`elastic.rendezvous.c10d_rendezvous_backend.create_backend` to join a torch
store already at the endpoint with torch's own client.  Our store is asked first (its
``hello``: any frame back means ours), so that our host never sees torch's bytes (it
warns of a torchrun node pointed at the job when it does); only a program that took the
connection and did not answer is sent torch's validation and a ping (c10d's
``QueryType``, native byte order), whose nonce a torch server echoes.  An endpoint that
takes no connection is asked nothing more.
"""

from __future__ import annotations

import secrets
import socket
import struct
from typing import Literal

from elastic.real.netstore_protocol import FrameDecoder, ProtocolError, encode_request

__all__ = ["answers_torch_ping", "who_listens"]

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


def who_listens(host: str, port: int, timeout: float) -> Literal["elastic", "other", "none"]:
    """Who listens at ``host:port``, asked with this project's ``hello`` (no token):

    * ``"elastic"``: a frame came back within ``timeout`` (a welcome, or the refusal of a
      store that demands a token): this project's store;
    * ``"other"``: the connection was taken but no frame came (a torch ``TCPStore`` stays
      silent or hangs up): worth asking in torch's words;
    * ``"none"``: no connection (refused, unreachable, or not within ``timeout``).
    """
    decoder = FrameDecoder()
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return "none"
    with sock:
        try:
            sock.settimeout(timeout)
            sock.sendall(encode_request(1, "hello", None))
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    return "other"
                if decoder.feed(chunk):
                    return "elastic"
        except (OSError, ProtocolError):
            return "other"
