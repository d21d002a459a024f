"""Starting, watching and logging worker processes (torch's ``elastic.multiprocessing``).

The process launcher itself is the real workers port,
:class:`elastic.real.workers.ProcessWorkers`; this package holds what torch users touch:
the log layout (:mod:`.api`), torch's process contexts (``start_processes``,
``PContext``, ``RunProcsResult``: :mod:`.pcontext`), the console tee (:mod:`.tail`) and
error files (:mod:`.errors`).  The process contexts and ``ProcessFailure`` are imported
on first use: ``elastic run`` imports this package and never needs them.
"""

from typing import TYPE_CHECKING, Any

from elastic.multiprocessing.api import (
    DefaultLogsSpecs,
    LogsDest,
    LogsSpecs,
    SignalException,
    Std,
    to_map,
)

if TYPE_CHECKING:
    from elastic.multiprocessing.errors import ProcessFailure
    from elastic.multiprocessing.pcontext import (
        MultiprocessContext,
        PContext,
        RunProcsResult,
        SubprocessContext,
        start_processes,
    )

__all__ = [
    "DefaultLogsSpecs",
    "LogsDest",
    "LogsSpecs",
    "MultiprocessContext",
    "PContext",
    "ProcessFailure",
    "RunProcsResult",
    "SignalException",
    "Std",
    "SubprocessContext",
    "start_processes",
    "to_map",
]

_LAZY = {
    "MultiprocessContext": "elastic.multiprocessing.pcontext",
    "PContext": "elastic.multiprocessing.pcontext",
    "RunProcsResult": "elastic.multiprocessing.pcontext",
    "SubprocessContext": "elastic.multiprocessing.pcontext",
    "start_processes": "elastic.multiprocessing.pcontext",
    "ProcessFailure": "elastic.multiprocessing.errors",
}


#: submodules reachable as attributes without an import of their own, as torch's package
#: imports them
_SUBMODULES = frozenset(("errors", "pcontext", "redirects", "subprocess_handler", "tail_log"))


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
