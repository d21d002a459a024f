"""The real ports a rendezvous handler needs when torch's API builds one by itself.

torch's ``get_rendezvous_handler(params)`` and ``DynamicRendezvousHandler.from_backend``
take no ports; in real mode this module supplies them: one process-wide
:class:`~elastic.real.loop_thread.LoopThread` (its ``run`` is every such handler's
``sync_runner``, so torch's blocking calls work from any thread), an
:class:`~elastic.real.clock.AsyncioClock`, and the store.

Stores: a one-node job (``max_nodes == 1``, ``c10d`` or ``static``, an endpoint on
this host) is served by one in-process :class:`~elastic.memstore.MemoryStore` per
(backend, endpoint), shared by every handler of this process.  Anything else gets the
store ``elastic run`` would open (:func:`elastic.real.rdzv_store.open_rendezvous_store`:
the agent-hosted network store for ``c10d``/``static``, hosted by this process when the
endpoint names this machine and its port is free; etcd for ``etcd``/``etcd-v2``), opened
on the shared loop once per (backend, endpoint) and kept for the life of the process --
except an etcd client: when the last handler the registry built on it shuts down
(:func:`release`), it is closed, so that a later fork of this process (torch's tests
start agents with ``multiprocessing``'s fork) can use gRPC; the next handler connects
again.  A store also reached any other way (``create_backend``, a handler never shut
down) is never counted out, and stays open as before.
"""

from __future__ import annotations

import gc
import logging
import os
import threading

from elastic.errors import StoreError
from elastic.memstore import MemoryStore
from elastic.real.clock import AsyncioClock
from elastic.real.home_loop_store import HomeLoopStore
from elastic.real.loop_thread import LoopThread
from elastic.real.rdzv_store import RendezvousStore, _resolve, linger, matches_this_machine
from elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousContext,
    RendezvousParameters,
)
from elastic.rendezvous.utils import parse_rendezvous_endpoint
from elastic.store import Store

__all__ = ["default_context", "node_id", "release", "shared_loop"]

logger = logging.getLogger(__name__)

_DEFAULT_PORTS = {"etcd": 2379, "etcd-v2": 2379}
_lock = threading.Lock()
_loop: LoopThread | None = None
_stores: dict[tuple[str, str, int], Store] = {}
#: per cached store: how many users took it (default_context) and have not released it
_users: dict[tuple[str, str, int], int] = {}
#: the opened etcd stores, to close (the cache holds their HomeLoopStore)
_opened: dict[tuple[str, str, int], object] = {}


_set_aside: list[object] = []  # what a forked child inherited: never touched


def _after_fork_in_child() -> None:
    # the loop's thread does not exist in a child forked without exec, and the lock may
    # have been held by a thread of the parent: a new loop starts on next use (the old
    # one stays referenced, never closed: closing would wait for the missing thread)
    # the stores opened here belong to the parent (their loop is the old one, and an
    # in-memory one is the parent's memory): the child opens its own on first use
    global _lock, _loop
    if _loop is not None:
        _set_aside.append(_loop)
    _loop = None
    _lock = threading.Lock()
    _set_aside.extend(_stores.values())
    _set_aside.extend(_opened.values())
    _stores.clear()
    _users.clear()
    _opened.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def shared_loop() -> LoopThread:
    """The process-wide loop thread of torch-style handlers (started on first use)."""
    global _loop
    with _lock:
        if _loop is None or _loop._closed:
            _loop = LoopThread(name="elastic-rdzv")
        return _loop


def node_id(addr: str) -> str:
    """A node id unique in the job: torch's ``addr_pid_localid``, from the process's one
    generator (``DynamicRendezvousHandler._node_desc_generator``, as torch's)."""
    from elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    return repr(DynamicRendezvousHandler._node_desc_generator.generate(addr))


