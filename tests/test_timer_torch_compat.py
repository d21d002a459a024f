"""The timer servers accept and list every timer as torch's do; the guard is in the reap.

torch's ``LocalTimerServer``/``FileTimerServer`` take any worker id, report it from
``get_expired_timers`` and hand it to ``_reap_worker`` (torch's own tests mock that
method and use ids such as -1).  Ours do the same; only the default ``_reap_worker``,
the one that calls ``os.kill``, refuses what is not a worker of this agent.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from elastic.timer import FileTimerServer, LocalTimerServer, TimerRequest
from tests.leftovers import is_mp_helper, no_leftover_processes

pytestmark = pytest.mark.timeout(30)

SLEEPER = "import time; time.sleep(60)"


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    with no_leftover_processes(ignore=is_mp_helper):
        yield


@pytest.fixture
def server_kills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every ``os.kill`` made off the test's own thread (by a server), never delivered.

    A broken guard would signal a process group or the test runner: recorded here
    instead, so a failing test fails without harm.  The test's own cleanup
    (``Popen.kill`` on the main thread) still goes through.
    """
    calls: list[tuple[int, int]] = []
    real_kill = os.kill
    main = threading.main_thread()

    def kill(pid: int, sig: int) -> None:
        if threading.current_thread() is main:
            real_kill(pid, sig)
        else:
            calls.append((pid, sig))

    monkeypatch.setattr(os, "kill", kill)
    return calls


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def spawn() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SLEEPER])


def write_line(
    path: str, pid: int, exp: float, sig: int = signal.SIGKILL, scope: str = "s"
) -> None:
    obj = {"version": 1, "pid": pid, "scope_id": scope, "expiration_time": exp, "signal": sig}
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, (json.dumps(obj) + "\n").encode())
    finally:
        os.close(fd)


# -- LocalTimerServer ------------------------------------------------------------------


@pytest.fixture
def local() -> Iterator[tuple[LocalTimerServer, Any]]:
    q = mp.get_context("spawn").Queue()
    srv = LocalTimerServer(q, max_interval=0.05)
    try:
        yield srv, q
    finally:
        srv.stop()
        q.close()
        q.join_thread()


def test_local_server_lists_timers_of_fake_worker_ids_like_torch(
    local: tuple[LocalTimerServer, Any],
) -> None:
    srv, q = local
    srv.start()
    far = time.time() + 3600
    for msg in [(-1, "a", far), (-1, "b", far), (3, "a", far), (-1, "b", -1)]:
        q.put(msg)
    # the final state (two timers are also there after the first two messages alone)
    wait_for(lambda: set(srv._timers) == {(-1, "a"), (3, "a")})
    expired = srv.get_expired_timers(far)
    assert sorted(expired) == [-1, 3]
    assert expired[-1] == [TimerRequest(-1, "a", far)]


def test_a_mocked_reap_worker_of_the_local_server_sees_every_expired_worker_id(
    local: tuple[LocalTimerServer, Any], server_kills: list[tuple[int, int]]
) -> None:
    srv, q = local
    seen: list[Any] = []

    def reap(worker_id: Any) -> bool:
        seen.append(worker_id)
        return True

    srv._reap_worker = reap  # type: ignore[method-assign]
    srv.start()
    past = time.time() - 1
    q.put((-1, "a", past))
    q.put((7, "b", past))
    wait_for(lambda: sorted(seen) == [-1, 7])
    wait_for(lambda: not srv._timers)  # reaped: their timers are cleared
    assert server_kills == []


