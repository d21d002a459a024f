"""torch's events API at elastic.events: loaded on first use, the same objects as its module."""

from __future__ import annotations

import subprocess
import sys

import pytest

import elastic.events
from elastic.events import api


def test_importing_the_event_log_does_not_load_torchs_events_api() -> None:
    code = (
        "import sys, elastic.events\n"
        "print('elastic.events.api' in sys.modules)\n"
        "from elastic.events import Event, record\n"
        "print('elastic.events.api' in sys.modules, Event.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["False", "True", "elastic.events.api"]


def test_torch_names_are_the_api_modules_objects() -> None:
    for name in ("Event", "EventSource", "NodeState", "RdzvEvent", "record"):
        assert getattr(elastic.events, name) is getattr(api, name)
        assert name in elastic.events.__all__


def test_an_event_round_trips_and_records_to_null() -> None:
    from elastic.events import Event, EventSource, record

    e = Event("torchelastic.worker.status.SUCCEEDED", EventSource.AGENT, 1, {"rank": 0})
    assert Event.deserialize(e.serialize()) == e
    record(e)  # the null destination: nothing happens, nothing raises


def test_unknown_names_still_raise_attribute_error() -> None:
    try:
        elastic.events.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_get_logging_handler_has_torchs_destinations() -> None:
    import logging

    from elastic.events import get_logging_handler

    assert isinstance(get_logging_handler(), logging.NullHandler)
    assert isinstance(get_logging_handler("null"), logging.NullHandler)
    assert isinstance(get_logging_handler("dynamic_rendezvous"), logging.NullHandler)
    assert isinstance(get_logging_handler("console"), logging.StreamHandler)
    with pytest.raises(KeyError):
        get_logging_handler("nope")


def test_construct_and_record_rdzv_event_records_torchs_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json
    import logging
    import os

    from elastic.events import NodeState, construct_and_record_rdzv_event, handlers

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    # the default (NullHandler) records nothing and computes nothing
    construct_and_record_rdzv_event("r", "quiet", NodeState.INIT)
    keep = Keep()
    monkeypatch.setitem(handlers._log_handlers, "dynamic_rendezvous", keep)
    monkeypatch.setattr("elastic.events.api._events_loggers", {})

    def caller() -> None:
        construct_and_record_rdzv_event(
            run_id="r", message="joined", node_state=NodeState.RUNNING, hostname="h", rank=3
        )

    caller()
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        construct_and_record_rdzv_event("r", "failed", NodeState.FAILED, name="step")
    ran, failed = (json.loads(line) for line in keep.lines)
    assert ran["name"] == "test_events_api.py:caller"
    assert (ran["run_id"], ran["message"], ran["hostname"], ran["rank"]) == ("r", "joined", "h", 3)
    assert ran["pid"] == os.getpid() and ran["node_state"] == "RUNNING"
    assert ran["error_trace"] == "" and ran["master_endpoint"] == "" and ran["local_id"] is None
    assert (
        failed["name"] == "test_events_api.py:step"
        and "RuntimeError: boom" in (failed["error_trace"])
    )
