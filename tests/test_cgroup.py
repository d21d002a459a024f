"""One cgroup v2 per agent (elastic.real.cgroup): nothing of the job survives the agent,
even a SIGKILL, not even a double-forked daemon started with ``env={}``; every start path
puts the worker in the group's cgroup before it runs; cgroups do not accumulate; and
without a usable cgroup v2 the agent works as before after one debug line.

Tests that need cgroup v2 skip, saying why, when not root or when no cgroup2 hierarchy is
mounted here.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.bench_soak import run
from elastic.multiprocessing.api import DefaultLogsSpecs
from elastic.real import cgroup, workers
from elastic.real.cgroup import AgentCgroup, cgroup2_dir
from elastic.real.reaper import CGROUP_PREFIX
from elastic.real.workers import ProcessWorkers
from elastic.workers import WorkerLaunch
from tests.leftovers import no_leftover_processes
from tests.test_run_cli import TAG, tag

__all__ = ["tag"]

PY = sys.executable


def _usable() -> str | None:
    """Why cgroup v2 tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (to create a cgroup and move processes into it)"
    own = cgroup2_dir()
    if own is None:
        return "no cgroup2 hierarchy mounted (/proc/self/mountinfo)"
    return None


needs_cgroup = pytest.mark.skipif(_usable() is not None, reason=str(_usable()))


@pytest.fixture(autouse=True)
def _fresh_extension() -> None:
    """A stale build of the C extension would make the agent fall back silently."""
    assert workers._cspawn is None or hasattr(workers._cspawn, "CGROUP_FD"), (
        "elastic/real/_spawn*.so predates cgroup support: `pip install -e .` rebuilds it"
    )


def _ours(pid: int) -> list[str]:
    """This agent's cgroups (``elastic-<pid>-*``) beside where a new one would go."""
    own = cgroup2_dir()
    if own is None:
        return []
    return [e for e in os.listdir(own) if e.startswith(f"{CGROUP_PREFIX}{pid}-")]


