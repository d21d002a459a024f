"""Rendezvous: how the agents of a job find each other and agree on ranks.

torch's names (``torch.distributed.elastic.rendezvous``), asynchronous at the core and
given the clock and store ports; torch's synchronous API works on top (see :mod:`.api`).
Backends: ``c10d`` and ``etcd-v2`` (the dynamic rendezvous, :mod:`.dynamic_rendezvous`),
``etcd`` (:mod:`.etcd_rendezvous`), ``static``; see :mod:`.registry`.  torch's
backend-driven construction (``DynamicRendezvousHandler.from_backend`` over a
``RendezvousBackend``: :mod:`.c10d_rendezvous_backend`, :mod:`.etcd_rendezvous_backend`,
or a user's own) runs the same rendezvous over :mod:`.backend_store`.
"""

from typing import Any

from elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousContext,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from elastic.rendezvous.registry import (
    RendezvousHandlerCreator,
    RendezvousHandlerRegistry,
    get_rendezvous_handler,
    rendezvous_handler_registry,
)
from elastic.rendezvous.registry import (
    _register_out_of_tree_handlers as _register_out_of_tree_handlers,
)

__all__ = [
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousContext",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerCreator",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "get_rendezvous_handler",
    "rendezvous_handler_registry",
]


#: submodules reachable as attributes without an import of their own, as torch's
#: package imports them (imported on first use, so importing the package stays light)
_SUBMODULES = frozenset(
    (
        "c10d_rendezvous_backend",
        "dynamic_rendezvous",
        "etcd_rendezvous",
        "etcd_rendezvous_backend",
        "etcd_server",
        "etcd_store",
        "static_tcp_rendezvous",
        "utils",
    )
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
