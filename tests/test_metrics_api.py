"""torch's process-wide metrics API: prof/profile keys, publish_metric, elapsed time."""

from __future__ import annotations

import time

import pytest

from elastic import metrics
from elastic.metrics import api as metrics_api
from elastic.metrics.core import MetricData, MetricHandler


class Keep(MetricHandler):
    def __init__(self) -> None:
        self.data: dict[str, MetricData] = {}

    def emit(self, metric_data: MetricData) -> None:
        self.data[metric_data.name] = metric_data


@pytest.fixture
def kept() -> Keep:
    handler = Keep()
    metrics_api.configure(handler, "tgroup")
    metrics_api.configure(handler, "torchelastic")
    yield handler
    metrics_api._metrics_map.pop("tgroup", None)
    metrics_api._metrics_map.pop("torchelastic", None)


def plain() -> None:
    pass


class Trainer:
    def step(self) -> None:
        pass


def test_metric_name_is_the_qualified_name_of_a_method_else_module_leaf_and_name() -> None:
    assert metrics_api._get_metric_name(Trainer.step) == "Trainer.step"
    assert metrics_api._get_metric_name(plain) == "test_metrics_api.plain"


def test_prof_records_success_failure_and_duration_under_the_qualified_name(kept: Keep) -> None:
    class Job:
        @metrics.prof(group="tgroup")
        def ok(self) -> int:
            return 3

        @metrics.prof(group="tgroup")
        def bad(self) -> None:
            raise KeyError("x")

    assert Job().ok() == 3
    with pytest.raises(KeyError):
        Job().bad()
    prefix = "test_prof_records_success_failure_and_duration_under_the_qualified_name.<locals>"
    assert kept.data[f"{prefix}.Job.ok.success"].value == 1
    assert kept.data[f"{prefix}.Job.bad.failure"].value == 1
    assert f"{prefix}.Job.ok.duration.ms" in kept.data
    assert f"{prefix}.Job.bad.success" not in kept.data


def test_profile_keys_by_bare_function_name_in_its_group(kept: Keep) -> None:
    @metrics.profile("tgroup")
    def work() -> str:
        return "done"

    @metrics.profile()
    def other() -> None:
        pass

    assert work() == "done"
    other()
    assert kept.data["work.success"].group_name == "tgroup"
    assert "work.duration.ms" in kept.data
    assert kept.data["other.success"].group_name == "torchelastic"


def test_publish_metric_takes_the_group_first(kept: Keep) -> None:
    metrics.publish_metric("tgroup", "loss", 7)
    got = kept.data["loss"]
    assert (got.group_name, got.value) == ("tgroup", 7)


def test_get_elapsed_time_ms_counts_wall_milliseconds_since_start() -> None:
    assert metrics.get_elapsed_time_ms(time.time() - 2.5) in range(2500, 4000)
