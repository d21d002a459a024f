"""torch 2.13's uninterruptible-sleep check: a worker in D-state for
``uninterruptible_state_timeout`` seconds (or ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``)
makes the group unhealthy with no restart, in elastic's event-driven agent and under
torch's synchronous hooks.  The kernel is faked at ``read_proc_state`` (a real D-state
needs a wedged driver), which is where torch's own tests patch it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import elastic.agent.server.local_elastic_agent as lea
from elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from elastic.multiprocessing import DefaultLogsSpecs
from elastic.utils.process_state import is_uninterruptible_state, read_proc_state
from tests.leftovers import no_leftover_processes
from tests.test_torch_local_subclass import one_node_handler

pytestmark = pytest.mark.timeout(90)
ENV = "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"


@pytest.fixture(autouse=True)
def leaves_no_process() -> Iterator[None]:
    with no_leftover_processes():
        yield


def sleep_long() -> None:
    time.sleep(60)


class TorchStyle(lea.LocalElasticAgent):
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        return super()._monitor_workers(worker_group)


def agent(
    cls: type[lea.LocalElasticAgent], tmp_path: Path, timeout: float | None
) -> lea.LocalElasticAgent:
    spec = WorkerSpec(
        role="trainer",
        local_world_size=2,
        entrypoint=sleep_long,
        rdzv_handler=one_node_handler(),
        max_restarts=3,
        monitor_interval=0.05,
    )
    return cls(
        spec,
        DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
        "spawn",
        2,
        None,
        5,
        None,
        timeout,  # torch's eighth positional argument
    )


def stuck_workers(monkeypatch: pytest.MonkeyPatch, a: lea.LocalElasticAgent) -> list[int]:
    """Every worker of the agent reads as D; anything else as S."""
    asked: list[int] = []

    def fake(pid: int) -> str:
        asked.append(pid)
        group = a._pcontext or a._group
        return "D" if group is not None and pid in group.pids().values() else "S"

    monkeypatch.setattr(lea, "read_proc_state", fake)
    return asked


@pytest.mark.parametrize("cls", [lea.LocalElasticAgent, TorchStyle], ids=["elastic", "torch"])
def test_workers_stuck_in_d_state_end_the_run_unhealthy_without_a_restart(
    cls: type[lea.LocalElasticAgent], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = agent(cls, tmp_path, 0.3)
    asked = stuck_workers(monkeypatch, a)
    started = time.monotonic()
    try:
        result = a.run()
    finally:
        a._worker_group.spec.rdzv_handler.shutdown()
    assert result is not None
    assert result.state in {WorkerState.UNHEALTHY, WorkerState.FAILED}
    assert result.state != WorkerState.SUCCEEDED
    assert a._remaining_restarts == 0  # 3 were allowed: the check disabled them
    assert asked  # the kernel was asked
    assert time.monotonic() - started < 30  # not the workers' 60 s


def test_no_timeout_no_look_at_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    a = agent(lea.LocalElasticAgent, tmp_path, None)
    assert a._uninterruptible_state_timeout == 0
    assert not any(isinstance(w, lea._UninterruptibleWatch) for w in a._health_watches)


@pytest.mark.parametrize(
    "explicit, env, expected",
    [(None, None, 0.0), (None, "2.5", 2.5), (1.0, "2.5", 1.0), (None, "-3", 0.0),
     (None, "soon", 0.0), (-1.0, "4", 0.0), (None, "", 0.0)],
)  # fmt: skip
def test_the_timeout_is_the_argument_else_the_environment_else_off(
    explicit: float | None, env: str | None, expected: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, env)
    assert lea._resolve_uninterruptible_state_timeout(explicit) == expected


def sleeper_seen_sleeping(program: str) -> int:
    """Start ``program`` sleeping; return its pid once /proc reads it as ``S``; it is
    killed and reaped after."""
    p = subprocess.Popen([program, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while read_proc_state(p.pid) != "S":
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        p.kill()
        p.wait()
    return p.pid


def test_read_proc_state_reads_a_live_process_and_none_for_a_gone_one() -> None:
    pid = sleeper_seen_sleeping(sys.executable)
    assert read_proc_state(pid) is None
    assert read_proc_state(os.getpid()) in {"R", "S"}


def test_a_command_name_with_parentheses_and_spaces_is_parsed_from_the_last_paren(
    tmp_path: Path,
) -> None:
    exe = tmp_path / "a) D (b"
    exe.symlink_to(sys.executable)
    sleeper_seen_sleeping(str(exe))


def test_d_and_its_variants_are_uninterruptible() -> None:
    assert is_uninterruptible_state("D") and is_uninterruptible_state("D+")
    assert not any(is_uninterruptible_state(s) for s in ("R", "S", "Z", "T", None, ""))


def test_torchs_monitor_marks_the_group_unhealthy_once_the_dwell_reaches_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the shape of torch's own unit check: a context mock, the kernel and the clock patched
    from unittest.mock import Mock

    from elastic.agent.server.api import Worker

    spec = WorkerSpec(
        role="r", local_world_size=1, entrypoint="x", rdzv_handler=Mock(), max_restarts=3
    )
    a = lea.LocalElasticAgent(
        spec, DefaultLogsSpecs(log_dir=str(tmp_path)), uninterruptible_state_timeout=5
    )
    wg = a._worker_group
    wg.workers = [Worker(local_rank=0, global_rank=0, role_rank=0, world_size=1, role_world_size=1)]
    wg.workers[0].id = 123
    a._pcontext = Mock()
    a._pcontext.pids.return_value = {0: 123}
    a._pcontext.wait.return_value = None
    now = [100.0]
    monkeypatch.setattr(lea, "read_proc_state", lambda pid: "D")
    monkeypatch.setattr(lea.time, "monotonic", lambda: now[0])
    states = []
    for t in (100.0, 104.0, 106.0):
        now[0] = t
        states.append(a._monitor_workers(wg).state)
    assert states == [WorkerState.HEALTHY, WorkerState.HEALTHY, WorkerState.UNHEALTHY]
    assert a._remaining_restarts == 0
    assert a._uninterruptible_state_first_seen == {123: 100.0}
