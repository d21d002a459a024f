"""The real timer servers: worker processes reaped for real, and the pipe's defences."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic.timer import (
    FileTimerClient,
    FileTimerRequest,
    FileTimerServer,
    LocalTimerClient,
    LocalTimerServer,
    Reaped,
    TimerError,
    TimerRequest,
    configure,
    expires,
)
from elastic.timer.file_based_local_timer import MAX_LINE_BYTES
from tests.leftovers import is_mp_helper, no_leftover_processes

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    with no_leftover_processes(ignore=is_mp_helper):
        yield


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


STUCK_WORKER = """
import sys, time
from elastic.timer import FileTimerClient, configure, expires
configure(FileTimerClient(sys.argv[1]))
with expires(after=float(sys.argv[2])):
    print("in", flush=True)
    time.sleep(60)
"""

SLEEPER = "import time; time.sleep(60)"


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    return str(tmp_path / "watchdog_timer")


@pytest.fixture
def server(fifo: str) -> Iterator[tuple[FileTimerServer, list[tuple[str, Any]], list[Reaped]]]:
    events: list[tuple[str, Any]] = []
    reaped: list[Reaped] = []
    srv = FileTimerServer(
        fifo,
        "run0",
        max_interval=0.1,
        log_event=lambda name, req: events.append((name, req)),
        on_reap=reaped.append,
    )
    srv.start()
    try:
        yield srv, events, reaped
    finally:
        srv.stop()


def spawn(code: str, *args: str, capture: bool = False) -> subprocess.Popen[str]:
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=out, text=True)


def write_line(path: str, obj: object) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, (json.dumps(obj) + "\n").encode())
    finally:
        os.close(fd)


def line(
    pid: int, sig: int = 0, exp: float = 1e12, version: int = 1, scope: str = "s"
) -> dict[str, Any]:
    return {
        "version": version,
        "pid": pid,
        "scope_id": scope,
        "expiration_time": exp,
        "signal": sig,
    }


def test_fifo_is_owner_only(fifo: str) -> None:
    old = os.umask(0)  # even a permissive umask gives 0o600
    try:
        srv = FileTimerServer(fifo, "run0")
    finally:
        os.umask(old)
    st = os.stat(fifo)
    assert stat.S_ISFIFO(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    srv.stop()
    assert not os.path.exists(fifo)


def test_worker_stuck_in_expires_is_killed_within_its_deadline_plus_interval(
    server: tuple[FileTimerServer, list[tuple[str, Any]], list[Reaped]], fifo: str
) -> None:
    srv, events, reaped = server
    worker = spawn(STUCK_WORKER, fifo, "1", capture=True)
    assert worker.stdout is not None
    assert worker.stdout.readline() == "in\n"
    entered = time.time()
    rc = worker.wait(timeout=10)
    died = time.time()
    worker.stdout.close()
    assert rc == -signal.SIGKILL
    assert died - entered < 1.0 + 0.1 + 2.0  # its deadline, the interval, a busy machine
    assert [r.worker_pid for r in reaped] == [worker.pid]
    assert reaped[0].signal == signal.SIGKILL
    assert [name for name, _ in events] == [
        "watchdog started",
        "timer expired",
        "kill worker process",
    ]
    # torch would now SIGKILL its own process; we are still here, and still serving
    assert srv.get_last_progress_time() >= int(died) - 1
    wait_for(lambda: not srv.get_expired_timers(time.time() + 1e6))


def test_released_timer_does_not_kill(fifo: str) -> None:
    srv = FileTimerServer(fifo, "run0", max_interval=0.1)
    srv.start()
    try:
        code = (
            "import sys, time\n"
            "from elastic.timer import FileTimerClient, expires\n"
            "c = FileTimerClient(sys.argv[1])\n"
            "with expires(after=1.0, client=c):\n    time.sleep(0.05)\n"
            "time.sleep(1.5)\n"  # past the deadline the release cancelled
        )
        worker = spawn(code, fifo)
        assert worker.wait(timeout=10) == 0
        wait_for(lambda: srv._request_count == 2)
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda child: line(child, signal.SIGKILL, version=2), id="unknown-version"),
        pytest.param(
            lambda child: {**line(child, signal.SIGKILL), "pid": str(child)}, id="mistyped"
        ),
        pytest.param(lambda child: [child], id="not-an-object"),
    ],
)
def test_malformed_requests_never_register(
    server: tuple[FileTimerServer, list[tuple[str, Any]], list[Reaped]],
    fifo: str,
    bad: Callable[[int], object],
) -> None:
    srv, _, reaped = server
    child = spawn(SLEEPER)
    try:
        write_line(fifo, bad(child.pid))
        # a good request after the bad one proves the bad one was read (and dropped)
        write_line(fifo, line(child.pid, 0, scope="marker"))
        wait_for(lambda: srv._request_count == 1)
        timers = srv.get_expired_timers(1e13)
        assert [r.scope_id for rs in timers.values() for r in rs] == ["marker"]
        assert reaped == []
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda child: line(os.getppid(), signal.SIGKILL), id="foreign-pid"),
        pytest.param(lambda child: line(os.getpid(), signal.SIGKILL), id="server-own-pid"),
        pytest.param(lambda child: line(-1, signal.SIGKILL), id="process-group"),
        pytest.param(lambda child: line(child, signal.SIGUSR1), id="forbidden-signal"),
    ],
)
def test_requests_the_guard_would_refuse_are_listed_as_torch_lists_them(
    server: tuple[FileTimerServer, list[tuple[str, Any]], list[Reaped]],
    fifo: str,
    bad: Callable[[int], dict[str, Any]],
) -> None:
    # torch accepts any pid and signal; the guard acts only when the timer expires
    # (see tests/test_timer_torch_compat.py for the reap itself)
    srv, _, reaped = server
    child = spawn(SLEEPER)
    try:
        request = bad(child.pid)
        write_line(fifo, request)
        wait_for(lambda: srv._request_count == 1)
        timers = srv.get_expired_timers(1e13)
        assert list(timers) == [request["pid"]]
        assert [r.signal for r in timers[request["pid"]]] == [request["signal"]]
        assert reaped == []
    finally:
        child.kill()
        child.wait()


def test_over_long_line_is_dropped_and_the_next_line_still_parses(
    server: tuple[FileTimerServer, list[tuple[str, Any]], list[Reaped]], fifo: str
) -> None:
    srv, _, _ = server
    child = spawn(SLEEPER)
    try:
        fd = os.open(fifo, os.O_WRONLY)
        big = json.dumps(line(child.pid, 0, scope="x" * (3 * MAX_LINE_BYTES))).encode() + b"\n"
        os.write(fd, big)
        os.write(fd, (json.dumps(line(child.pid, 0, scope="ok")) + "\n").encode())
        os.close(fd)
        wait_for(lambda: srv._request_count == 1)
        (timers,) = srv.get_expired_timers(1e13).values()
        assert [r.scope_id for r in timers] == ["ok"]
    finally:
        child.kill()
        child.wait()


def test_expired_timer_of_a_pid_outside_the_registered_group_is_not_signalled(
    server: tuple[FileTimerServer, list[tuple[str, Any]], list[Reaped]], fifo: str
) -> None:
    srv, _, reaped = server
    a, b = spawn(SLEEPER), spawn(SLEEPER)
    try:
        srv.set_worker_pids([a.pid])
        write_line(fifo, line(b.pid, signal.SIGKILL, exp=time.time()))
        write_line(fifo, line(a.pid, signal.SIGTERM, exp=time.time()))
        assert a.wait(timeout=5) == -signal.SIGTERM
        assert b.poll() is None
        assert [r.worker_pid for r in reaped] == [a.pid]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_client_request_over_pipe_buf_is_refused_client_side(fifo: str) -> None:
    client = FileTimerClient(fifo)
    with pytest.raises(TimerError, match="larger than"):
        client.acquire("x" * MAX_LINE_BYTES, 1.0)


def test_client_without_server_raises_torchs_broken_pipe(tmp_path: Path) -> None:
    client = FileTimerClient(str(tmp_path / "nothing-here"))
    with pytest.raises(BrokenPipeError, match="FileTimerServer is not available"):
        client.release("s")


def test_file_timer_request_json_is_torchs_schema() -> None:
    r = FileTimerRequest(12, "f.py#3", 5.5, signal.SIGKILL)
    assert json.loads(r.to_json()) == {
        "version": 1,
        "pid": 12,
        "scope_id": "f.py#3",
        "expiration_time": 5.5,
        "signal": int(signal.SIGKILL),
    }
    assert r.worker_pid == 12
    assert r == FileTimerRequest(12, "f.py#3", 5.5, signal.SIGKILL)
    assert r != FileTimerRequest(12, "f.py#3", 5.5, 0)


# -- the multiprocessing-queue pair ---------------------------------------------------


def _stuck_local_worker(q: Any, after: float) -> None:
    configure(LocalTimerClient(q))
    with expires(after=after):
        time.sleep(60)


def test_local_server_kills_a_worker_stuck_in_expires() -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    reaped: list[Reaped] = []
    srv = LocalTimerServer(q, max_interval=0.1, on_reap=reaped.append)
    srv.start()
    try:
        p = ctx.Process(target=_stuck_local_worker, args=(q, 0.5))
        p.start()
        p.join(timeout=15)
        assert p.exitcode == -signal.SIGKILL
        assert [r.worker_pid for r in reaped] == [p.pid]
    finally:
        srv.stop()
        q.close()
        q.join_thread()


def test_local_server_drops_malformed_queue_messages() -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    srv = LocalTimerServer(q, max_interval=0.1)
    srv.start()
    try:
        child = spawn(SLEEPER)
        try:
            q.put({"pid": child.pid})
            q.put((child.pid, 7, 1.0))
            q.put((os.getppid(), "foreign", 1e12))  # well-formed: accepted, as torch
            q.put((child.pid, "ok", 1e12))
            wait_for(lambda: len(srv.get_expired_timers(1e13)) == 2)
            assert srv.get_expired_timers(1e13) == {
                os.getppid(): [TimerRequest(os.getppid(), "foreign", 1e12)],
                child.pid: [TimerRequest(child.pid, "ok", 1e12)],
            }
        finally:
            child.kill()
            child.wait()
    finally:
        srv.stop()
        q.close()
        q.join_thread()


def test_timer_of_a_worker_that_exited_holding_it_is_dropped_without_a_kill(
    server: tuple[FileTimerServer, list[tuple[str, Any]], list[Reaped]],
    fifo: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # torch's clear_timers drops the timers of processes no longer running: a worker
    # that exits inside `expires` is not reported killed (it was not)
    srv, events, reaped = server
    # the deadline is taken after the imports (they can take longer than it on a loaded
    # machine): the worker must have exited, holding the timer, before it expires
    code = (
        "import sys, time\n"
        "from elastic.timer import FileTimerClient\n"
        "FileTimerClient(sys.argv[1]).acquire('s', time.time() + float(sys.argv[2]))\n"
    )
    caplog.set_level("INFO", logger="elastic.timer")
    worker = spawn(code, fifo, "2.0")
    srv.set_worker_pids([worker.pid])
    assert worker.wait(timeout=10) == 0
    wait_for(lambda: srv._request_count == 1)
    # past the deadline, the server has looked at the timer
    wait_for(lambda: [n for n, _ in events] == ["watchdog started", "timer expired"], timeout=10)
    wait_for(lambda: not srv.get_expired_timers(time.time() + 1e6))
    assert reaped == []
    assert [name for name, _ in events] == ["watchdog started", "timer expired"]
    # torch's debug hook saw the expired timer (run id, pid → the timer's JSON)
    debug = [r for r in caplog.records if r.name == "elastic.timer.debug_info_logging"]
    assert len(debug) == 1 and "run:[run0]" in debug[0].getMessage()
    assert str(worker.pid) in debug[0].getMessage()


def test_release_from_a_process_already_exited_and_reaped_is_accepted(
    server: tuple[FileTimerServer, list[tuple[str, Any]], list[Reaped]],
    fifo: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a worker's last line is often its release, and the worker may be gone (and reaped,
    # so no longer anyone's descendant) before the server reads it: the release must
    # still drop the timer, with no "not a worker of this agent" warning
    srv, _, reaped = server
    child = spawn(SLEEPER)
    write_line(fifo, line(child.pid, signal.SIGKILL, scope="held"))
    wait_for(lambda: srv._request_count == 1)
    child.kill()
    child.wait()
    caplog.set_level("WARNING", logger="elastic.timer")
    write_line(fifo, line(child.pid, 0, exp=-1, scope="held"))
    wait_for(lambda: srv._request_count == 2)
    assert srv.get_expired_timers(1e13) == {}
    assert reaped == []
    assert not [r for r in caplog.records if "not a worker" in r.getMessage()]


def test_local_server_lists_live_timers_by_worker_and_scope_as_torch() -> None:
    # torch's tests (and tools written against them) read server._timers
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    srv = LocalTimerServer(q, max_interval=0.1)
    srv.start()
    try:
        child = spawn(SLEEPER)
        try:
            q.put((child.pid, "a", 1e12))
            q.put((child.pid, "b", 1e12))
            q.put((child.pid, "a", -1))
            wait_for(lambda: list(srv._timers) == [(child.pid, "b")])
            assert srv._timers[(child.pid, "b")] == TimerRequest(child.pid, "b", 1e12)
        finally:
            child.kill()
            child.wait()
    finally:
        srv.stop()
        q.close()
        q.join_thread()
