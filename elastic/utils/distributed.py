"""torch's ``torch.distributed.elastic.utils.distributed``: a free port, and a torch
``TCPStore`` made the way torch's launcher helpers make it (:func:`create_c10d_store`).

:func:`create_c10d_store` returns torch's own store, so it needs torch (imported when it is
called; elastic's agent never calls it, its store is :mod:`elastic.real.netstore`).  What
it raises, as torch 2.13 does:

* ``ValueError`` for ``server_port=-1`` with ``world_size > 1`` (the others could not
  find the server);
* a store that timed out -- the server waiting for its clients, a client connecting, or
  the wait for all ``world_size`` members -- raises an error that is both torch's own
  (``DistStoreError``/``DistNetworkError``, so a ``RuntimeError``, what torch 2.13
  raises) and ``TimeoutError`` (what torch's code and tests mean it to be);
* a server whose port is taken: with ``server_port=-1`` another free port is tried, up to
  ``retries`` attempts in all; then, or at once for a port given, an error of torch's
  type that is also an ``OSError`` (as torch's tests expect), saying
  ``on <addr>, port: <port> already in use``.

Unlike torch 2.13, a client keeps to ``timeout`` when something at the address accepts
the connection and never answers (a listening socket that is not a TCPStore: torch's
client then waits for ever, whatever its timeout).  The client is made in a thread of its
own; if it is neither made nor failed by ``2 x timeout + 5`` seconds (torch's client
tries twice, each for up to ``timeout``, and raises its own error well before then),
:class:`TimeoutError` is raised, saying so, and the thread is left to end when the other
side closes the connection (it holds nothing of the caller's).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from elastic.utils.api import get_socket_with_port
from elastic.utils.store import barrier

__all__ = ["create_c10d_store", "get_free_port", "get_socket_with_port"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: the barrier every member passes once the store is up (torch's key prefix)
_MEMBERS_KEY_PREFIX = "_tcp_store/num_members"

#: (torch's error type, the builtin one mixed in) -> their common subclass
_MIXED_TYPES: dict[tuple[type[BaseException], type[OSError]], type[BaseException]] = {}


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


def _torch_distributed() -> Any:
    try:
        import torch.distributed as dist
    except ImportError as e:
        raise ImportError(
            f"elastic.utils.distributed.create_c10d_store makes a torch TCPStore: install "
            f"torch to use it, or use elastic's own store (elastic.real.netstore) ({e})"
        ) from e
    return dist


def _timed_out(err: BaseException) -> bool:
    text = str(err).lower()
    return "timed out" in text or "timeout" in text


def _address_in_use(err: BaseException) -> bool:
    text = str(err).lower()
    return "address already in use" in text or "eaddrinuse" in text


def _also(err: BaseException, builtin: type[OSError], suffix: str, message: str) -> BaseException:
    """``message`` in an error that is both of ``err``'s type (torch's) and ``builtin``.

    torch 2.13 raises its own ``RuntimeError`` subclasses where its code and tests expect
    ``TimeoutError`` or an ``OSError``; an instance of both satisfies either caller.
    """
    base = type(err)
    cls = _MIXED_TYPES.get((base, builtin))
    if cls is None:
        name = base.__name__.removesuffix("Error") + suffix
        try:
            cls = type(name, (builtin, base), {"__module__": __name__})
        except TypeError:  # a base whose layout cannot mix with OSError's
            cls = builtin
        _MIXED_TYPES[(base, builtin)] = cls
    return cls(message)


#: how long past twice its ``timeout`` a client is given to raise torch's own error
_CLIENT_GRACE = 5.0


def _within(make: Callable[[], _T], timeout: float, where: str) -> _T:
    """``make()`` (a TCPStore client), or :class:`TimeoutError` once twice ``timeout``
    and :data:`_CLIENT_GRACE` have passed without it (see the module docstring)."""
    made: list[_T] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            made.append(make())
        except BaseException as e:  # handed to the caller below
            failed.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name=f"tcpstore-client {where}", daemon=True).start()
    limit = 2 * timeout + _CLIENT_GRACE
    if not done.wait(limit):
        raise TimeoutError(
            f"no TCPStore answered at {where} in {limit:g}s (twice the timeout of "
            f"{timeout:g}s and {_CLIENT_GRACE:g}s): something there accepted the connection "
            f"and did not answer (not a TCPStore, or stuck)"
        )
    if failed:
        raise failed[0]
    return made[0]


def create_c10d_store(
    is_server: bool,
    server_addr: str,
    server_port: int = -1,
    world_size: int = 1,
    timeout: float = 60 * 10,
    wait_for_workers: bool = True,
    retries: int = 3,
    use_libuv: bool | None = None,
) -> Any:
    """torch's ``TCPStore`` on ``server_addr:server_port``, the server if ``is_server``.

    ``server_port=-1``: a free port of this host (a server alone, ``world_size`` 1).
    ``timeout`` is in seconds.  With ``wait_for_workers``, returns once all ``world_size``
    members have created theirs.  ``use_libuv`` is ignored (torch's deprecation): the
    ``USE_LIBUV`` environment variable chooses, libuv unless it is ``"0"``.  See the
    module docstring for the errors.
    """
    dist = _torch_distributed()
    if use_libuv is not None:
        logger.warning(
            "argument use_libuv is deprecated and ignored; set the USE_LIBUV environment "
            'variable to "0" to disable libuv or "1" to enable it (the default)'
        )
    libuv = os.environ.get("USE_LIBUV", "1") == "1"
    if server_port == -1 and world_size > 1:
        raise ValueError(
            f"server_port must be specified when world_size > 1, got server_port={server_port}, "
            f"world_size={world_size}"
        )
    attempt = 1
    while True:
        port = server_port if server_port != -1 else get_free_port()
        logger.info(
            "Creating c10d store on %s:%s (world_size %s, is_server %s, timeout %ss, libuv %s)",
            server_addr,
            port,
            world_size,
            is_server,
            timeout,
            libuv,
        )

        def make(port: int = port) -> Any:
            return dist.TCPStore(
                host_name=server_addr,
                port=port,
                world_size=world_size,
                is_master=is_server,
                timeout=timedelta(seconds=timeout),
                wait_for_workers=wait_for_workers,
                use_libuv=libuv,
            )

        try:
            store = make() if is_server else _within(make, timeout, f"{server_addr}:{port}")
        except RuntimeError as e:
            if _address_in_use(e):
                if server_port == -1 and attempt < retries:
                    logger.warning(
                        "port %s already in use, attempt [%s/%s]", port, attempt, retries
                    )
                    attempt += 1
                    continue
                message = f"on {server_addr}, port: {port} already in use"
                raise _also(e, OSError, "AddressInUseError", message) from e
            if _timed_out(e):
                raise _also(e, TimeoutError, "TimeoutError", str(e)) from e
            raise
        if wait_for_workers:
            try:
                barrier(store, world_size, _MEMBERS_KEY_PREFIX, barrier_timeout=timeout)
            except RuntimeError as e:
                if _timed_out(e):
                    message = f"timed out waiting for all {world_size} members to join"
                    raise _also(e, TimeoutError, "TimeoutError", message) from e
                raise
        logger.info("Successfully created c10d store")
        return store
