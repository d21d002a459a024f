"""Issue 15, items 1-3 and the private directory: restarts leak nothing, and nothing of the
job's tree survives its agent, however the agent ends.

Workers here (tests/leaky_worker.py) each start a helper, a double-forked daemon that
keeps the marker and a double-forked daemon started with ``env={}`` (no marker: found
only because the agent, a child subreaper, inherits it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from elastic.real import proctree
from tests.test_real_workers import (
    Sweep,
    _gone,
    launch,
    make_workers,
    sweep,  # noqa: F401  # the fixture
    wait_all_gone,
)

PY = sys.executable
WORKER = str(Path(__file__).with_name("leaky_worker.py"))


def _pids(where: Path, n: int, attempt: int, timeout: float = 20.0) -> set[int]:
    deadline = time.monotonic() + timeout
    out: set[int] = set()
    for r in range(n):
        path = where / f"{r}_{attempt}"
        while not path.exists():
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.01)
        out |= {int(p) for p in path.read_text().split()}
    return out


def sleepers(token: str) -> list[int]:
    """Live processes running ``sleep <token>`` (a token unique to one test)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if cmd[-1:] == [token] and "sleep" in cmd[0] and p.info["status"] != "zombie":
            out.append(p.pid)
    return out


def unique_seconds() -> str:
    return f"300.{os.getpid()}{time.monotonic_ns() % 10**6}"


