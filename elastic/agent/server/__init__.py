"""The agent server API (torch's ``torch.distributed.elastic.agent.server``)."""

from elastic._lazy import submodules
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


# torch's package imports these submodules: here they load on first use
__getattr__ = submodules(
    __name__,
    (
        "health_check_server",
        "local_elastic_agent",
    ),
)
