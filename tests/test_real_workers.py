"""The real workers port with real processes: exits, stop, process trees, orphans, logs.

Every test has a time limit and the ``sweep`` fixture fails it if any process it started
(or any process carrying its agent marker) is still alive afterwards.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from elastic.errors import ConfigError
from elastic.multiprocessing.api import DefaultLogsSpecs, Std
from elastic.real import proctree
from elastic.real.workers import ProcessGroup, ProcessWorkers
from elastic.workers import ExitCause, WorkerExit, WorkerLaunch
from tests.leftovers import gone, no_leftover_processes

PY = sys.executable


# -- leftovers ---------------------------------------------------------------------------


_gone = gone


def wait_all_gone(pids: set[int], timeout: float) -> tuple[bool, float]:
    """(all gone?, seconds it took); checks every 5 ms (test-side only)."""
    t0 = time.monotonic()
    while True:
        if all(_gone(p) for p in pids):
            return True, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return False, time.monotonic() - t0
        time.sleep(0.005)


Sweep = list[ProcessWorkers | proctree.Marker]


@pytest.fixture
def sweep() -> Iterator[list[ProcessWorkers | proctree.Marker]]:
    """Yields a list to put agents (or their markers) in; fails the test if anything is left."""
    agents: list[ProcessWorkers | proctree.Marker] = []

    def markers() -> list[proctree.Marker | None]:
        return [a.agent_marker if isinstance(a, ProcessWorkers) else a for a in agents]

    with no_leftover_processes(markers):
        yield agents


def make_workers(sweep: Sweep, tmp_path: Path, **kw: Any) -> ProcessWorkers:
    kw.setdefault("console_out", io.BytesIO())
    kw.setdefault("console_err", io.BytesIO())
    specs = kw.pop("logs_specs", None) or DefaultLogsSpecs(str(tmp_path / "logs"))
    pw = ProcessWorkers(specs, **kw)
    sweep.append(pw)
    return pw


def launch(
    rank: int, entrypoint: Any, *args: Any, env: dict[str, str] | None = None, attempt: int = 0
) -> WorkerLaunch:
    base = {"TORCHELASTIC_RUN_ID": "t", "LOCAL_RANK": str(rank)}
    return WorkerLaunch(rank, rank, {**base, **(env or {})}, entrypoint, args, attempt)


def py(code: str, *args: str) -> tuple[Any, ...]:
    return (PY, "-c", textwrap.dedent(code), *args)


async def wait_file(path: Path, timeout: float = 10.0) -> str:
    """Test-side wait for a worker to say it is ready (it writes the file atomically)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.01)
    return path.read_text()


async def collect(group: ProcessGroup, n: int) -> list[WorkerExit]:
    return [await asyncio.wait_for(group.next_exit(), 20) for _ in range(n)]


# -- worker functions for function entrypoints (spawn finds them by name) ----------------


def fn_add(x: int, y: int) -> dict[str, Any]:
    return {"sum": x + y, "local_rank": int(os.environ["LOCAL_RANK"])}


def fn_unserialisable() -> object:
    return object()


def fn_raise() -> None:
    raise ValueError("boom in worker")


def fn_exit(code: int) -> None:
    sys.exit(code)


# -- exits -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_exit_codes_signals_and_order_are_reported(sweep: Sweep, tmp_path: Path) -> None:
    def gated(r: int, code: str) -> tuple[Any, ...]:
        # each ends when the test says so: the order is the test's, whatever the load
        go = str(tmp_path / f"go.{r}")
        wait = f"import os, sys, time\nwhile not os.path.exists({go!r}): time.sleep(0.005)\n"
        return py(wait + code)

    async def main() -> list[WorkerExit]:
        async with make_workers(sweep, tmp_path) as pw:
            group = await pw.start(
                [
                    launch(0, *gated(0, "sys.exit(3)")),
                    launch(1, *gated(1, "os.kill(os.getpid(), 9)")),
                    launch(2, *gated(2, "pass")),
                ]
            )
            assert set(group.pids()) == {0, 1, 2}
            exits = []
            for r in (1, 2, 0):
                (tmp_path / f"go.{r}").touch()
                exits += await collect(group, 1)
            assert group.running() == frozenset()
            with pytest.raises(RuntimeError, match="already returned"):
                await group.next_exit()
            await group.stop(1.0)
            return exits

    exits = asyncio.run(main())
    assert [(e.local_rank, e.exit_code) for e in exits] == [(1, -9), (2, 0), (0, 3)]
    assert [e.cause for e in exits] == [ExitCause.SIGNALED, ExitCause.EXITED, ExitCause.EXITED]
    assert all(e.pid for e in exits)
    assert exits[0].time <= exits[1].time <= exits[2].time


