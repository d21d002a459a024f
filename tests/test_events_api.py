"""torch's events API at elastic.events: loaded on first use, the same objects as its module."""

from __future__ import annotations

import logging
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
    from elastic.events import get_logging_handler

    assert isinstance(get_logging_handler(), logging.NullHandler)
    assert isinstance(get_logging_handler("null"), logging.NullHandler)
    assert isinstance(get_logging_handler("dynamic_rendezvous"), logging.NullHandler)
    assert isinstance(get_logging_handler("console"), logging.StreamHandler)
    with pytest.raises(KeyError):
        get_logging_handler("nope")


class Keep(logging.Handler):
    """A handler that keeps the messages it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_construct_and_record_rdzv_event_records_torchs_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json
    import os

    from elastic.events import NodeState, construct_and_record_rdzv_event, handlers

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


TORCH_KEYS = [
    "run_id",
    "global_rank",
    "group_rank",
    "worker_id",
    "role",
    "hostname",
    "state",
    "total_run_time",
    "rdzv_backend",
    "raw_error",
    "metadata",
    "agent_restarts",
    "duration_ms",
]


def test_the_record_sink_gives_torchs_names_keys_and_inner_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    from elastic.events import AgentEvent, handlers, kinds

    keep = Keep()
    monkeypatch.setitem(handlers._log_handlers, "keep", keep)
    monkeypatch.setattr("elastic.events.api._events_loggers", {})
    sink = api.RecordSink("keep", "job", "c10d", "host-a", "python")

    def ev(kind: str, rank: int | None = None, **fields: object) -> None:
        sink.emit(AgentEvent(1.5, "n0", kind, "trainer", rank, fields))

    def start(rank: int, pid: int) -> None:
        ev(kinds.WORKER_START, rank, local_rank=rank, role_rank=rank, worker_pid=pid,
           world_size=2, group_rank=0, attempt=0)  # fmt: skip

    ev(kinds.AGENT_START, max_restarts=3)
    ev(kinds.RENDEZVOUS, duration_ms=5.0, round=0, group_rank=0, group_world_size=1)
    ev(kinds.ASSIGN_WORKER_RANKS, duration_ms=0.1, group_rank=0, world_size=2)
    start(0, 100)
    start(1, 101)
    ev(kinds.WORKER_FAILED, 1, local_rank=1, exit_code=3, worker_pid=101, attempt=0)
    ev(kinds.AGENT_RESTART, reason="failure", remaining_restarts=2)
    ev(kinds.WORKER_TERMINATED, 0, local_rank=0, exit_code=-15, attempt=0)
    ev(kinds.AGENT_GROUP_STOPPED, reason="failure", attempt=0)  # ours: not recorded
    ev(kinds.RENDEZVOUS, duration_ms=2.0, round=1, group_rank=0, group_world_size=1)

    recorded = [json.loads(line) for line in keep.lines]
    names = [(e["name"], e["source"]) for e in recorded]
    assert names == [
        ("torchelastic.worker.status.RENDEZVOUS", "AGENT"),
        ("torchelastic.worker.status.ASSIGN_WORKER_RANKS", "AGENT"),
        ("torchelastic.worker.status.START", "WORKER"),
        ("torchelastic.worker.status.START", "WORKER"),
        ("torchelastic.worker.status.FAILED", "WORKER"),
        ("torchelastic.worker.status.TERMINATED", "WORKER"),
        ("torchelastic.worker.status.RENDEZVOUS", "AGENT"),
    ]
    assert all(list(e["metadata"]) == TORCH_KEYS for e in recorded)
    assert {e["timestamp"] for e in recorded} == {0}
    md = [e["metadata"] for e in recorded]
    # the first round's events carry no group yet; the second round's the first's
    assert [m["group_rank"] for m in md] == [None, None, 0, 0, 0, 0, 0]
    assert json.loads(md[0]["metadata"]) == {"group_world_size": None, "entry_point": "python"}
    assert md[0]["state"] == "RENDEZVOUS" and md[0]["duration_ms"] == 5.0
    assert json.loads(md[6]["metadata"]) == {"group_world_size": 1, "entry_point": "python"}
    # a worker: torch's one-element lists; exit code and pid only for a failure
    assert json.loads(md[4]["metadata"]) == {
        "group_world_size": 1,
        "entry_point": "python",
        "local_rank": [1],
        "role_rank": [1],
        "role_world_size": [2],
        "exit_code": [3],
        "worker_pid": [101],
    }
    assert json.loads(md[5]["metadata"])["exit_code"] == [None]
    assert [m["worker_id"] for m in md] == [None, None, "100", "101", "101", "100", None]
    assert [m["global_rank"] for m in md] == [None, None, 0, 1, 1, 0, None]
    # max_restarts less the restarts left, from the restart on
    assert [m["agent_restarts"] for m in md] == [0, 0, 0, 0, 0, 1, 1]
    assert {(m["run_id"], m["hostname"], m["rdzv_backend"], m["role"]) for m in md} == {
        ("job", "host-a", "c10d", "trainer")
    }
    assert {(m["total_run_time"], m["raw_error"]) for m in md} == {(0, None)}
