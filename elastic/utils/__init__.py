"""torch's small helpers (``torch.distributed.elastic.utils``), same names.

:mod:`.api` (environment lookups, a listening socket on a free port, the ``${local_rank}``
macro), :mod:`.distributed` (a free port), :mod:`.logging` (``get_logger``) and
:mod:`.store` (``barrier`` and ``synchronize`` over a torch-style synchronous store, for
programs that use them inside their workers) and :mod:`.gpu_health_check` (NVML health
checks under newer torch's names).  The agent itself uses none of these: its
rendezvous and barriers go through the store port.
"""

from elastic._lazy import submodules
from elastic.utils.api import get_env_variable_or_raise, get_socket_with_port, macros

__all__ = ["get_env_variable_or_raise", "get_socket_with_port", "macros"]


# torch's package imports these submodules: here they load on first use
__getattr__ = submodules(
    __name__,
    (
        "data",
        "distributed",
        "gpu_health_check",
        "log_level",
        "logging",
        "store",
    ),
)
