"""The registry of rendezvous backends, with torch's names and messages.

torch's creators take only :class:`RendezvousParameters` and reach the network
themselves; ours are handed the ports in a :class:`RendezvousContext`, so the same
handler runs in the simulator and for real.  Registered by default: ``c10d`` (the
dynamic rendezvous), ``static`` (fixed world), and ``etcd``/``etcd-v2`` (the dynamic
rendezvous over an etcd v3 store).
"""

from __future__ import annotations

from collections.abc import Callable

from elastic.clock import Clock
from elastic.rendezvous.api import (
    RendezvousContext,
    RendezvousHandler,
    RendezvousParameters,
    SyncRunner,
)
from elastic.store import Store

__all__ = [
    "RendezvousHandlerCreator",
    "RendezvousHandlerRegistry",
    "get_rendezvous_handler",
    "rendezvous_handler_registry",
]

RendezvousHandlerCreator = Callable[[RendezvousParameters, RendezvousContext], RendezvousHandler]


class RendezvousHandlerRegistry:
    """Represents a registry of :class:`RendezvousHandler` backends."""

    def __init__(self) -> None:
        self._registry: dict[str, RendezvousHandlerCreator] = {}

    def register(self, backend: str, creator: RendezvousHandlerCreator) -> None:
        """Register ``creator`` for ``backend``; the same creator twice is fine."""
        if not backend:
            raise ValueError("The rendezvous backend name must be a non-empty string.")
        current = self._registry.get(backend)
        if current is not None and current != creator:
            raise ValueError(
                f"The rendezvous backend '{backend}' cannot be registered with '{creator}' as it "
                f"is already registered with '{current}'."
            )
        self._registry[backend] = creator

    def create_handler(
        self, params: RendezvousParameters, ctx: RendezvousContext | None = None
    ) -> RendezvousHandler:
        """Create the handler of ``params.backend`` on the ports in ``ctx``."""
        try:
            creator = self._registry[params.backend]
        except KeyError:
            raise ValueError(
                f"The rendezvous backend '{params.backend}' is not registered. Did you forget "
                f"to call `{self.register.__name__}`?"
            ) from None
        if ctx is None:
            raise ValueError(
                f"The rendezvous backend '{params.backend}' needs the clock and store ports: "
                "pass a RendezvousContext (or store=, clock= and node= to "
                "get_rendezvous_handler)."
            )
        handler = creator(params, ctx)
        if handler.get_backend() != params.backend:
            raise RuntimeError(
                f"The rendezvous backend '{handler.get_backend()}' does not match the requested "
                f"backend '{params.backend}'."
            )
        return handler


rendezvous_handler_registry = RendezvousHandlerRegistry()


def get_rendezvous_handler(
    params: RendezvousParameters,
    ctx: RendezvousContext | None = None,
    *,
    store: Store | None = None,
    clock: Clock | None = None,
    node: str | None = None,
    node_addr: str | None = None,
    sync_runner: SyncRunner | None = None,
) -> RendezvousHandler:
    """torch's ``get_rendezvous_handler``, given the ports.

    Either a ``ctx`` or all of ``store``, ``clock`` and ``node`` (the node id;
    ``node_addr`` defaults to ``params.local_addr``, then to ``node``).  ``sync_runner``
    makes torch's synchronous methods (``next_rendezvous()``, ``is_closed()``, …) work:
    in real mode, :meth:`elastic.real.loop_thread.LoopThread.run` of the loop the clock
    and store live on.  Without it only the ``*_async`` methods may be used.
    """
    if ctx is None and (store is not None or clock is not None or node is not None):
        if store is None or clock is None or node is None:
            raise ValueError("get_rendezvous_handler needs all of store=, clock= and node=.")
        addr = node_addr or params.local_addr or node
        ctx = RendezvousContext(store=store, clock=clock, node_addr=addr, node_id=node)
    handler = rendezvous_handler_registry.create_handler(params, ctx)
    if sync_runner is not None:
        handler.sync_runner = sync_runner
    return handler


def _create_c10d(params: RendezvousParameters, ctx: RendezvousContext) -> RendezvousHandler:
    from elastic.rendezvous.dynamic import create_handler

    return create_handler(params, ctx)


def _create_static(params: RendezvousParameters, ctx: RendezvousContext) -> RendezvousHandler:
    # Imported when used: the static handler lives in its own module.
    from elastic.rendezvous.static import create_static_handler  # type: ignore[import-not-found,unused-ignore]

    handler: RendezvousHandler = create_static_handler(params, ctx)
    return handler


def _create_etcd(params: RendezvousParameters, ctx: RendezvousContext) -> RendezvousHandler:
    # torch's etcd-v2 is the dynamic rendezvous over etcd; its legacy "etcd" handler is a
    # different protocol on etcd's v2 API, which current etcd no longer serves: both names
    # run the dynamic rendezvous over the etcd v3 store the launcher opened (ctx.store)
    from elastic.rendezvous.dynamic import create_handler

    return create_handler(params, ctx)


def _register_default_handlers() -> None:
    rendezvous_handler_registry.register("c10d", _create_c10d)
    rendezvous_handler_registry.register("static", _create_static)
    rendezvous_handler_registry.register("etcd", _create_etcd)
    rendezvous_handler_registry.register("etcd-v2", _create_etcd)


_register_default_handlers()
