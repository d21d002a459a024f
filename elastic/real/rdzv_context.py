"""The real ports a rendezvous handler needs when torch's API builds one by itself.

torch's ``get_rendezvous_handler(params)`` and ``DynamicRendezvousHandler.from_backend``
take no ports; in real mode this module supplies them: one process-wide
:class:`~elastic.real.loop_thread.LoopThread` (its ``run`` is every such handler's
``sync_runner``, so torch's blocking calls work from any thread), an
:class:`~elastic.real.clock.AsyncioClock`, and the store.

Stores: an endpoint on this host (``localhost``, ``127.0.0.1``, this host's names, or
no endpoint) is served by one in-process :class:`~elastic.memstore.MemoryStore` per
(backend, endpoint), shared by every handler of this process — a single-node job.  A
network store (another host, or etcd) is the launcher's to build; this module refuses
it in one line rather than pretending.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

from elastic.memstore import MemoryStore
from elastic.real.clock import AsyncioClock
from elastic.real.loop_thread import LoopThread
from elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousContext,
    RendezvousParameters,
)
from elastic.rendezvous.utils import parse_rendezvous_endpoint

__all__ = ["default_context", "node_id", "shared_loop"]

_DEFAULT_PORTS = {"etcd": 2379, "etcd-v2": 2379}
_lock = threading.Lock()
_loop: LoopThread | None = None
_stores: dict[tuple[str, str, int], MemoryStore] = {}
_local_ids = itertools.count()


def shared_loop() -> LoopThread:
    """The process-wide loop thread of torch-style handlers (started on first use)."""
    global _loop
    with _lock:
        if _loop is None or _loop._closed:
            _loop = LoopThread(name="elastic-rdzv")
        return _loop


def node_id(addr: str) -> str:
    """A node id unique in the job: torch's ``addr_pid_localid``."""
    return f"{addr}_{os.getpid()}_{next(_local_ids)}"


def _is_local(host: str) -> bool:
    if host in ("", "localhost", "127.0.0.1", "::1", "0.0.0.0"):
        return True
    names = {socket.gethostname(), socket.getfqdn()}
    if host in names:
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def default_context(params: RendezvousParameters) -> RendezvousContext:
    """Clock, store, node identity and sync runner for ``params``, in real mode."""
    from elastic.launcher.api import fqdn, free_port

    host, port = parse_rendezvous_endpoint(
        params.endpoint, default_port=_DEFAULT_PORTS.get(params.backend, 29400)
    )
    if not _is_local(host):
        raise RendezvousConnectionError(
            f"The rendezvous endpoint '{params.endpoint}' is on another host; "
            "get_rendezvous_handler(params) without ports serves single-node endpoints "
            "only here: launch with `elastic run` (it builds the network store) or pass "
            "store=, clock= and node= to get_rendezvous_handler."
        )
    loop = shared_loop()
    clock = AsyncioClock()
    with _lock:
        key = (params.backend, host, port)
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = MemoryStore(clock)
    addr = params.local_addr or fqdn()
    return RendezvousContext(
        store=store,
        clock=clock,
        node_addr=addr,
        node_id=node_id(addr),
        port_chooser=free_port,
        sync_runner=loop.run,
    )
