"""torch's metrics API (``torch.distributed.elastic.metrics``), same names.

Handlers decide where values go.  The agent reports its own metrics (group
``torchelastic``) through its :class:`~elastic.metrics.core.AgentMetrics`: stamped by
the agent's clock, sent to the agent's handler (in real mode, by default, the one set
with :func:`configure`), last values kept per agent.  Metric names follow torch:
``workers.<role>.remaining_restarts``, ``workers.<role>.<state>``,
``workers.<role>.run_total``, ``workers.<role>.run_success_with_retries`` …

torch's process-wide API (``configure``, ``put_metric``, ``getStream``, ``prof``), which
stamps wall-clock time, lives in :mod:`elastic.metrics.api` and is imported the first
time one of its names is asked for, so the agent's pure core never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elastic.metrics.core import (
    AgentMetrics,
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    NullMetricHandler,
)

if TYPE_CHECKING:
    from elastic.metrics.api import (
        ConfiguredMetricHandler,
        MetricsConfig,
        MetricStream,
        configure,
        get_elapsed_time_ms,
        getStream,
        initialize_metrics,
        last_values,
        prof,
        profile,
        publish_metric,
        put_metric,
    )

__all__ = [
    "AgentMetrics",
    "ConfiguredMetricHandler",
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "MetricStream",
    "MetricsConfig",
    "NullMetricHandler",
    "configure",
    "getStream",
    "get_elapsed_time_ms",
    "initialize_metrics",
    "last_values",
    "prof",
    "profile",
    "publish_metric",
    "put_metric",
]

_TORCH_API = frozenset(
    {
        "ConfiguredMetricHandler",
        "MetricStream",
        "MetricsConfig",
        "configure",
        "getStream",
        "get_elapsed_time_ms",
        "initialize_metrics",
        "last_values",
        "prof",
        "profile",
        "publish_metric",
        "put_metric",
    }
)


def __getattr__(name: str) -> Any:
    """torch's process-wide metrics API, imported the first time one of its names is
    asked for."""
    if name in _TORCH_API:
        from elastic.metrics import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
