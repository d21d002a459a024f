"""torch's events API at elastic.events: loaded on first use, the same objects as its module."""

from __future__ import annotations

import subprocess
import sys

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
