"""torch's metrics API (``torch.distributed.elastic.metrics``), same names.

The agent reports with :func:`put_metric` (group ``torchelastic``); handlers decide
where values go.  Metric names follow torch: ``workers.<role>.remaining_restarts``,
``workers.<role>.<state>``, ``workers.<role>.run_total``, ``workers.<role>.
run_success_with_retries`` …  Besides the configured handler, the last value of every
metric is kept in :data:`last_values` so the health server can serve ``/metrics``.
"""

from elastic.metrics.api import (
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    MetricsConfig,
    MetricStream,
    NullMetricHandler,
    configure,
    getStream,
    initialize_metrics,
    last_values,
    prof,
    put_metric,
)

__all__ = [
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "MetricStream",
    "MetricsConfig",
    "NullMetricHandler",
    "configure",
    "getStream",
    "initialize_metrics",
    "last_values",
    "prof",
    "put_metric",
]
