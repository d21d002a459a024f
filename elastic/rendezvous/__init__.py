"""Rendezvous: how the agents of a job find each other and agree on ranks.

torch's names (``torch.distributed.elastic.rendezvous``), asynchronous at the core and
given the clock and store ports; torch's synchronous API works on top (see :mod:`.api`).
Backends: ``c10d`` and ``etcd-v2`` (the dynamic rendezvous, :mod:`.dynamic_rendezvous`),
``etcd`` (:mod:`.etcd_rendezvous`), ``static``; see :mod:`.registry`.  torch's
backend-driven construction (``DynamicRendezvousHandler.from_backend`` over a
``RendezvousBackend``: :mod:`.c10d_rendezvous_backend`, :mod:`.etcd_rendezvous_backend`,
or a user's own) runs the same rendezvous over :mod:`.backend_store`.
"""

from elastic._lazy import submodules
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


# torch's package imports these submodules: here they load on first use
__getattr__ = submodules(
    __name__,
    (
        "c10d_rendezvous_backend",
        "dynamic_rendezvous",
        "etcd_rendezvous",
        "etcd_rendezvous_backend",
        "etcd_server",
        "etcd_store",
        "static_tcp_rendezvous",
        "utils",
    ),
)
