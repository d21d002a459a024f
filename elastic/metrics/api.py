"""Metric streams, ``configure``, ``put_metric`` and the ``prof`` decorator (torch's API).

Timestamps are wall-clock seconds and the configured handlers are process-wide, as in
torch: this module is a real-mode reporting adapter for users' own metrics.  The agent
reports its metrics through its own :class:`~elastic.metrics.core.AgentMetrics` (its
clock, its handler); in real mode that handler is :class:`ConfiguredMetricHandler`, so a
handler set with :func:`configure` receives the agent's metrics, as in torch.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from elastic.metrics.core import (
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    NullMetricHandler,
)

__all__ = [
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

F = TypeVar("F", bound=Callable[..., Any])


class MetricsConfig:
    __slots__ = ["params"]

    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.params = params if params is not None else {}


# (group, name) -> last value put in this process (an agent's own: AgentMetrics.last_values)
last_values: dict[tuple[str, str], int] = {}


class MetricStream:
    def __init__(self, group_name: str, handler: MetricHandler) -> None:
        self.group_name = group_name
        self.handler = handler

    def add_value(self, metric_name: str, metric_value: int) -> None:
        last_values[(self.group_name, metric_name)] = metric_value
        self.handler.emit(MetricData(time.time(), self.group_name, metric_name, metric_value))


_metrics_map: dict[str, MetricHandler] = {}
_default_metrics_handler: MetricHandler = NullMetricHandler()


def configure(handler: MetricHandler, group: str | None = None) -> None:
    """Send metrics of ``group`` (all groups if None) to ``handler``."""
    global _default_metrics_handler
    if group is None:
        _default_metrics_handler = handler
    else:
        _metrics_map[group] = handler


def getStream(group: str) -> MetricStream:
    return MetricStream(group, _metrics_map.get(group, _default_metrics_handler))


class ConfiguredMetricHandler(MetricHandler):
    """Sends each value to the handler :func:`configure` set for its group at the time
    it is emitted (torch's routing), and keeps it in :data:`last_values`: the real-mode
    agent's default handler."""

    def emit(self, metric_data: MetricData) -> None:
        last_values[(metric_data.group_name, metric_data.name)] = metric_data.value
        _metrics_map.get(metric_data.group_name, _default_metrics_handler).emit(metric_data)


def put_metric(metric_name: str, metric_value: int, metric_group: str = "torchelastic") -> None:
    """Publish one value of ``metric_name`` in ``metric_group``."""
    getStream(metric_group).add_value(metric_name, metric_value)


def publish_metric(metric_group: str, metric_name: str, metric_value: int) -> None:
    """torch's older spelling of :func:`put_metric` (group first), kept for old callers."""
    getStream(metric_group).add_value(metric_name, metric_value)


def get_elapsed_time_ms(start_time_in_seconds: float) -> int:
    """Milliseconds of wall time since ``start_time_in_seconds`` (a ``time.time()``)."""
    return int((time.time() - start_time_in_seconds) * 1000)


def profile(group: str | None = None) -> Callable[[F], F]:
    """torch's older decorator: ``<fn name>.success|failure`` and ``<fn name>.duration.ms``
    in ``group``, keyed by the bare function name (:func:`prof` keys by qualified name).
    Without a group the values go to group ``torchelastic`` (torch's go to a group named
    ``None``, which only the default handler can receive)."""

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            grp = group if group is not None else "torchelastic"
            start = time.time()
            try:
                result = f(*args, **kwargs)
                publish_metric(grp, f"{f.__name__}.success", 1)
            except Exception:
                publish_metric(grp, f"{f.__name__}.failure", 1)
                raise
            finally:
                publish_metric(grp, f"{f.__name__}.duration.ms", get_elapsed_time_ms(start))
            return result

        return cast(F, wrapper)

    return wrap


def initialize_metrics(cfg: MetricsConfig | None = None) -> None:
    """No-op, as in torch (kept for compatibility)."""


def _get_metric_name(fn: Callable[..., Any]) -> str:
    """torch's metric key for ``fn``: its ``__qualname__`` when that names a class
    (``Trainer.step``), else ``<module leaf>.<name>``."""
    qual = fn.__qualname__
    if "." in qual:
        return qual
    return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"


def prof(fn: F | None = None, group: str = "torchelastic") -> Any:
    """Publish ``<key>.success|failure`` and ``<key>.duration.ms`` around a call."""

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = _get_metric_name(f)
            start = time.perf_counter()
            try:
                result = f(*args, **kwargs)
                put_metric(f"{key}.success", 1, group)
            except Exception:
                put_metric(f"{key}.failure", 1, group)
                raise
            finally:
                put_metric(f"{key}.duration.ms", int((time.perf_counter() - start) * 1000), group)
            return result

        return cast(F, wrapper)

    if fn is not None:
        return wrap(fn)
    return wrap