def wait_no_sleepers(token: str, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := sleepers(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, 9)
    return left


def _zombies() -> int:
    return sum(
        1
        for c in psutil.Process().children()
        if c.status() == psutil.STATUS_ZOMBIE and c.pid not in _ignored_zombies
    )


_ignored_zombies: set[int] = set()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scrubbed", [False, True], ids=["marked-daemons", "env-empty-daemons"])
def test_restarts_leak_no_pidfd_and_leave_no_zombie_nor_daemon(
    sweep: Sweep,  # noqa: F811
    tmp_path: Path,
    scrubbed: bool,
) -> None:
    """Item 1 (marked daemons: the pidfd leak and zombies alone) and item 3 (``env={}``
    daemons too): fds and zombies are flat over restarts; no daemon survives a stop."""
    _ignored_zombies.update(c.pid for c in psutil.Process().children())

    async def main() -> tuple[list[int], list[int], set[int]]:
        fds: list[int] = []
        zombies: list[int] = []
        everyone: set[int] = set()
        async with make_workers(sweep, tmp_path) as pw:
            for attempt in range(6):
                env = {"TORCHELASTIC_RESTART_COUNT": str(attempt)}
                if not scrubbed:
                    env["LEAKY_MARKED_ONLY"] = "1"
                group = await pw.start(
                    [
                        launch(r, PY, WORKER, str(tmp_path), "crash", env=env, attempt=attempt)
                        for r in range(2)
                    ]
                )
                pids = await asyncio.to_thread(_pids, tmp_path, 2, attempt) - {0}
                everyone |= pids
                await asyncio.wait_for(group.next_exit(), 20)
                await group.stop(0.5)
                alive = [p for p in pids if not _gone(p)]
                assert not alive, f"attempt {attempt}: still alive after stop: {alive}"
                fds.append(len(os.listdir("/proc/self/fd")))
                zombies.append(_zombies())
        return fds, zombies, everyone

    fds, zombies, everyone = asyncio.run(main())
    assert fds[-1] <= fds[1] + 1, f"the agent's fds grew over restarts: {fds}"
    assert max(zombies) == 0, f"zombies of the agent over restarts: {zombies}"
    ok, _ = wait_all_gone(everyone, 2.0)
    assert ok


def test_an_orphan_of_another_agents_tree_is_not_taken(tmp_path: Path) -> None:
    """The orphan search takes only unmarked or own-marked children of the agent."""
    other = proctree.Marker(proctree.ERROR_FILE, str(tmp_path / "other") + "/", prefix=True)
    mine = proctree.Marker(proctree.ERROR_FILE, str(tmp_path / "mine") + "/", prefix=True)
    since = proctree.start_ticks() - 1
    procs = [
        subprocess.Popen(["/bin/sleep", "60"], env=env, start_new_session=True)
        for env in ({}, {other.name: other.value + "x"}, {mine.name: mine.value + "y"})
    ]
    try:
        found = proctree.tree_handles((), mine, exclude=set(), orphans_since=since)
        ours = set(found)
        for h in found.values():
            h.close()
        assert procs[0].pid in ours  # unmarked: a scrubbed environment
        assert procs[1].pid not in ours  # another agent's
        assert procs[2].pid in ours  # ours
        old = proctree.tree_handles((), None, orphans_since=proctree.start_ticks() + 100)
        assert not set(old) & {p.pid for p in procs}  # older than the agent's first start
        for h in old.values():
            h.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()


# an agent (elastic run) whose own code fails: the group's stop raises, as it did when
# the agent ran out of fds (issue 15, item 1's ``OSError: [Errno 24]``)
FAILING_AGENT = """
import sys
from elastic.real import workers

async def broken_stop(self, grace, sig):
    raise OSError(24, "Too many open files (injected)")

workers.ProcessGroup._stop = broken_stop
from elastic.run import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(90)
def test_an_agent_dying_of_its_own_exception_leaves_no_process(tmp_path: Path) -> None:
    """Item 2: the sidecar sweeps when the agent fails instead of being told to quit."""
    logs = tmp_path / "logs"
    token = unique_seconds()
    agent = subprocess.Popen(
        [
            PY,
            "-c",
            FAILING_AGENT,
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            "--log-dir",
            str(logs),
            WORKER,
            str(tmp_path),
            "crash",
            token,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = agent.communicate(timeout=60)
    finally:
        agent.kill()
    assert agent.returncode != 0
    assert "injected" in err
    assert (tmp_path / "0_0").exists() or (tmp_path / "1_0").exists()
    left = wait_no_sleepers(token, 5.0)
    assert not left, f"left behind by an agent that failed: {left}\n{err}"


SIGKILLED_AGENT = """
import asyncio, json, sys
from elastic.multiprocessing.api import DefaultLogsSpecs
from elastic.real.workers import ProcessWorkers
from elastic.workers import WorkerLaunch

async def main():
    pw = ProcessWorkers(DefaultLogsSpecs(sys.argv[1]))
    sleep = ("-c", "import time; time.sleep(60)")
    group = await pw.start([WorkerLaunch(0, 0, {}, sys.executable, sleep)])
    print(json.dumps({"reaper": pw.reaper_pid, "dir": group._private_dir,
                      "marker": pw.agent_marker.argv()}), flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


@pytest.mark.timeout(60)
def test_a_sigkilled_agents_private_directory_is_removed_by_the_sidecar(tmp_path: Path) -> None:
    """Item 11: ``elastic_workers_*`` does not outlive a SIGKILLed agent."""
    agent = subprocess.Popen(
        [PY, "-c", SIGKILLED_AGENT, str(tmp_path / "logs")], stdout=subprocess.PIPE, text=True
    )
    assert agent.stdout is not None
    info = json.loads(agent.stdout.readline())
    assert os.path.isdir(info["dir"])
    assert os.path.basename(info["dir"]).startswith("elastic_workers_")
    agent.kill()
    agent.wait()
    agent.stdout.close()
    ok, _ = wait_all_gone({info["reaper"]}, 10.0)
    assert ok
    assert not os.path.exists(info["dir"])
    left = proctree.pids_with_env(proctree.Marker.from_argv(info["marker"]))
    assert not left


def test_the_sidecar_removes_only_private_directories(tmp_path: Path) -> None:
    from elastic.real.reaper import _Orders

    o = _Orders()
    keep = tmp_path / "precious"
    o.feed(b"d\0" + os.fsencode(str(keep)) + b"\0d\0/tmp/elastic_workers_x\0")
    assert o.dirs == ["/tmp/elastic_workers_x"]
    o.feed(b"d\0/tmp/elastic_wor")
    o.feed(b"kers_y\0k\0")
    assert o.dirs == ["/tmp/elastic_workers_x", "/tmp/elastic_workers_y"] and o.sweep
