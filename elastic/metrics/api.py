"""Metric handlers, streams, ``put_metric`` and the ``prof`` decorator (torch's API).

Timestamps are wall-clock seconds: this module is a real-mode reporting adapter (the
simulator records metrics as events on its own clock instead).
"""

from __future__ import annotations

import abc
import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

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

F = TypeVar("F", bound=Callable[..., Any])


class MetricData(NamedTuple):
    timestamp: float
    group_name: str
    name: str
    value: int


class MetricsConfig:
    __slots__ = ["params"]

    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.params = params if params is not None else {}


class MetricHandler(abc.ABC):
    @abc.abstractmethod
    def emit(self, metric_data: MetricData) -> None: ...


class ConsoleMetricHandler(MetricHandler):
    def emit(self, metric_data: MetricData) -> None:
        print(
            f"[{metric_data.timestamp}][{metric_data.group_name}]: "
            f"{metric_data.name}={metric_data.value}"
        )


class NullMetricHandler(MetricHandler):
    def emit(self, metric_data: MetricData) -> None:
        pass


# (group, name) -> last value; read by the health server's /metrics
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


def put_metric(metric_name: str, metric_value: int, metric_group: str = "torchelastic") -> None:
    """Publish one value of ``metric_name`` in ``metric_group``."""
    getStream(metric_group).add_value(metric_name, metric_value)


def initialize_metrics(cfg: MetricsConfig | None = None) -> None:
    """No-op, as in torch (kept for compatibility)."""


def _key(fn: Callable[..., Any]) -> str:
    qual = fn.__qualname__
    if "." in qual:
        return qual
    return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"


def prof(fn: F | None = None, group: str = "torchelastic") -> Any:
    """Publish ``<key>.success|failure`` and ``<key>.duration.ms`` around a call."""

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = _key(f)
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