def _cgroup_of(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return next(ln[3:].strip() for ln in f if ln.startswith("0::"))


# -- the guarantee, end to end --------------------------------------------------------------


@needs_cgroup
@pytest.mark.timeout(120)
@pytest.mark.parametrize("flags", [(), ("--preload", "json")], ids=["cold", "preload"])
def test_sigkilled_agent_leaves_nothing_not_even_env_scrubbed_double_forked_daemons(
    tag: str, flags: tuple[str, ...]
) -> None:
    # each worker of the last attempt starts a helper, a marked double-forked daemon and
    # an env={} double-forked daemon (tests/leaky_worker.py); then the agent is SIGKILLed
    result = run(2, "2:wait", end="SIGKILL", env_tag=(TAG, tag), timeout=90, flags=flags)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert result.samples and result.samples[-1].attempt == 2, result.samples
    assert result.pids.get(2), "the last attempt's workers never started their daemons"
    assert not result.leftovers, f"left behind: {result.details}"
    assert "start cold" not in result.stderr  # with --preload: forked from the zygote
    # the sidecar removed the agent's cgroup after killing it
    deadline = time.monotonic() + 10
    while _ours(result.agent_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _ours(result.agent_pid)


@needs_cgroup
@pytest.mark.timeout(120)
def test_restarts_and_a_clean_exit_leave_no_process_and_no_cgroup(tag: str) -> None:
    result = run(3, "3:ok", env_tag=(TAG, tag), timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not result.leftovers, f"left behind: {result.details}"
    assert not _ours(result.agent_pid)  # removed by the agent itself at its exit


# -- every start path joins the group's cgroup ------------------------------------------------

# a worker that reports its own cgroup and that of an env={} double-forked daemon
# (``path``: where to write it)
REPORT_BODY = """
    import os, subprocess, time
    out = subprocess.run(
        ["/bin/sh", "-c", "/bin/sleep 60 >/dev/null 2>&1 </dev/null & echo $!"],
        env={}, start_new_session=True, capture_output=True, text=True, check=True,
    )
    daemon = int(out.stdout)
    def cg(pid):
        with open(f"/proc/{pid}/cgroup") as f:
            return next(ln[3:].strip() for ln in f if ln.startswith("0::"))
    with open(path + ".tmp", "w") as f:
        f.write(cg(os.getpid()) + " " + cg(daemon) + " " + str(daemon))
    os.rename(path + ".tmp", path)
    time.sleep(60)
"""
REPORT = "import sys\npath = sys.argv[1]\n" + textwrap.dedent(REPORT_BODY)


def report_fn(path: str) -> None:
    """A function entrypoint doing what REPORT does (for the fork start method)."""
    exec(textwrap.dedent(REPORT_BODY), {"path": path})


@contextlib.contextmanager
def _swept() -> Iterator[list[ProcessWorkers]]:
    agents: list[ProcessWorkers] = []
    with no_leftover_processes(lambda: [a.agent_marker for a in agents]):
        yield agents


async def _run_reporting(pw: ProcessWorkers, tmp_path: Path, entry: Any, args: Any) -> list[str]:
    out = tmp_path / "cg"
    base = {"TORCHELASTIC_RUN_ID": "t", "LOCAL_RANK": "0"}
    async with pw:
        group = await pw.start([WorkerLaunch(0, 0, base, entry, (*args, str(out)), 0)])
        assert pw.cgroup is not None and group.cgroup is not None
        leaf = group.cgroup.path
        deadline = time.monotonic() + 30
        while not out.exists():
            assert time.monotonic() < deadline, "the worker never reported"
            await asyncio.sleep(0.02)
        worker_cg, daemon_cg, daemon = out.read_text().split()
        await group.stop(2.0)
        assert not os.path.exists(leaf), "the group's cgroup outlived its stop"
        agent_cg = pw.cgroup.path
    assert not os.path.exists(agent_cg), "the agent's cgroup outlived aclose()"
    assert not psutil.pid_exists(int(daemon)) or psutil.Process(int(daemon)).status() == "zombie"
    return [leaf, worker_cg, daemon_cg]


@needs_cgroup
@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["c-spawn", "exec-shim", "fork"])
def test_each_start_path_puts_the_worker_and_what_it_forks_in_the_groups_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    if path == "exec-shim":
        monkeypatch.setattr(workers, "_cspawn", None)  # as where the extension was not built
    with _swept() as agents:
        pw = ProcessWorkers(
            DefaultLogsSpecs(str(tmp_path / "logs")),
            start_method="fork" if path == "fork" else "spawn",
            console_out=io.BytesIO(),
            console_err=io.BytesIO(),
        )
        agents.append(pw)
        if path == "fork":
            entry: Any = report_fn
            args: Any = ()
        else:
            entry, args = PY, ("-c", REPORT)
        leaf, worker_cg, daemon_cg = asyncio.run(_run_reporting(pw, tmp_path, entry, args))
    own = cgroup2_dir()
    assert own is not None
    assert leaf.endswith(worker_cg), (leaf, worker_cg)
    assert daemon_cg == worker_cg  # born there: the daemon cannot have escaped it
    assert os.path.basename(os.path.dirname(leaf)).startswith(f"{CGROUP_PREFIX}{os.getpid()}-")


# -- the stop's kill ------------------------------------------------------------------------


@needs_cgroup
@pytest.mark.timeout(60)
def test_group_cgroup_kill_is_awaited_until_the_cgroup_is_empty() -> None:
    agent = AgentCgroup.create()
    assert agent is not None
    leaf = agent.group()
    assert leaf is not None
    # a process that joins the leaf, then forks a child that ignores SIGTERM
    code = f"""
        import os, signal, subprocess, sys, time
        open({os.path.join(leaf.path, "cgroup.procs")!r}, "w").write("0")
        subprocess.Popen(["/bin/sleep", "60"], start_new_session=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
    """
    p = subprocess.Popen([PY, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        assert cgroup.populated(leaf.path)
        pids = [int(x) for x in Path(leaf.path, "cgroup.procs").read_text().split()]
        assert len(pids) == 2

        async def main() -> bool:
            return await leaf.kill(10.0)

        t0 = time.monotonic()
        assert asyncio.run(main()) is True  # something was left: it was killed
        assert time.monotonic() - t0 < 5.0
        assert not cgroup.populated(leaf.path)
        assert p.wait(5) == -signal.SIGKILL
        leaf.remove()
        assert not os.path.exists(leaf.path)
        assert asyncio.run(main()) is False  # gone: nothing to kill
    finally:
        p.kill()
        p.communicate()

        async def close() -> None:
            await agent.close(5.0)

        asyncio.run(close())
    assert not os.path.exists(agent.path)


@needs_cgroup
@pytest.mark.timeout(30)
def test_empty_cgroups_of_dead_agents_are_removed_by_the_next_agent() -> None:
    own = cgroup2_dir()
    assert own is not None
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()  # a pid that was an agent's and is free now
    stale = os.path.join(own, f"{CGROUP_PREFIX}{dead.pid}-{os.urandom(6).hex()}")
    os.mkdir(stale)
    os.mkdir(os.path.join(stale, "g0"))
    live = os.path.join(own, f"{CGROUP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}")
    os.mkdir(live)  # this process is alive: kept
    try:
        agent = AgentCgroup.create()
        assert agent is not None
        assert not os.path.exists(stale)
        assert os.path.exists(live)
        asyncio.run(agent.close(1.0))
    finally:
        for path in (os.path.join(stale, "g0"), stale, live):
            with contextlib.suppress(OSError):
                os.rmdir(path)


# -- discovery and fallback -------------------------------------------------------------------

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def _files(tmp_path: Path, mountinfo: str, proc_cgroup: str) -> tuple[str, str]:
    m, c = tmp_path / "mountinfo", tmp_path / "cgroup"
    m.write_text(mountinfo)
    c.write_text(proc_cgroup)
    return str(m), str(c)


def test_cgroup2_dir_reads_the_mount_and_the_own_cgroup(tmp_path: Path) -> None:
    root = tmp_path / "mnt with space"
    (root / "a" / "b").mkdir(parents=True)
    esc = str(root).replace(" ", "\\040")
    cases = [
        # the whole hierarchy mounted: the mount point joined with the cgroup's path
        (f"41 31 0:38 / {esc} rw - cgroup2 cgroup2 rw\n", "0::/a/b\n", str(root / "a" / "b")),
        # a mount of part of it (a container's view): its root is stripped
        (f"41 31 0:38 /a {esc} rw - cgroup2 cgroup2 rw\n", "0::/a/b\n", str(root / "b")),
        # a mount of another part: not ours
        (f"41 31 0:38 /x {esc} rw - cgroup2 cgroup2 rw\n", "0::/a/b\n", None),
        # no cgroup2 mount (cgroup v1 only)
        (HYBRID.replace("cgroup2 cgroup2", "cgroup cgroup"), "0::/\n", None),
        # no v2 line in /proc/self/cgroup
        (f"41 31 0:38 / {esc} rw - cgroup2 cgroup2 rw\n", "4:memory:/x\n", None),
    ]
    (root / "b").mkdir()
    for mountinfo, proc, want in cases:
        assert cgroup2_dir(*_files(tmp_path, mountinfo, proc)) == want, (mountinfo, proc)


@pytest.mark.timeout(60)
def test_without_cgroup_v2_the_workers_run_as_before_after_one_debug_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mountinfo, _ = _files(tmp_path, HYBRID.replace("cgroup2 cgroup2", "cgroup cgroup"), "")
    monkeypatch.setattr(cgroup, "MOUNTINFO", mountinfo)
    caplog.set_level(logging.DEBUG, logger="elastic.real")
    out = tmp_path / "report"
    base = {"TORCHELASTIC_RUN_ID": "t", "LOCAL_RANK": "0"}

    async def main() -> str:
        async with pw:
            for attempt in range(2):  # the debug line once, not per group
                report = Path(f"{out}.{attempt}")
                la = WorkerLaunch(0, 0, base, PY, ("-c", REPORT, str(report)))
                group = await pw.start([la])
                assert pw.cgroup is None and group.cgroup is None
                deadline = time.monotonic() + 30
                while not report.exists():
                    assert time.monotonic() < deadline, "the worker never reported"
                    await asyncio.sleep(0.02)
                await group.stop(2.0)  # the env={} daemon too: found by parentage
        return report.read_text()

    with _swept() as agents:
        pw = ProcessWorkers(
            DefaultLogsSpecs(str(tmp_path / "logs")),
            console_out=io.BytesIO(),
            console_err=io.BytesIO(),
        )
        agents.append(pw)
        worker_cg, daemon_cg, daemon = asyncio.run(main()).split()
    # where the agent is: no cgroup of its own
    assert worker_cg == daemon_cg == _cgroup_of(os.getpid())
    assert not psutil.pid_exists(int(daemon)) or psutil.Process(int(daemon)).status() == "zombie"
    lines = [r for r in caplog.records if r.name == "elastic.real.cgroup"]
    assert len(lines) == 1 and lines[0].levelno == logging.DEBUG, lines
    assert "no cgroup v2 hierarchy" in lines[0].getMessage()


@pytest.mark.timeout(30)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a probe as another user")
def test_a_user_who_may_not_create_cgroups_gets_none_and_one_debug_line() -> None:
    # imports first, as root (the interpreter lives under /root); then become nobody
    code = """
        import logging, os, sys
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(name)s %(message)s")
        from elastic.real.cgroup import AgentCgroup
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        print("result", AgentCgroup.create())
    """
    p = subprocess.run(
        [PY, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=25,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "result None", p.stdout
    debug = [ln for ln in lines if ln.startswith("elastic.real.cgroup ")]
    assert len(debug) == 1, p.stdout
