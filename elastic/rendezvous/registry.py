"""The registry of rendezvous backends, with torch's names and messages.

A creator is either torch's ``creator(params)`` (it reaches the network itself) or
ours, ``creator(params, ctx)``, handed the ports in a :class:`RendezvousContext` so the
same handler runs in the simulator and for real; the registry calls each with the
arguments it takes.  Without a context (torch's one-argument
``get_rendezvous_handler(params)``), real mode's ports are built by
:func:`elastic.real.rdzv_context.default_context`.

Registered by default: ``c10d`` (the dynamic rendezvous over the store port),
``etcd-v2`` (the same, named for etcd), ``etcd`` (the legacy
:class:`~elastic.rendezvous.etcd_rendezvous.EtcdRendezvousHandler`) and ``static``.
Out-of-tree handlers published under the ``torchrun.handlers`` entry-point group are
registered as in torch (each entry point loads a function returning the creator), when
a backend is first asked for that is not registered rather than at import: reading
the installed packages' metadata costs ~12 ms, and ``elastic run`` with a built-in
backend never needs it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import Callable
from typing import Any

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

log = logging.getLogger(__name__)

#: ``creator(params, ctx)`` (ours) or ``creator(params)`` (torch's).
RendezvousHandlerCreator = Callable[..., RendezvousHandler]


def _takes_context(creator: Callable[..., Any]) -> bool:
    try:
        inspect.signature(creator).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): ours
        return True
    return True


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
        if params.backend not in self._registry and self is rendezvous_handler_registry:
            _register_out_of_tree_handlers()
        try:
            creator = self._registry[params.backend]
        except KeyError:
            raise ValueError(
                f"The rendezvous backend '{params.backend}' is not registered. Did you forget "
                f"to call `{self.register.__name__}`?"
            ) from None
        if not _takes_context(creator):
            handler = creator(params)
        else:
            if ctx is None:
                from elastic.real.rdzv_context import default_context, release

                ctx = default_context(params)
                handler = creator(params, ctx)
                # its shutdown, or else its collection, hands the context's store back
                # (an etcd client no handler holds is closed: elastic.real.rdzv_context)
                _hand_back_when_done(handler, ctx.store, release)
            else:
                handler = creator(params, ctx)
            if ctx.sync_runner is not None and handler.sync_runner is None:
                handler.sync_runner = ctx.sync_runner
        if handler.get_backend() != params.backend:
            raise RuntimeError(
                f"The rendezvous backend '{handler.get_backend()}' does not match the requested "
                f"backend '{params.backend}'."
            )
        return handler


def _hand_back_when_done(
    handler: RendezvousHandler, store: Store, release: Callable[[Store, bool], None]
) -> None:
    """Release ``store`` once: at ``handler.shutdown()`` (closing an etcd client it was
    the last user of), or when the handler is collected without one (closed later)."""
    done: list[bool] = []

    def hand_back(close: bool) -> None:
        if not done:
            done.append(True)
            release(store, close)

    setattr(handler, "_on_shutdown", lambda: hand_back(True))  # noqa: B010
    with contextlib.suppress(TypeError):  # a handler class without weak references
        weakref.finalize(handler, hand_back, False)


rendezvous_handler_registry = RendezvousHandlerRegistry()
#: torch's other name for it in this module
handler_registry = rendezvous_handler_registry


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
    """torch's ``get_rendezvous_handler``; optionally given the ports.

    With ``params`` alone (torch's call) the real ports are built (see the module
    docstring) and torch's blocking methods work at once.  Otherwise either a ``ctx`` or
    all of ``store``, ``clock`` and ``node`` (the node id; ``node_addr`` defaults to
    ``params.local_addr``, then to ``node``).  ``sync_runner`` makes torch's synchronous
    methods (``next_rendezvous()``, ``is_closed()``, …) work on given ports: in real
    mode, :meth:`elastic.real.loop_thread.LoopThread.run` of the loop the clock and store
    live on.  Without it only the ``*_async`` methods may be used.
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
    from elastic.rendezvous.dynamic_rendezvous import create_port_handler

    return create_port_handler(params, ctx)


def _create_static(params: RendezvousParameters, ctx: RendezvousContext) -> RendezvousHandler:
    # Imported when used: the static handler lives in its own module.
    from elastic.rendezvous.static import create_static_handler  # type: ignore[import-not-found,unused-ignore]

    handler: RendezvousHandler = create_static_handler(params, ctx)
    return handler


def _create_etcd_v2(params: RendezvousParameters, ctx: RendezvousContext) -> RendezvousHandler:
    # torch builds a DynamicRendezvousHandler over an etcd backend; ours runs the same
    # handler over the store (etcd's watches and leases) instead of one polled blob.
    from elastic.rendezvous.dynamic_rendezvous import create_port_handler

    return create_port_handler(params, ctx)


def _create_etcd(params: RendezvousParameters, ctx: RendezvousContext) -> RendezvousHandler:
    from elastic.rendezvous.etcd_rendezvous import create_rdzv_handler

    return create_rdzv_handler(params, ctx)


def _register_default_handlers() -> None:
    rendezvous_handler_registry.register("c10d", _create_c10d)
    rendezvous_handler_registry.register("static", _create_static)
    rendezvous_handler_registry.register("etcd", _create_etcd)
    rendezvous_handler_registry.register("etcd-v2", _create_etcd_v2)


def _register_out_of_tree_handlers() -> None:
    """Register the creators published under the ``torchrun.handlers`` entry points.

    As torch: an entry point loads a function that returns the creator; a plugin that
    fails to load is logged and skipped.
    """
    from importlib.metadata import entry_points

    for ep in entry_points(group="torchrun.handlers"):
        if ep.name in rendezvous_handler_registry._registry:
            continue  # found by an earlier scan (a scan runs again for new plugins)
        try:
            rendezvous_handler_registry.register(ep.name, ep.load()())
        except Exception:
            log.warning(
                "Exception while registering out of tree plugin %s: ", ep.name, exc_info=True
            )


_register_default_handlers()


def __getattr__(name: str) -> Any:
    # torch's module re-exports dynamic_rendezvous.create_handler (imported on first use:
    # that module imports this one)
    if name == "create_handler":
        from elastic.rendezvous.dynamic_rendezvous import create_handler

        return create_handler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
