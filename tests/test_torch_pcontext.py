"""torch's multiprocessing API: start_processes, PContext, RunProcsResult (what api_test checks)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from elastic.errors import ConfigError
from elastic.multiprocessing import (
    DefaultLogsSpecs,
    PContext,
    ProcessFailure,
    RunProcsResult,
    Std,
    start_processes,
)

pytestmark = pytest.mark.timeout(60)


def echo_twice(msg: str, rank: int) -> str:
    """A function entrypoint: prints, returns a JSON value."""
    print(f"{msg} from {rank}", flush=True)
    print(f"err {rank}", file=sys.stderr, flush=True)
    return f"{msg}{rank}"


def fail_on(rank: int, bad: int) -> int:
    if rank == bad:
        raise RuntimeError(f"rank {rank} fails")
    return rank


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for p in left:
        p.kill()
    assert left == [], f"processes left behind: {left}"


def envs(n: int) -> dict[int, dict[str, str]]:
    return {r: {"LOCAL_RANK": str(r), "TORCHELASTIC_RUN_ID": "pc"} for r in range(n)}


def test_binary_processes_with_redirects_give_torchs_result(tmp_path: Path) -> None:
    pc = start_processes(
        "echo",
        "/bin/sh",
        {r: ("-c", f"echo out{r}; echo err{r} >&2") for r in range(2)},
        envs(2),
        DefaultLogsSpecs(str(tmp_path), redirects=Std.ALL),
    )
    assert isinstance(pc, PContext) and set(pc.pids()) == {0, 1}
    result = pc.wait()
    pc.close()
    assert isinstance(result, RunProcsResult) and not result.is_failed()
    assert set(result.return_values) == {0, 1}
    for r in (0, 1):
        assert Path(result.stdouts[r]).read_text() == f"out{r}\n"
        assert Path(result.stderrs[r]).read_text() == f"err{r}\n"
        assert Path(result.stdouts[r]).parent.name == str(r)


def test_function_processes_return_their_values_by_rank(tmp_path: Path) -> None:
    pc = start_processes(
        "fn",
        echo_twice,
        {r: ("hi", r) for r in range(3)},
        envs(3),
        DefaultLogsSpecs(str(tmp_path), redirects={0: Std.OUT}, tee={1: Std.ERR}),
    )
    result = pc.wait()
    pc.close()
    assert result is not None and result.return_values == {0: "hi0", 1: "hi1", 2: "hi2"}
    assert Path(result.stdouts[0]).read_text() == "hi from 0\n"
    assert result.stdouts[1] == "" and Path(result.stderrs[1]).read_text() == "err 1\n"


def test_a_failed_process_stops_the_others_and_is_reported_with_its_error(
    tmp_path: Path,
) -> None:
    pc = start_processes(
        "fail",
        "/bin/sh",
        {0: ("-c", "exit 3"), 1: ("-c", "sleep 60")},
        envs(2),
        DefaultLogsSpecs(str(tmp_path)),
    )
    sleeper = pc.pids()[1]
    result = pc.wait()
    pc.close()
    assert result is not None and result.is_failed()
    # the peer stopped because of it is listed too, as torch's binary runs list it
    assert set(result.failures) == {0, 1} and result.return_values == {}
    failure = result.failures[0]
    assert isinstance(failure, ProcessFailure)
    assert (failure.local_rank, failure.exitcode) == (0, 3)
    assert result.failures[1].exitcode == -15
    assert not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == "zombie"


def test_a_failed_function_carries_its_error_file(tmp_path: Path) -> None:
    pc = start_processes(
        "fail", fail_on, {0: (0, 1), 1: (1, 1)}, envs(2), DefaultLogsSpecs(str(tmp_path))
    )
    result = pc.wait()
    pc.close()
    assert result is not None and list(result.failures) == [1]
    failure = result.failures[1]
    assert failure.exitcode == 1
    assert "rank 1 fails" in str(failure.message)


def test_wait_with_zero_timeout_returns_none_while_running_and_close_stops_them(
    tmp_path: Path,
) -> None:
    pc = start_processes(
        "sleep", "/bin/sleep", {0: ("60",), 1: ("60",)}, envs(2), DefaultLogsSpecs(str(tmp_path))
    )
    pids = list(pc.pids().values())
    assert pc.wait(timeout=0) is None
    assert pc.wait(timeout=0.2) is None
    pc.close(death_sig=signal.SIGTERM, timeout=5)
    pc.close()  # idempotent
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_function_arguments_must_be_json_nothing_is_pickled(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be JSON values") as e:
        start_processes(
            "bad", echo_twice, {0: (object(), 0)}, envs(1), DefaultLogsSpecs(str(tmp_path))
        )
    assert isinstance(e.value, ValueError)


def test_args_and_envs_must_name_the_same_local_ranks(tmp_path: Path) -> None:
    # torch's _validate_full_rank: a RuntimeError naming the mapping
    with pytest.raises(RuntimeError, match="envs, local rank mapping mismatch"):
        start_processes(
            "bad", "/bin/true", {0: (), 1: ()}, {0: {}}, DefaultLogsSpecs(str(tmp_path))
        )


def test_forkserver_starts_fresh_interpreters_like_spawn(tmp_path: Path) -> None:
    pc = start_processes(
        "fs",
        echo_twice,
        {0: ("fs", 0)},
        envs(1),
        DefaultLogsSpecs(str(tmp_path)),
        start_method="forkserver",
    )
    result = pc.wait()
    pc.close()
    assert result is not None and result.return_values == {0: "fs0"}


def test_envs_reach_the_processes_on_top_of_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELASTIC_PCONTEXT_PROBE", "from-parent")
    pc = start_processes(
        "env",
        "/bin/sh",
        {0: ("-c", 'echo "$LOCAL_RANK $ELASTIC_PCONTEXT_PROBE"')},
        envs(1),
        DefaultLogsSpecs(str(tmp_path), redirects=Std.OUT),
    )
    result = pc.wait()
    pc.close()
    assert result is not None
    assert Path(result.stdouts[0]).read_text() == "0 from-parent\n"
