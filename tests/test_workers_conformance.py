"""Every workers-port implementation passes the shipped suite (elastic.testing.workers).

The real port (:class:`ProcessWorkers`: processes, pidfds, signals) on asyncio, and the
simulator's (:class:`SimWorkers`, the worker model) on simpy.  Real workers are asked to
exit through SIGUSR1 and a file holding the code; the ``sweep`` of tests.leftovers fails
a test that leaves a process behind.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from elastic.clock import Clock
from elastic.multiprocessing.api import DefaultLogsSpecs
from elastic.real.workers import ProcessWorkers
from elastic.testing.workers import ALL_CHECKS, WorkersCheck
from elastic.workers import RunningGroup, WorkerLaunch
from sim.scenario.model import Job
from sim.workers import SimGroup, SimWorkers, Training
from tests.leftovers import no_leftover_processes
from tests.worlds import run_in

_WORKER = """
import os, signal, sys
d = sys.argv[1]
def leave(*_):
    with open(os.path.join(d, f"code-{os.getpid()}")) as f:
        sys.exit(int(f.read()))
signal.signal(signal.SIGUSR1, leave)
open(os.path.join(d, f"ready-{os.getpid()}"), "w").close()
while True:
    signal.pause()
"""


class RealHarness:
    wait = 20.0

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        self.port = ProcessWorkers(
            DefaultLogsSpecs(str(tmp / "logs")),
            console_out=io.BytesIO(),
            console_err=io.BytesIO(),
        )

    def launches(self, n: int) -> Sequence[WorkerLaunch]:
        env = {"TORCHELASTIC_RUN_ID": "conformance"}
        return [
            WorkerLaunch(
                r, r, {**env, "LOCAL_RANK": str(r)}, sys.executable, ("-c", _WORKER, str(self.dir))
            )
            for r in range(n)
        ]

    async def make_exit(self, group: RunningGroup, local_rank: int, code: int) -> None:
        pid = group.pids()[local_rank]
        ready = self.dir / f"ready-{pid}"
        for _ in range(2000):  # the worker's handler is installed (test side, 5 ms steps)
            if ready.exists():
                break
            await asyncio.sleep(0.005)
        (self.dir / f"code-{pid}").write_text(str(code))
        os.kill(pid, signal.SIGUSR1)


class SimHarness:
    wait = 60.0

    def __init__(self, clock: Clock) -> None:
        from elastic.events import ListSink
        from sim.clock import SimClock

        assert isinstance(clock, SimClock)
        job = Job(steps=10**9, step_time=1.0, collective_timeout=1e6)
        self.port = SimWorkers("n0", Training(clock, job, ListSink()))

    def launches(self, n: int) -> Sequence[WorkerLaunch]:
        return [
            WorkerLaunch(r, r, {"WORLD_SIZE": str(n), "LOCAL_RANK": str(r)}, "train.py")
            for r in range(n)
        ]

    async def make_exit(self, group: RunningGroup, local_rank: int, code: int) -> None:
        assert isinstance(group, SimGroup)
        assert group.exit(local_rank, code)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.timeout(120)
def test_real_workers_pass(check: WorkersCheck, tmp_path: Path) -> None:
    harnesses: list[RealHarness] = []

    async def body(clock: Clock) -> None:
        h = RealHarness(tmp_path)
        harnesses.append(h)
        try:
            await check(clock, h)
        finally:
            await h.port.aclose(sweep=True)

    with no_leftover_processes(lambda: [h.port.agent_marker for h in harnesses]):
        run_in("real", body)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_simulated_workers_pass(check: WorkersCheck) -> None:
    async def body(clock: Clock) -> None:
        await check(clock, SimHarness(clock))

    run_in("sim", body)


def test_a_port_that_reports_the_wrong_code_fails_the_check() -> None:
    class Lies(SimHarness):
        async def make_exit(self, group: RunningGroup, local_rank: int, code: int) -> None:
            await super().make_exit(group, local_rank, code + 1)

    async def body(clock: Clock) -> None:
        with pytest.raises(AssertionError):
            await ALL_CHECKS[1](clock, Lies(clock))

    run_in("sim", body)