@pytest.mark.timeout(60)
def test_exit_is_reported_within_milliseconds_of_the_kernel(sweep: Sweep, tmp_path: Path) -> None:
    """The worker writes CLOCK_MONOTONIC just before ``_exit``; the report follows at once."""
    stamp = tmp_path / "stamp"
    code = f"""
        import os, time
        t = time.monotonic()
        open({str(stamp)!r}, "w").write(repr(t))
        os._exit(7)
    """

    async def main() -> WorkerExit:
        async with make_workers(sweep, tmp_path) as pw:
            group = await pw.start([launch(0, *py(code))])
            (ex,) = await collect(group, 1)
            await group.stop(1.0)
            return ex

    # the best of three: one scheduling stall of a busy machine is not what is measured
    latencies = []
    for _ in range(3):
        ex = asyncio.run(main())
        latency = ex.time - float(stamp.read_text())
        assert ex.exit_code == 7 and latency >= 0
        latencies.append(latency)
        if latency < 0.1:
            break
    latency = min(latencies)
    assert latency < 0.1, f"exit reported {latency * 1000:.1f} ms after it happened"
    print(f"exit reported {latency * 1000:.1f} ms after the worker's last instruction")


@pytest.mark.timeout(60)
def test_signal_sent_by_agent_is_reported_as_stopped_by_agent(sweep: Sweep, tmp_path: Path) -> None:
    async def main() -> WorkerExit:
        async with make_workers(sweep, tmp_path) as pw:
            group = await pw.start([launch(0, "sleep", "30")])
            group.signal(signal.SIGUSR1, 0)
            (ex,) = await collect(group, 1)
            await group.stop(1.0)
            return ex

    ex = asyncio.run(main())
    assert ex.exit_code == -signal.SIGUSR1
    assert ex.cause is ExitCause.STOPPED_BY_AGENT


# -- stop ---------------------------------------------------------------------------------

IGNORE_TERM = """
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(sys.argv[1] + ".tmp", "w").close(); os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_stop_kills_a_worker_that_ignores_sigterm_after_grace(sweep: Sweep, tmp_path: Path) -> None:
    grace = 1.0

    async def main() -> tuple[list[WorkerExit], float]:
        async with make_workers(sweep, tmp_path) as pw:
            ready = tmp_path / "ready"
            group = await pw.start(
                [
                    launch(0, *py(IGNORE_TERM, str(ready))),
                    launch(1, "sleep", "60"),
                ]
            )
            await wait_file(ready)
            t0 = time.monotonic()
            exits = await group.stop(grace)
            took = time.monotonic() - t0
            assert group.running() == frozenset()
            return exits, took

    exits, took = asyncio.run(main())
    by_rank = {e.local_rank: e for e in exits}
    assert by_rank[0].exit_code == -signal.SIGKILL
    assert by_rank[1].exit_code == -signal.SIGTERM
    assert {e.cause for e in exits} == {ExitCause.STOPPED_BY_AGENT}
    # the grace is waited, and not much more (a loaded machine adds a little)
    assert grace <= took < grace + 2.0, f"stop took {took:.3f} s for grace {grace}"
    print(f"stop(grace={grace}) with a SIGTERM-ignoring worker took {took:.3f} s")


@pytest.mark.timeout(60)
def test_stop_returns_as_soon_as_workers_honour_sigterm(sweep: Sweep, tmp_path: Path) -> None:
    async def main() -> float:
        async with make_workers(sweep, tmp_path) as pw:
            group = await pw.start([launch(r, "sleep", "60") for r in range(4)])
            t0 = time.monotonic()
            exits = await group.stop(30.0)
            assert sorted(e.exit_code for e in exits) == [-signal.SIGTERM] * 4
            # the same exits are also queued for next_exit, once each
            assert len(await collect(group, 4)) == 4
            assert await group.stop(30.0) == exits  # a second stop is a no-op
            return time.monotonic() - t0

    assert asyncio.run(main()) < 5.0  # not the 30 s grace


GRANDCHILD = """
    import os, signal, sys, time
    pidfile, worker_exits = sys.argv[1], sys.argv[2] == "1"
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:  # and a great-grandchild in the new session
            time.sleep(60)
            os._exit(0)
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(60)
        os._exit(0)
    if worker_exits:
        while not os.path.exists(pidfile):
            time.sleep(0.01)
        sys.exit(5)
    time.sleep(60)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_exits_first", [False, True], ids=["live-parent", "orphaned"])
