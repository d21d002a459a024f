"""torch's small helpers (``torch.distributed.elastic.utils``), same names.

:mod:`.api` (environment lookups, a listening socket on a free port, the ``${local_rank}``
macro), :mod:`.distributed` (a free port), :mod:`.logging` (``get_logger``) and
:mod:`.store` (``barrier`` and ``synchronize`` over a torch-style synchronous store, for
programs that use them inside their workers).  The agent itself uses none of these: its
rendezvous and barriers go through the store port.
"""

from typing import Any

from elastic.utils.api import get_env_variable_or_raise, get_socket_with_port, macros

__all__ = ["get_env_variable_or_raise", "get_socket_with_port", "macros"]


#: submodules reachable as attributes without an import of their own, as torch's
#: package imports them (imported on first use, so importing the package stays light)
_SUBMODULES = frozenset(
    (
        "data",
        "distributed",
        "log_level",
        "logging",
        "store",
    )
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
