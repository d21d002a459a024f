"""The metrics values and handlers (torch's names), and one agent's own metrics.

Nothing here reads a clock or holds state shared between agents: :class:`AgentMetrics`
takes its agent's clock (``now``) and handler, and keeps its own last values, so the 512
agents of a simulation each stamp their metrics with simulated time and none sees
another's.  torch's process-wide API (``configure``, ``put_metric``, ``getStream``,
``prof``), which stamps wall-clock time, is in :mod:`elastic.metrics.api`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import NamedTuple

__all__ = [
    "AGENT_GROUP",
    "AgentMetrics",
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "NullMetricHandler",
]

#: the metric group the agent reports in (torch's)
AGENT_GROUP = "torchelastic"


class MetricData(NamedTuple):
    timestamp: float
    group_name: str
    name: str
    value: int


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


class AgentMetrics:
    """One agent's metrics: stamped by its clock, sent to its handler, its last values.

    ``now`` is the agent's clock (simulated time in the simulator; in real mode the
    monotonic clock its events are stamped with).  ``last_values`` maps a metric's name to
    the last value this agent put.
    """

    __slots__ = ("group", "handler", "last_values", "now")

    def __init__(
        self, handler: MetricHandler, now: Callable[[], float], group: str = AGENT_GROUP
    ) -> None:
        self.handler = handler
        self.now = now
        self.group = group
        self.last_values: dict[str, int] = {}

    def put(self, name: str, value: int) -> None:
        """Publish one value of ``name`` in this agent's group."""
        self.last_values[name] = value
        handler = self.handler
        if type(handler) is NullMetricHandler:
            # Performance: nothing to stamp or send (the simulator's agents put two
            # values per node per job restart)
            return
        handler.emit(MetricData(self.now(), self.group, name, value))