def default_context(params: RendezvousParameters) -> RendezvousContext:
    """Clock, store, node identity and sync runner for ``params``, in real mode."""
    from elastic.launcher.api import fqdn, free_port

    host, port = parse_rendezvous_endpoint(
        params.endpoint, default_port=_DEFAULT_PORTS.get(params.backend, 29400)
    )
    if host not in ("", "0.0.0.0", "::") and not matches_this_machine(host) and not _resolve(host):
        # torch's store fails on a name that does not resolve, even for one node
        raise RendezvousConnectionError(
            f"The rendezvous endpoint '{params.endpoint}' ({params.backend}) names no host "
            f"this machine can resolve: {host!r}"
        )
    loop = shared_loop()
    clock = AsyncioClock()
    in_process = (
        params.max_nodes <= 1
        and params.backend in ("c10d", "static")
        and (host in ("", "0.0.0.0") or matches_this_machine(host))
        # is_host=false: a store someone else hosts, reached over the network as torch's is
        and params.get_as_bool("is_host") is not False
    )
    with _lock:
        key = (params.backend, host, port)
        store = _stores.get(key)
        if store is None and in_process:
            # an in-memory store is bound to no loop (its waits are futures of the loop
            # that awaits them): used as it is, from the agent's loop or the shared one
            store = _stores[key] = MemoryStore(clock)
    if store is None:
        from elastic.real.rdzv_store import open_rendezvous_store

        try:
            opened = loop.run(
                open_rendezvous_store(
                    params.backend, params.endpoint, params.max_nodes, params.config, clock
                )
            )
        except (OSError, TimeoutError, StoreError) as e:
            raise RendezvousConnectionError(
                f"The rendezvous store at '{params.endpoint}' ({params.backend}) cannot be "
                f"reached: {e}"
            ) from None
        with _lock:
            # usable from any loop: torch's agent.run() drives the handler from its own
            store = _stores.get(key)
            if store is None:
                store = _stores[key] = HomeLoopStore(opened.store, loop.loop)
                if params.backend in ("etcd", "etcd-v2"):
                    _opened[key] = opened
                    _hook_fork()
                if opened.hosting:
                    _linger_at_exit(opened, loop, linger(params.config))
            else:  # another thread opened it meanwhile: this one is not needed
                _set_aside.append(opened)
    with _lock:
        _users[key] = _users.get(key, 0) + 1
    addr = params.local_addr or fqdn()
    return RendezvousContext(
        store=store,
        clock=clock,
        node_addr=addr,
        node_id=node_id(addr),
        port_chooser=free_port,
        sync_runner=loop.run,
    )


def _linger_at_exit(opened: RendezvousStore, loop: LoopThread, seconds: float) -> None:
    """A store this process hosts stays up when the process exits until every other
    agent has disconnected, at most ``seconds`` (the rendezvous' ``close_timeout``), as
    ``elastic run``'s does: a host whose agent finished first must not take the store
    from the others' exit barrier, close and leave (torch's TCPStore goes with its
    process, and the others' shutdown fails).  Run by ``multiprocessing``'s exit
    function, which a ``multiprocessing`` child runs too (it skips ``atexit``); only in
    the process that opened it (a fork's copy is the parent's)."""
    from multiprocessing import util

    owner = os.getpid()

    def close() -> None:
        if os.getpid() != owner or loop._closed:
            return
        try:
            loop.run(opened.aclose(linger=seconds))
        except Exception as e:  # best effort, at exit
            logger.debug("closing the hosted rendezvous store failed: %s", e)

    util.Finalize(None, close, exitpriority=10)


def release(store: Store, close: bool = True) -> None:
    """One user of the cached ``store`` is done with it: a handler the registry built
    shut down (``close``: the last user of an etcd client closes it now, on the shared
    loop, blocking the calling thread), or was collected without a shutdown (not
    ``close``: nothing blocks in a finalizer; an idle client is closed before the next
    fork instead, :func:`_close_idle_before_fork`)."""
    with _lock:
        key = next((k for k, s in _stores.items() if s is store), None)
        if key is None:
            return
        _users[key] = _users.get(key, 1) - 1
        if not close or _users[key] > 0 or key not in _opened:
            return
        opened = _opened.pop(key)
        del _stores[key], _users[key]
    _close(opened)


def _close(opened: object) -> None:
    close = getattr(opened, "aclose", None)
    if close is None:
        return
    try:
        shared_loop().run(close())
    except Exception as e:  # closing is best effort: the store may be gone already
        logger.debug("closing the etcd client failed: %s", e)


def _close_idle_before_fork() -> None:
    """Before this process forks: close every cached etcd client no handler holds any
    more (one collected without a shutdown -- torch's tests drop their agents so), so
    that the child can use gRPC.  The collector runs first, to let such handlers go."""
    if not _opened or (_loop is not None and threading.current_thread() is _loop._thread):
        return
    gc.collect()
    with _lock:
        idle = [k for k in _opened if _users.get(k, 0) <= 0]
        closing = [_opened.pop(k) for k in idle]
        for k in idle:
            _stores.pop(k, None)
            _users.pop(k, None)
    for opened in closing:
        _close(opened)


_fork_hook = False


def _hook_fork() -> None:
    """Register :func:`_close_idle_before_fork` (once, when the first etcd client is
    cached: after the etcd module's own hook, so that it runs before it)."""
    global _fork_hook
    if not _fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_close_idle_before_fork)
        _fork_hook = True