def test_stop_kills_a_setsid_grandchild_and_its_children(
    sweep: Sweep, tmp_path: Path, worker_exits_first: bool
) -> None:
    pidfile = tmp_path / "grandchild.pid"

    async def main() -> set[int]:
        async with make_workers(sweep, tmp_path) as pw:
            group = await pw.start(
                [launch(0, *py(GRANDCHILD, str(pidfile), "1" if worker_exits_first else "0"))]
            )
            grandchild = int(await wait_file(pidfile))
            family = {grandchild} | {c.pid for c in psutil.Process(grandchild).children()}
            assert len(family) == 2
            if worker_exits_first:
                (ex,) = await collect(group, 1)
                assert ex.exit_code == 5
                assert all(not _gone(p) for p in family)  # orphans, still running
            await group.stop(0.3)
            return family

    family = asyncio.run(main())
    ok, _ = wait_all_gone(family, 0.0)
    assert ok, "stop() returned while descendants were still alive"


# -- no orphans when the agent dies ------------------------------------------------------

AGENT = """
    import asyncio, json, signal, sys
    from elastic.multiprocessing.api import DefaultLogsSpecs
    from elastic.real.workers import ProcessWorkers
    from elastic.workers import WorkerLaunch

    GRANDCHILD = {grandchild!r}

    async def main():
        log_dir, pidfile = sys.argv[1], sys.argv[2]
        pw = ProcessWorkers(DefaultLogsSpecs(log_dir))
        group = await pw.start([
            WorkerLaunch(0, 0, {{}}, sys.executable, ("-c", GRANDCHILD, pidfile, "0")),
            WorkerLaunch(1, 1, {{}}, "sleep", ("60",)),
        ])
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print(json.dumps({{"workers": sorted(group.pids().values()), "reaper": pw.reaper_pid,
                          "marker": pw.agent_marker.argv()}}), flush=True)
        await stop.wait()
        exits = await group.stop(0.5)
        await pw.aclose()
        print(json.dumps([[e.local_rank, e.exit_code, e.cause.value] for e in exits]), flush=True)

    asyncio.run(main())
"""


