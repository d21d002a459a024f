"""Progress heartbeats: pure watcher, the clock-port monitor in both worlds, real FIFOs."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import elastic.progress as progress
from elastic.clock import Clock
from elastic.progress import (
    ENV_PROGRESS_FILE,
    FifoProgressSource,
    ProgressMonitor,
    ProgressWatcher,
)
from elastic.real.clock import AsyncioClock
from tests.leftovers import no_leftover_processes
from tests.worlds import run_in

# -- pure -----------------------------------------------------------------------------


def test_unarmed_watcher_watches_a_rank_from_its_first_beat() -> None:
    w = ProgressWatcher(10.0, [0, 1], now=0.0)
    assert w.stalled(100.0) == []
    assert w.next_check(0.0) is None
    assert w.beat(1, 5.0) is True
    assert w.beat(1, 6.0) is False
    assert w.next_check(6.0) == 16.0
    assert w.stalled(15.9) == []
    assert w.stalled(16.0) == [1]


def test_armed_watcher_counts_the_start_as_a_beat() -> None:
    w = ProgressWatcher(10.0, [0, 1], now=2.0, armed=True)
    w.beat(0, 8.0)
    assert w.next_check(8.0) == 12.0
    assert w.stalled(12.0) == [1]
    assert w.stalled(18.0) == [0, 1]
    assert w.stalled(12.0, hang_timeout=20.0) == []


def test_reset_forgets_the_old_group() -> None:
    w = ProgressWatcher(1.0, [0], now=0.0, armed=True)
    w.reset([0, 1], 50.0)
    assert w.stalled(50.5) == []
    assert w.stalled(51.0) == [0, 1]


def test_hang_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="hang_timeout must be > 0"):
        ProgressWatcher(0)


# -- the async monitor, both worlds ---------------------------------------------------


def test_wait_stalled_returns_the_rank_that_stops_beating(world: str) -> None:
    async def body(clock: Clock) -> tuple[list[int], float, int]:
        monitor = ProgressMonitor(clock, ProgressWatcher(0.3, [0, 1], clock.now(), armed=True))

        async def worker(rank: int, beats: int) -> None:
            for _ in range(beats):
                await clock.sleep(0.05)
                monitor.beat(rank)

        clock.spawn(worker(0, 100))
        clock.spawn(worker(1, 4))  # stops beating at 0.2 s
        start = clock.now()
        stuck = await clock.timeout(3.0, monitor.wait_stalled())
        return stuck, clock.now() - start, monitor.wakeups

    stuck, took, wakeups = run_in(world, body)
    assert stuck == [1]
    # real: the beats are sleeps, late on a loaded machine, and the stall is timed from the last
    assert 0.5 <= took <= 0.5 + (0.4 if world == "real" else 1e-9)
    assert wakeups <= 4  # not one per beat (~14 beats happened)


def test_a_rank_armed_by_its_first_beat_wakes_an_idle_monitor(world: str) -> None:
    async def body(clock: Clock) -> list[int]:
        monitor = ProgressMonitor(clock, ProgressWatcher(0.2, [0], clock.now()))
        task = clock.spawn(monitor.wait_stalled())
        await clock.sleep(0.5)
        assert not task.done()  # nobody beat yet: nothing to watch
        monitor.beat(0)
        return await clock.timeout(1.0, task.join())

    assert run_in(world, body) == [0]


# -- real FIFOs -----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    with no_leftover_processes():
        yield


def test_beat_without_the_env_var_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PROGRESS_FILE, raising=False)
    assert progress.beat() is False


def test_beat_with_no_reader_returns_false_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = FifoProgressSource(str(tmp_path), [0])  # pipe exists, nobody reads
    monkeypatch.setenv(ENV_PROGRESS_FILE, src.path_for(0))
    assert progress.beat() is False
    src.stop()


def test_progress_pipes_are_owner_only(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        src = FifoProgressSource(str(tmp_path), [0, 1])
    finally:
        os.umask(old)
    for r in (0, 1):
        mode = os.stat(src.path_for(r)).st_mode
        assert stat.S_ISFIFO(mode) and stat.S_IMODE(mode) == 0o600
    src.stop()
    assert list(tmp_path.iterdir()) == []


WORKER = """
import sys, time
import elastic.progress
for _ in range(int(sys.argv[1])):
    assert elastic.progress.beat()
    time.sleep(0.05)
time.sleep(30)
"""


@pytest.mark.timeout(30)
def test_real_workers_beating_over_fifos_and_the_one_that_stops_is_found(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[list[int], float]:
        clock = AsyncioClock()
        loop = asyncio.get_running_loop()
        src = FifoProgressSource(str(tmp_path), [0, 1])
        monitor = ProgressMonitor(clock, ProgressWatcher(0.5, [0, 1], clock.now()))
        last_beat_of_1: list[float] = []

        def deliver(rank: int) -> None:
            monitor.beat(rank)
            if rank == 1:
                last_beat_of_1.append(clock.now())

        src.start(deliver, loop.call_soon_threadsafe)
        procs = []
        try:
            for rank, beats in ((0, 400), (1, 6)):
                env = {**os.environ, **src.env_for(rank)}
                procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(beats)], env=env))
            stuck = await clock.timeout(20.0, monitor.wait_stalled())
            return stuck, clock.now() - last_beat_of_1[-1]
        finally:
            for p in procs:
                p.kill()
                p.wait()
            src.stop()

    stuck, silent_for = asyncio.run(main())
    assert stuck == [1]
    assert 0.5 <= silent_for < 0.5 + 0.5  # found at its deadline (plus a busy loop's wake)


@pytest.mark.timeout(30)
def test_a_line_written_from_a_shell_is_a_beat(tmp_path: Path) -> None:
    async def main() -> list[int]:
        clock = AsyncioClock()
        loop = asyncio.get_running_loop()
        src = FifoProgressSource(str(tmp_path), [3])
        monitor = ProgressMonitor(clock, ProgressWatcher(60.0, [3], clock.now()))
        got = clock.event()

        def deliver(rank: int) -> None:
            monitor.beat(rank)
            got.set(rank)

        src.start(deliver, loop.call_soon_threadsafe)
        try:
            await asyncio.to_thread(
                subprocess.run,
                ["sh", "-c", f'echo > "${ENV_PROGRESS_FILE}"'],
                env={**os.environ, **src.env_for(3)},
                check=True,
            )
            await clock.timeout(5.0, got.wait())
            return monitor.watcher.watched()
        finally:
            src.stop()

    assert asyncio.run(main()) == [3]
