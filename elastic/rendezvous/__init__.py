"""Rendezvous: how the agents of a job find each other and agree on ranks.

torch's names (``torch.distributed.elastic.rendezvous``), asynchronous at the core and
given the clock and store ports.  Backends: ``c10d`` (dynamic, :mod:`.dynamic`),
``static``; see :mod:`.registry`.
"""

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