def _start_agent(tmp_path: Path) -> tuple[subprocess.Popen[str], dict[str, Any], set[int]]:
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(AGENT).format(grandchild=textwrap.dedent(GRANDCHILD)))
    pidfile = tmp_path / "grandchild.pid"
    agent = subprocess.Popen(
        [PY, str(script), str(tmp_path / "logs"), str(pidfile)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert agent.stdout is not None
    info = json.loads(agent.stdout.readline())
    deadline = time.monotonic() + 10
    while not pidfile.exists():
        assert time.monotonic() < deadline and agent.poll() is None
        time.sleep(0.01)
    grandchild = int(pidfile.read_text())
    everyone = {*info["workers"], grandchild, info["reaper"]}
    everyone |= {c.pid for c in psutil.Process(grandchild).children()}
    assert len(everyone) == 5 and all(not _gone(p) for p in everyone)
    return agent, info, everyone


@pytest.mark.timeout(60)
def test_sigkill_of_the_agent_leaves_no_process_behind(sweep: Sweep, tmp_path: Path) -> None:
    agent, info, everyone = _start_agent(tmp_path)
    sweep.append(proctree.Marker.from_argv(info["marker"]))
    agent.kill()
    agent.wait()
    assert agent.stdout is not None
    agent.stdout.close()  # not communicate(): a surviving worker would hold the pipe open
    ok, took = wait_all_gone(everyone, 1.5)
    assert ok, (
        f"still alive 1.5 s after the agent's SIGKILL: {[p for p in everyone if not _gone(p)]}"
    )
    print(f"all {len(everyone)} processes gone {took * 1000:.0f} ms after the agent's SIGKILL")


@pytest.mark.timeout(60)
def test_sigterm_of_the_agent_stops_every_worker_tree(sweep: Sweep, tmp_path: Path) -> None:
    agent, info, everyone = _start_agent(tmp_path)
    sweep.append(proctree.Marker.from_argv(info["marker"]))
    agent.send_signal(signal.SIGTERM)
    out, _ = agent.communicate(timeout=20)
    assert agent.returncode == 0
    exits = json.loads(out)
    assert sorted(exits) == [
        [0, -signal.SIGTERM, "stopped_by_agent"],
        [1, -signal.SIGTERM, "stopped_by_agent"],
    ]
    ok, _ = wait_all_gone(everyone, 1.0)
    assert ok


# -- entrypoints --------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_function_entrypoint_return_value_reaches_the_agent_as_json(
    sweep: Sweep, tmp_path: Path, start_method: str
) -> None:
    async def main() -> list[WorkerExit]:
        async with make_workers(sweep, tmp_path, start_method=start_method) as pw:
            group = await pw.start([launch(r, fn_add, 10, r) for r in range(2)])
            exits = await collect(group, 2)
            await group.stop(1.0)
            return exits

    exits = sorted(asyncio.run(main()), key=lambda e: e.local_rank)
    assert [e.return_value for e in exits] == [
        {"sum": 10, "local_rank": 0},
        {"sum": 11, "local_rank": 1},
    ]
    assert [e.exit_code for e in exits] == [0, 0]


@pytest.mark.timeout(60)
def test_an_unserialisable_return_value_fails_the_worker_naming_what_is_not_data(
    sweep: Sweep, tmp_path: Path
) -> None:
    async def main() -> WorkerExit:
        async with make_workers(sweep, tmp_path) as pw:
            group = await pw.start([launch(0, fn_unserialisable)])
            (ex,) = await collect(group, 1)
            await group.stop(1.0)
            return ex

    ex = asyncio.run(main())
    # a value that cannot travel as data is the run's failure, never a silent None
    assert ex.exit_code == 1 and ex.return_value is None
    assert ex.error_file is not None
    text = Path(ex.error_file).read_text()
    assert "ReturnValueError" in text and "which is not data" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_function_that_raises_writes_its_error_file(
    sweep: Sweep, tmp_path: Path, start_method: str
) -> None:
    async def main() -> list[WorkerExit]:
        async with make_workers(sweep, tmp_path, start_method=start_method) as pw:
            group = await pw.start([launch(0, fn_raise), launch(1, fn_exit, 4)])
            exits = await collect(group, 2)
            await group.stop(1.0)
            return exits

    raised, exited = sorted(asyncio.run(main()), key=lambda e: e.local_rank)
    assert raised.exit_code == 1 and raised.error_file is not None
    data = json.loads(Path(raised.error_file).read_text())
    assert data["message"]["message"] == "ValueError: boom in worker"
    assert raised.error_file.endswith("attempt_0/0/error.json")
    assert exited.exit_code == 4 and exited.error_file is None


def test_spawn_refuses_lambdas_and_local_functions(tmp_path: Path) -> None:
    def local() -> None:
        pass

    async def main(fn: Callable[..., Any]) -> None:
        pw = ProcessWorkers(DefaultLogsSpecs(str(tmp_path)), reaper=False, subreaper=False)
        await pw.start([launch(0, fn)])

    for fn in (lambda: None, local):
        with pytest.raises(ConfigError, match="lambda or a local function") as info:
            asyncio.run(main(fn))
        assert info.value.where == "entrypoint"


def test_missing_executable_is_a_one_line_config_error(tmp_path: Path) -> None:
    async def main() -> None:
        pw = ProcessWorkers(DefaultLogsSpecs(str(tmp_path)), reaper=False, subreaper=False)
        await pw.start([launch(0, "no-such-program-xyz", "a")])

    with pytest.raises(ConfigError, match="'no-such-program-xyz' was not found on the workers'"):
        asyncio.run(main())


def test_missing_or_unexecutable_program_is_also_torchs_builtin_error(tmp_path: Path) -> None:
    # torch's start_processes lets Popen's FileNotFoundError / PermissionError through;
    # callers catching those keep working, and the CLI still prints one line
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")  # not executable

    async def main(entrypoint: str) -> None:
        pw = ProcessWorkers(DefaultLogsSpecs(str(tmp_path)), reaper=False, subreaper=False)
        await pw.start([launch(0, entrypoint)])

    for entrypoint in ("no-such-program-xyz", str(tmp_path / "missing.py")):
        with pytest.raises(FileNotFoundError) as missing:
            asyncio.run(main(entrypoint))
        assert isinstance(missing.value, ConfigError) and missing.value.where == "entrypoint"
    with pytest.raises(PermissionError) as denied:
        asyncio.run(main(str(script)))
    assert isinstance(denied.value, ConfigError)
    assert (
        str(denied.value)
        == f"entrypoint: {str(script)!r} is not an executable file; give a program path"
    )


@pytest.mark.timeout(60)
def test_local_rank_macro_and_environment_reach_the_worker(
    sweep: Sweep, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FROM_AGENT", "agent")
    monkeypatch.setenv("OVERRIDDEN", "agent")
    code = """
        import json, os, sys
        keys = ["FROM_AGENT", "OVERRIDDEN", "TORCHELASTIC_ERROR_FILE"]
        ours = sorted(k for k in os.environ if k.startswith("ELASTIC_"))
        print(json.dumps({"argv": sys.argv[1:], "ours": ours,
                          **{k: os.environ.get(k) for k in keys}}))
    """

    async def main() -> ProcessWorkers:
        specs = DefaultLogsSpecs(str(tmp_path / "logs"), redirects=Std.OUT)
        async with make_workers(sweep, tmp_path, logs_specs=specs) as pw:
            group = await pw.start(
                [
                    launch(
                        r, *py(code, "--rank=${local_rank}", "${other}"), env={"OVERRIDDEN": "spec"}
                    )
                    for r in range(2)
                ]
            )
            await collect(group, 2)
            await group.stop(1.0)
            return pw

    pw = asyncio.run(main())
    assert isinstance(pw.logs_specs, DefaultLogsSpecs) and pw.logs_specs.run_log_dir
    for r in range(2):
        rank_dir = Path(pw.logs_specs.run_log_dir) / "attempt_0" / str(r)
        seen = json.loads((rank_dir / "stdout.log").read_text())
        assert seen == {
            "argv": [f"--rank={r}", "${other}"],
            "FROM_AGENT": "agent",
            "OVERRIDDEN": "spec",
            "TORCHELASTIC_ERROR_FILE": str(rank_dir / "error.json"),
            "ours": [],  # the error file's path is the process-tree marker: no extra names
        }
    assert pw.agent_marker == proctree.Marker(
        "TORCHELASTIC_ERROR_FILE", pw.logs_specs.run_log_dir + os.sep, prefix=True
    )


@pytest.mark.timeout(60)
def test_without_an_error_file_path_the_fallback_markers_tag_the_tree(
    sweep: Sweep, tmp_path: Path
) -> None:
    """``--log-dir /dev/null``: torch's empty error file, so the launcher's own markers."""
    code = """
        import json, os, subprocess, sys
        # a grandchild in its own session: found by marker only once its parent exits
        subprocess.Popen(["sleep", "60"], start_new_session=True)
        with open(sys.argv[1], "w") as f:
            json.dump({k: v for k, v in os.environ.items()
                       if k.startswith(("ELASTIC_", "TORCHELASTIC_ERROR"))}, f)
    """
    seen_file = tmp_path / "seen.json"

    async def main() -> tuple[ProcessWorkers, list[WorkerExit]]:
        specs = DefaultLogsSpecs(os.devnull)
        async with make_workers(sweep, tmp_path, logs_specs=specs) as pw:
            group = await pw.start([launch(0, *py(code, str(seen_file)))])
            exits = await collect(group, 1)
            marker = pw.agent_marker
            assert marker is not None and marker.name == "ELASTIC_AGENT_INSTANCE"
            assert len(proctree.pids_with_env(marker)) == 1  # the orphaned grandchild
            await group.stop(1.0)
            assert not proctree.pids_with_env(marker)
            return pw, exits

    pw, exits = asyncio.run(main())
    seen = json.loads(seen_file.read_text())
    assert exits[0].exit_code == 0
    assert seen["TORCHELASTIC_ERROR_FILE"] == ""
    assert seen["ELASTIC_AGENT_INSTANCE"] == pw.instance
    assert len(seen["ELASTIC_WORKER_GROUP"]) == 32


# -- logs ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_redirect_and_tee_write_files_and_prefixed_console_lines(
    sweep: Sweep, tmp_path: Path
) -> None:
    # rank 0: stdout tee'd, stderr to console; rank 1: all redirected; rank 2: tee'd but
    # filtered out of the console
    code = """
        import sys, time
        sys.stdout.write("partial "); sys.stdout.flush(); time.sleep(0.05)
        sys.stdout.write("line\\nsecond line\\n"); sys.stdout.flush()
        sys.stderr.write("to stderr\\n")
    """
    out, err = io.BytesIO(), io.BytesIO()
    specs = DefaultLogsSpecs(
        str(tmp_path / "logs"),
        redirects={1: Std.ALL},
        tee={0: Std.OUT, 2: Std.ALL},
        local_ranks_filter={0, 1},
    )

    async def main() -> None:
        async with make_workers(
            sweep, tmp_path, logs_specs=specs, console_out=out, console_err=err, role="trainer"
        ) as pw:
            group = await pw.start([launch(r, *py(code), attempt=2) for r in range(3)])
            await collect(group, 3)
            await group.stop(1.0)

    asyncio.run(main())
    assert specs.run_log_dir is not None
    attempt = Path(specs.run_log_dir) / "attempt_2"
    assert out.getvalue() == b"[trainer0]:partial line\n[trainer0]:second line\n"
    assert err.getvalue() == b""  # rank 0's stderr went to the real stderr, untouched
    for r in (0, 1, 2):
        assert (attempt / str(r) / "stdout.log").read_text() == "partial line\nsecond line\n"
    assert (attempt / "1" / "stderr.log").read_text() == "to stderr\n"
    assert (attempt / "2" / "stderr.log").read_text() == "to stderr\n"
    assert not (attempt / "0" / "stderr.log").exists()


@pytest.mark.timeout(60)
def test_logs_of_a_failed_attempt_are_kept_next_to_the_new_one(
    sweep: Sweep, tmp_path: Path
) -> None:
    specs = DefaultLogsSpecs(str(tmp_path / "logs"), redirects=Std.ALL)

    async def main() -> None:
        async with make_workers(sweep, tmp_path, logs_specs=specs) as pw:
            for attempt in (0, 1):
                group = await pw.start(
                    [launch(0, "/bin/sh", "-c", f"echo attempt {attempt}; exit 1", attempt=attempt)]
                )
                await collect(group, 1)
                await group.stop(1.0)

    asyncio.run(main())
    assert specs.run_log_dir is not None
    run = Path(specs.run_log_dir)
    assert Path(specs.run_log_dir).name.startswith("t_")
    for attempt in (0, 1):
        assert (run / f"attempt_{attempt}" / "0" / "stdout.log").read_text() == (
            f"attempt {attempt}\n"
        )


@pytest.mark.timeout(60)
def test_a_workers_last_output_is_logged_before_its_exit_is_reported(
    sweep: Sweep, tmp_path: Path
) -> None:
    code = """
        import sys
        sys.stdout.write(("x" * 99 + "\\n") * 3000)  # 300 kB: more than a pipe holds
    """
    out = io.BytesIO()
    specs = DefaultLogsSpecs(str(tmp_path / "logs"), tee=Std.OUT)

    async def main() -> int:
        async with make_workers(sweep, tmp_path, logs_specs=specs, console_out=out) as pw:
            group = await pw.start([launch(0, *py(code))])
            await collect(group, 1)
            seen = len(out.getvalue())  # before stop() flushes anything
            await group.stop(1.0)
            return seen

    seen = asyncio.run(main())
    assert seen == 3000 * (len("[default0]:") + 100)


PROBE_TREE = """
import json, os, subprocess, sys, time
from elastic.real import proctree
m = proctree.Marker("ELASTIC_TEST_AGE", sys.argv[1])
mine = subprocess.Popen(["sleep", "30"], env={**os.environ, "ELASTIC_TEST_AGE": sys.argv[1]},
                        start_new_session=True)
time.sleep(0.05)
found = proctree.tree_handles([], m)
print(json.dumps({"mine": mine.pid, "found": sorted(found),
                  "by_env": sorted(proctree.pids_with_env(m))}))
for h in found.values():
    h.close()
mine.kill()
mine.wait()
"""


@pytest.mark.timeout(60)
def test_a_scan_reads_the_environment_only_of_processes_younger_than_the_agent() -> None:
    # a marked process older than the scanning agent cannot be one of its workers'
    # descendants: the scan skips its environment; one the agent started is found
    import uuid

    value = uuid.uuid4().hex
    old = subprocess.Popen(["sleep", "30"], env={**os.environ, "ELASTIC_TEST_AGE": value})
    try:
        time.sleep(0.1)  # start times have a 10 ms grain
        out = subprocess.run(
            [sys.executable, "-c", PROBE_TREE, value],
            capture_output=True,
            text=True,
            timeout=50,
            check=True,
        )
        info = json.loads(out.stdout)
        assert info["found"] == [info["mine"]]
        assert sorted(info["by_env"]) == sorted([info["mine"], old.pid])  # no age filter
    finally:
        old.kill()
        old.wait()
