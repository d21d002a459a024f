"""Issue 15, items 4, 5, 9 and 11: bad error files, environment and timer-pipe input give
one line (or a quiet refusal), never a traceback, a crash, or a lost file."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from elastic.errors import ConfigError
from elastic.multiprocessing.errors import MAX_TIMESTAMP, ChildFailedError, ProcessFailure
from elastic.timer import file_based_local_timer as fbt
from elastic.timer.file_based_local_timer import MAX_TIMERS, FileTimerRequest, FileTimerServer
from tests.test_run_cli import elastic_run, script, tag  # noqa: F401  # the fixture

# -- error.json (item 4, and ANSI escapes of item 11) --------------------------------------


def _failure(tmp_path: Path, doc: Any) -> ProcessFailure:
    path = tmp_path / "error.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return ProcessFailure(0, 42, 1, str(path), fallback_timestamp=1_700_000_000)


@pytest.mark.parametrize(
    "stamp", [253402300800, "253402300800", 10**20, -(10**15), "-1", "9" * 4000, 1e20, -1]
)
def test_an_out_of_range_timestamp_falls_back_to_the_exit_time(tmp_path: Path, stamp: Any) -> None:
    for doc in (
        {"message": "boom", "timestamp": stamp},
        {"message": {"message": "x", "extraInfo": {"timestamp": stamp, "py_callstack": "tb"}}},
    ):
        f = _failure(tmp_path, doc)
        assert f.timestamp == 1_700_000_000
        report = str(ChildFailedError("train.py", {0: f}, hostname="h"))
        assert "Root Cause" in report


def test_the_largest_accepted_timestamp_is_shown() -> None:
    f = ProcessFailure(0, 1, 1, "", fallback_timestamp=MAX_TIMESTAMP)
    assert f.timestamp_isoformat().startswith(("9999-", "9998-"))


def test_ansi_escapes_of_an_error_file_do_not_reach_the_terminal(tmp_path: Path) -> None:
    evil = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\rover\x9b1m\x00"
    f = _failure(tmp_path, {"message": {"message": evil, "extraInfo": {"py_callstack": evil}}})
    report = str(ChildFailedError("train\x1b[5m.py", {0: f}, hostname="h"))
    assert not any(c in report for c in "\x1b\x07\r\x00\x9b")
    assert "\\x1b[31mred\\x0dover" in report


# -- TORCHELASTIC_HEALTH_CHECK_PORT (item 5): the job runs without /health ------------------

OK = "print('trained')\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("port", ["99999", "-1", "in-use"])
def test_a_bad_health_port_is_one_line_and_the_job_still_runs(
    tmp_path: Path,
    tag: str,  # noqa: F811
    port: str,
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        value = str(busy.getsockname()[1]) if port == "in-use" else port
        p = elastic_run(
            [script(tmp_path, OK)], tag, TORCHELASTIC_HEALTH_CHECK_PORT=value, LOGLEVEL="ERROR"
        )
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "TORCHELASTIC_HEALTH_CHECK_PORT" in ln]
    assert len(lines) == 1 and value in lines[0] and "Not serving /health" in lines[0], p.stderr


# -- --signals-to-handle SIGCHLD (item 11) ---------------------------------------------------


@pytest.mark.timeout(60)
def test_sigchld_as_a_signal_to_handle_is_refused_with_exit_2(
    tmp_path: Path,
    tag: str,  # noqa: F811
) -> None:
    p = elastic_run(["--signals-to-handle", "SIGTERM,SIGCHLD", script(tmp_path, OK)], tag)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "--signals-to-handle" in line and "SIGCHLD" in line


# -- TORCHELASTIC_TIMER_FILE (item 11) -------------------------------------------------------


def test_a_timer_file_pointing_at_an_existing_file_is_refused_and_the_file_kept(
    tmp_path: Path,
) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("do not delete")
    with pytest.raises(ConfigError, match=r"TORCHELASTIC_TIMER_FILE.*exists"):
        FileTimerServer(str(precious), "run")
    assert precious.read_text() == "do not delete"
    with pytest.raises(ConfigError, match="TORCHELASTIC_TIMER_FILE"):
        FileTimerServer(str(tmp_path / "no" / "such" / "dir" / "pipe"), "run")
    with pytest.raises(ConfigError, match="TORCHELASTIC_TIMER_FILE"):
        FileTimerServer(str(tmp_path), "run")  # a directory
    assert precious.exists()


def test_stop_leaves_a_file_that_replaced_the_pipe(tmp_path: Path) -> None:
    path = tmp_path / "pipe"
    server = FileTimerServer(str(path), "run")
    os.remove(path)
    path.write_text("someone else's")
    server.stop()
    assert path.read_text() == "someone else's"


@pytest.mark.timeout(60)
def test_a_bad_timer_file_is_one_line_and_exit_2(tmp_path: Path, tag: str) -> None:  # noqa: F811
    precious = tmp_path / "precious.txt"
    precious.write_text("keep")
    p = elastic_run(
        [script(tmp_path, OK)],
        tag,
        TORCHELASTIC_ENABLE_FILE_TIMER="1",
        TORCHELASTIC_TIMER_FILE=str(precious),
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "TORCHELASTIC_TIMER_FILE" in line
    assert precious.read_text() == "keep"


# -- the timer pipe (item 9) ----------------------------------------------------------------


def _server(tmp_path: Path) -> FileTimerServer:
    server = FileTimerServer(str(tmp_path / "pipe"), "run", max_interval=0.05)
    server.set_worker_pids([os.getpid() + 10**6])  # nobody of this test is a worker
    return server


def test_deep_json_is_dropped_without_losing_the_requests_read_with_it(tmp_path: Path) -> None:
    server = _server(tmp_path)
    server.guard.set_worker_pids(None)  # our own descendants: none; allow by pid below
    me = os.getpid()
    server.guard.pid_allowed = lambda pid: pid == me  # type: ignore[method-assign]
    good = FileTimerRequest(me, "s", time.time() + 3600, 0).to_json().encode() + b"\n"
    deep = b"[" * 4000  # the 4,001-byte line
    assert len(deep) < fbt.MAX_LINE_BYTES
    assert fbt.parse_line(deep + b"\n") is None
    server.start()
    try:
        fd = os.open(server._file_path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, deep + b"\n" + good)  # read together
        os.close(fd)
        deadline = time.monotonic() + 10
        while not server._timers.timers(me):
            assert time.monotonic() < deadline, "the good request was lost"
            time.sleep(0.01)
    finally:
        server.stop()


def test_live_timers_are_capped_and_renewals_still_pass(tmp_path: Path) -> None:
    server = _server(tmp_path)
    me = os.getpid()
    server.guard.pid_allowed = lambda pid: pid == me  # type: ignore[method-assign]
    far = time.time() + 3600
    lines = [FileTimerRequest(me, f"s{i}", far, 0) for i in range(MAX_TIMERS + 500)]
    server.start()
    try:
        fd = os.open(server._file_path, os.O_WRONLY)
        for r in lines:
            os.write(fd, r.to_json().encode() + b"\n")
        os.write(fd, FileTimerRequest(me, "s0", far + 1, 0).to_json().encode() + b"\n")
        os.write(fd, FileTimerRequest(me, "s1", -1, 0).to_json().encode() + b"\n")
        os.close(fd)
        deadline = time.monotonic() + 20
        while True:
            timers = {r.scope_id: r for r in server._timers.timers(me)}
            if "s1" not in timers and timers.get("s0", lines[0]).expiration_time == far + 1:
                break
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert len(timers) == MAX_TIMERS - 1
    finally:
        server.stop()


def test_a_renewal_in_the_same_read_as_its_acquire_passes_at_the_cap(tmp_path: Path) -> None:
    # the live-timer test above failed under load: when the whole pipe is read at once,
    # the renewal of s0 came in the same read as s0 itself, after the cap was reached by
    # that read's acquires, and was refused as a new timer (s0 then kept its old expiry)
    server = _server(tmp_path)
    me = os.getpid()
    server.guard.pid_allowed = lambda pid: pid == me  # type: ignore[method-assign]
    far = time.time() + 3600
    try:
        for i in range(MAX_TIMERS):
            assert server._admit(FileTimerRequest(me, f"s{i}", far, 0))
        assert not server._admit(FileTimerRequest(me, "one-too-many", far, 0))
        assert server._admit(FileTimerRequest(me, "s0", far + 1, 0))
    finally:
        server.stop()


def test_refusals_are_cheap_and_their_warnings_rate_limited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a timer of any pid is accepted and listed (torch's); the guard refuses the kill of
    # a process that is no worker of ours, cheaply and with rate-limited warnings
    server = _server(tmp_path)
    other = os.getppid()  # alive, not a worker
    server.start()
    fbt._warn = fbt._RateLimited()
    try:
        with caplog.at_level(logging.WARNING, logger=fbt.__name__):
            t0 = time.process_time()
            for _ in range(2000):
                assert not server._reap_worker(other, signal.SIGKILL)
            cpu = time.process_time() - t0
        # generous for a loaded host
        assert cpu < 2000 * 0.5e-3, f"{cpu / 2000 * 1e6:.0f} µs of CPU per refused reap"
        assert len(caplog.records) <= fbt._LOG_BURST + 1
    finally:
        server.stop()