def test_the_local_servers_own_reap_refuses_non_workers_and_drops_their_timers(
    local: tuple[LocalTimerServer, Any],
    server_kills: list[tuple[int, int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    srv, q = local
    results: list[tuple[Any, bool]] = []
    own = srv._reap_worker

    def spy(worker_id: Any) -> bool:
        ok = own(worker_id)
        results.append((worker_id, ok))
        return ok

    srv._reap_worker = spy  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="elastic.timer")
    srv.start()
    past = time.time() - 1
    bad = [-1, 0, os.getpid(), os.getppid()]  # process group, "everyone", us, not ours
    for pid in bad:
        q.put((pid, "s", past))
    wait_for(lambda: len(results) == len(bad))
    wait_for(lambda: not srv._timers)  # dropped, not retried every max_interval
    assert sorted(results) == sorted((pid, False) for pid in bad)
    assert server_kills == []
    assert len([r for r in caplog.records if "refusing to signal" in r.getMessage()]) == 4
    time.sleep(0.2)  # several retry intervals: a refused worker is not tried again
    assert len(results) == len(bad)


def test_the_local_servers_own_reap_still_kills_its_worker(
    local: tuple[LocalTimerServer, Any],
) -> None:
    srv, q = local
    child = spawn()
    try:
        srv.set_worker_pids([child.pid])
        srv.start()
        q.put((child.pid, "s", time.time()))
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


# -- FileTimerServer -------------------------------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    return str(tmp_path / "watchdog_timer")


@pytest.fixture
def file_server(fifo: str) -> Iterator[tuple[FileTimerServer, list[tuple[str, Any]]]]:
    events: list[tuple[str, Any]] = []
    srv = FileTimerServer(
        fifo, "run0", max_interval=0.05, log_event=lambda n, r: events.append((n, r))
    )
    try:
        yield srv, events
    finally:
        srv.stop()


def test_file_server_lists_fake_pids_and_a_mocked_reap_worker_sees_them(
    file_server: tuple[FileTimerServer, list[tuple[str, Any]]],
    fifo: str,
    server_kills: list[tuple[int, int]],
) -> None:
    srv, events = file_server
    seen: list[tuple[int, int]] = []

    def reap(pid: int, sig: int) -> bool:
        seen.append((pid, sig))
        return True

    srv._reap_worker = reap  # type: ignore[method-assign]
    srv.is_process_running = lambda pid: True  # type: ignore[method-assign]
    srv.start()
    far = time.time() + 3600
    write_line(fifo, -3, far, scope="t1")
    write_line(fifo, -2, far, scope="t2")
    wait_for(lambda: srv._request_count == 2)
    assert (-3, "t1") in srv._timers and (-2, "t2") in srv._timers
    assert sorted(srv.get_expired_timers(far)) == [-3, -2]
    write_line(fifo, -3, time.time() - 60, scope="t3")
    wait_for(lambda: seen == [(-3, signal.SIGKILL)])
    wait_for(lambda: not srv._timers.timers(-3))  # all of -3's timers, as torch
    assert (-2, "t2") in srv._timers
    assert [n for n, _ in events][-1] == "kill worker process"
    assert server_kills == []


def test_file_server_asks_its_is_process_running_whether_a_worker_exited(
    file_server: tuple[FileTimerServer, list[tuple[str, Any]]],
    fifo: str,
    server_kills: list[tuple[int, int]],
) -> None:
    srv, _ = file_server
    asked: list[int] = []
    running = {"answer": False}

    def is_running(pid: int) -> bool:
        asked.append(pid)
        return running["answer"]

    seen: list[int] = []

    def reap(pid: int, sig: int) -> bool:
        seen.append(pid)
        return True

    srv.is_process_running = is_running  # type: ignore[method-assign]
    srv._reap_worker = reap  # type: ignore[method-assign]
    srv.start()
    child = spawn()  # alive, but the server is told it is not: no reap
    try:
        write_line(fifo, child.pid, time.time(), scope="a")
        wait_for(lambda: asked == [child.pid])
        wait_for(lambda: not srv._timers)
        assert seen == []
    finally:
        child.kill()
        child.wait()
    running["answer"] = True  # gone, but the server is told it runs: reaped
    write_line(fifo, child.pid, time.time(), scope="b")
    wait_for(lambda: seen == [child.pid])
    assert asked == [child.pid, child.pid]
    assert server_kills == []


def test_is_process_running_counts_a_zombie_or_a_pid_below_one_as_not_running() -> None:
    assert FileTimerServer.is_process_running(os.getpid())
    assert not FileTimerServer.is_process_running(-3)
    assert not FileTimerServer.is_process_running(0)
    child = spawn()
    try:
        assert FileTimerServer.is_process_running(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
        assert not FileTimerServer.is_process_running(child.pid)  # torch's os.kill(0) says yes
    finally:
        child.kill()
        child.wait()
    assert not FileTimerServer.is_process_running(child.pid)


def test_the_file_servers_own_reap_refuses_non_workers_and_forbidden_signals(
    file_server: tuple[FileTimerServer, list[tuple[str, Any]]],
    fifo: str,
    server_kills: list[tuple[int, int]],
) -> None:
    srv, events = file_server
    results: list[tuple[int, int, bool]] = []
    own = srv._reap_worker

    def spy(pid: int, sig: int) -> bool:
        ok = own(pid, sig)
        results.append((pid, sig, ok))
        return ok

    srv._reap_worker = spy  # type: ignore[method-assign]
    worker, stranger = spawn(), spawn()
    try:
        srv.set_worker_pids([worker.pid])
        srv.start()
        now = time.time()
        bad = [
            (os.getpid(), signal.SIGKILL),  # the server itself
            (os.getppid(), signal.SIGKILL),  # alive, not ours
            (stranger.pid, signal.SIGKILL),  # our child, but not a registered worker
            (worker.pid, signal.SIGUSR1),  # a worker, with a signal not allowed
        ]
        for pid, sig in bad:
            write_line(fifo, pid, now, sig)
        wait_for(lambda: len(results) == len(bad))
        wait_for(lambda: not srv._timers)  # dropped, not retried
        assert sorted(results) == sorted((pid, sig, False) for pid, sig in bad)
        assert server_kills == []
        assert "kill worker process" not in [n for n, _ in events]
        assert worker.poll() is None and stranger.poll() is None
    finally:
        for p in (worker, stranger):
            p.kill()
            p.wait()
