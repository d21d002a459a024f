"""The agent server API (torch's ``torch.distributed.elastic.agent.server``)."""

from typing import Any

from elastic.agent.server.api import (
    DEFAULT_ROLE,
    ElasticAgent,
    HealthWatch,
    RunResult,
    SimpleElasticAgent,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerStartRefused,
    WorkerState,
)

TORCHELASTIC_ENABLE_FILE_TIMER = "TORCHELASTIC_ENABLE_FILE_TIMER"
TORCHELASTIC_TIMER_FILE = "TORCHELASTIC_TIMER_FILE"

__all__ = [
    "DEFAULT_ROLE",
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_TIMER_FILE",
    "ElasticAgent",
    "HealthWatch",
    "RunResult",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerStartRefused",
    "WorkerState",
]


#: submodules reachable as attributes without an import of their own, as torch's
#: package imports them (imported on first use, so importing the package stays light)
_SUBMODULES = frozenset(
    (
        "health_check_server",
        "local_elastic_agent",
    )
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
