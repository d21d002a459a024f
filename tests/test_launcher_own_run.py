"""``launch_agent`` with an agent whose ``run()`` is its own -- overridden and calling
``super().run()``, or a ``LocalElasticAgent`` subclass written against torch's
synchronous hooks -- calls it on the launching thread, as torch does, while the store
and the handler run on a loop thread of the launch (``_launch_with_run_on_this_thread``):
``asyncio.run`` inside ``run()``, the handler's synchronous calls and torch's
``SignalException`` all work."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import pytest

from elastic.agent.server.api import RunResult, WorkerGroup
from elastic.agent.server.local_elastic_agent import LocalElasticAgent
from elastic.launcher.api import LaunchConfig, launch_agent
from elastic.multiprocessing.api import SignalException
from tests.leftovers import no_leftover_processes

pytestmark = pytest.mark.timeout(90)
AGENT = "elastic.launcher.api.LocalElasticAgent"


@pytest.fixture(autouse=True)
def leaves_no_process() -> Iterator[None]:
    with no_leftover_processes():
        yield


def config(tmp_path: Path, nproc: int = 2) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex[:8],
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.05,
        start_method="spawn",
        log_dir=str(tmp_path / "logs"),
    )


def hundred_plus_rank() -> int:
    return 100 + int(os.environ["RANK"])


def sleep_long() -> None:
    import time

    time.sleep(60)


class WrapsRun(LocalElasticAgent):
    threads: ClassVar[list[str]] = []

    def run(self, role: str = "default") -> RunResult | None:
        WrapsRun.threads.append(threading.current_thread().name)
        return super().run(role)


class PollsLikeTorch(LocalElasticAgent):
    polls = 0

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        PollsLikeTorch.polls += 1
        return super()._monitor_workers(worker_group)


class KilledWhilePolling(LocalElasticAgent):
    pids: ClassVar[list[int]] = []

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if not KilledWhilePolling.pids:
            KilledWhilePolling.pids = [w.id for w in worker_group.workers]
            os.kill(os.getpid(), signal.SIGTERM)  # torch's handler: SignalException
        return result


def test_a_run_that_calls_super_run_runs_on_the_launching_thread(tmp_path: Path) -> None:
    WrapsRun.threads = []
    with mock.patch(AGENT, WrapsRun):
        assert launch_agent(config(tmp_path), hundred_plus_rank, []) == {0: 100, 1: 101}
    assert WrapsRun.threads == [threading.current_thread().name]


def test_a_subclass_written_for_torch_polls_through_the_launch(tmp_path: Path) -> None:
    PollsLikeTorch.polls = 0
    with mock.patch(AGENT, PollsLikeTorch):
        assert launch_agent(config(tmp_path), hundred_plus_rank, []) == {0: 100, 1: 101}
    assert PollsLikeTorch.polls >= 1


def test_a_signal_during_a_torch_style_run_stops_the_workers_and_is_raised(
    tmp_path: Path,
) -> None:
    KilledWhilePolling.pids = []
    with mock.patch(AGENT, KilledWhilePolling), pytest.raises(SignalException) as e:
        launch_agent(config(tmp_path), sleep_long, [])
    assert e.value.sigval == signal.SIGTERM
    assert len(KilledWhilePolling.pids) == 2
    # the leftover sweep (the fixture) checks that both sleepers are gone


def test_a_run_that_fails_raises_its_error_and_closes_the_store(tmp_path: Path) -> None:
    class Fails(LocalElasticAgent):
        def run(self, role: str = "default") -> Any:
            raise RuntimeError("run failed on purpose")

    with mock.patch(AGENT, Fails), pytest.raises(RuntimeError, match="on purpose"):
        launch_agent(config(tmp_path), hundred_plus_rank, [])
    # the launch's loop thread (which hosted the store) is gone with it
    assert not [t for t in threading.enumerate() if t.name == "elastic-launch"]


class UsrSignalled(LocalElasticAgent):
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        os.kill(os.getpid(), signal.SIGUSR1)
        return result


def test_the_launchs_signals_to_handle_are_the_torch_style_contexts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHELASTIC_SIGNALS_TO_HANDLE", raising=False)
    conf = config(tmp_path)
    conf.signals_to_handle = "SIGUSR1"
    with mock.patch(AGENT, UsrSignalled), pytest.raises(SignalException) as e:
        launch_agent(conf, sleep_long, [])
    assert e.value.sigval == signal.SIGUSR1
    assert "TORCHELASTIC_SIGNALS_TO_HANDLE" not in os.environ  # set for the start only
