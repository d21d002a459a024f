"""The launcher API from Python: ``elastic_launch(config, fn)(*args)`` and torch's agent ctor."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest

from elastic.agent.server.api import WorkerSpec, WorkerState
from elastic.agent.server.local_elastic_agent import LocalElasticAgent
from elastic.errors import ConfigError
from elastic.launcher.api import LaunchConfig, elastic_launch
from elastic.memstore import MemoryStore
from elastic.multiprocessing.api import DefaultLogsSpecs, Std
from elastic.multiprocessing.errors import ChildFailedError
from elastic.real.clock import AsyncioClock
from elastic.rendezvous.api import RendezvousParameters
from elastic.rendezvous.registry import get_rendezvous_handler
from tests.test_run_cli import TAG, tag

__all__ = ["tag"]


def square_of_rank(offset: int) -> dict[str, int]:
    rank = int(os.environ["RANK"])
    return {"rank": rank, "value": rank * rank + offset}


def rank_zero_last() -> int:
    rank = int(os.environ["RANK"])
    if rank == 0:
        time.sleep(1.0)  # the others end first
    return rank


def fail_on_rank_one() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("rank one refuses")


def _config(tmp_path: Path, n: int = 2, **kw: object) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=n,
        run_id="launcher-test",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        log_dir=str(tmp_path / "logs"),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def tagged(tag: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TAG, tag)  # workers inherit it: the sweep finds leftovers
    return tag


@pytest.mark.timeout(60)
def test_function_entrypoint_returns_values_by_global_rank(tmp_path: Path, tagged: str) -> None:
    values = elastic_launch(_config(tmp_path), square_of_rank)(10)
    assert values == {0: {"rank": 0, "value": 10}, 1: {"rank": 1, "value": 11}}


@pytest.mark.timeout(60)
def test_return_values_come_in_rank_order_whatever_order_the_workers_end_in(
    tmp_path: Path, tagged: str
) -> None:
    values = elastic_launch(_config(tmp_path, n=3), rank_zero_last)()
    assert list(values.items()) == [(0, 0), (1, 1), (2, 2)]  # programs iterate over them


class _Model:
    """An object that is not data: it reaches a forked worker as it is."""

    def __init__(self, w: int) -> None:
        self.w = w

    def __call__(self, x: int) -> int:
        return self.w * x


def apply_model(model: _Model, offset: Any) -> int:
    return model(int(os.environ["RANK"])) + offset()


@pytest.mark.timeout(60)
def test_a_forked_function_worker_takes_any_object_as_torchs_fork_does(
    tmp_path: Path, tagged: str
) -> None:
    # notebook launchers (accelerate's) fork workers with a model and closures as the
    # arguments: inherited, nothing written down or read back
    shift = 100
    fork = _config(tmp_path, start_method="fork")
    values = elastic_launch(fork, apply_model)(_Model(3), lambda: shift)
    assert values == {0: 100, 1: 103}
    # spawn must write them down for the new interpreter: data only, one line why
    with pytest.raises(ConfigError, match=r"args\[0\] is a _Model, which is not data"):
        elastic_launch(_config(tmp_path), apply_model)(_Model(3), lambda: shift)


@pytest.mark.timeout(60)
def test_failing_function_raises_child_failed_error_naming_it(tmp_path: Path, tagged: str) -> None:
    with pytest.raises(ChildFailedError) as info:
        elastic_launch(_config(tmp_path), fail_on_rank_one)()
    rank, failure = info.value.get_first_failure()
    assert rank == 1 and failure.exitcode != 0
    assert "fail_on_rank_one FAILED" in str(info.value)
    assert "ValueError: rank one refuses" in str(info.value)


@pytest.mark.timeout(30)
def test_several_nodes_on_an_any_port_endpoint_are_refused_before_anything_starts(
    tmp_path: Path, tagged: str
) -> None:
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=2,
        nproc_per_node=1,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
    )
    with pytest.raises(ConfigError, match=r"--rdzv-endpoint.*port 0.*one-node job"):
        elastic_launch(config, square_of_rank)(0)


@pytest.mark.timeout(60)
def test_local_elastic_agent_with_torchs_constructor_runs_a_command(
    tmp_path: Path, tagged: str, capfd: pytest.CaptureFixture[str]
) -> None:
    clock = AsyncioClock()
    params = RendezvousParameters("c10d", "localhost:0", "ctor-test", 1, 1)
    handler = get_rendezvous_handler(params, store=MemoryStore(clock), clock=clock, node="n0")
    spec = WorkerSpec(
        role="trainer",
        local_world_size=2,
        entrypoint="/bin/sh",
        # local rank 1 fails only after rank 0 has exited 0 and been reaped (it waits for
        # rank 0's pid file, then for that pid to be gone): had it failed first, the
        # agent's stop would have ended rank 0 too, and torch's report lists that rank as
        # well (exit -15)
        args=(
            "-c",
            'test "$ROLE_NAME" = trainer || exit 3; '
            f'if [ "$LOCAL_RANK" = 0 ]; then echo up; echo $$ > {tmp_path}/r0.tmp; '
            f"mv {tmp_path}/r0.tmp {tmp_path}/r0; exit 0; fi; "
            f"while [ ! -e {tmp_path}/r0 ]; do sleep 0.02; done; "
            f'while kill -0 "$(cat {tmp_path}/r0)" 2>/dev/null; do sleep 0.02; done; exit 1',
        ),
        rdzv_handler=handler,
        max_restarts=0,
    )
    logs = DefaultLogsSpecs(str(tmp_path / "logs"), tee=Std.OUT)
    agent = LocalElasticAgent(spec, logs, "spawn")
    result = agent.run()
    assert result is not None and result.state == WorkerState.FAILED
    (failure,) = result.failures.values()
    assert failure.exitcode == 1 and failure.local_rank == 1
    assert list(result.failures) == [1]  # keyed by global rank
    # the tee'd console lines' prefix names the spec's role, read when the group starts
    assert "[trainer0]:up" in capfd.readouterr().out


def test_local_elastic_agent_constructor_reads_only_what_torchs_does(tmp_path: Path) -> None:
    # torch's constructor takes any spec-like object: it reads the restarts, the number
    # of workers and the handler, not the role (read when the workers start)
    spec = Mock(spec=WorkerSpec)
    spec.max_restarts = 3
    spec.local_world_size = 1
    spec.rdzv_handler = Mock()
    spec.numa_options = None
    agent = LocalElasticAgent(
        spec,
        DefaultLogsSpecs(str(tmp_path / "logs")),
        "spawn",
        exit_barrier_timeout=300,
        shutdown_timeout=240,
    )
    assert agent._shutdown_timeout == 240 and agent._exit_barrier_timeout == 300
    assert agent._remaining_restarts == 3


def test_the_entrypoint_name_follows_torchs_rule() -> None:
    import sys

    from elastic.launcher.api import _get_entrypoint_name

    def simple_rank_scale() -> None:
        pass

    assert _get_entrypoint_name(simple_rank_scale, []) == "simple_rank_scale"
    assert _get_entrypoint_name(sys.executable, []) == ""
    assert _get_entrypoint_name(sys.executable, ["-u"]) == ""
    assert _get_entrypoint_name(sys.executable, ["-u", "train.py"]) == "train.py"
    assert _get_entrypoint_name("/bin/echo", ["hi"]) == "/bin/echo"
    assert _get_entrypoint_name(None, []) == ""
