"""Signals to ``elastic run``: the workers and their descendants go, the agent exits as torchrun.

torchrun 2.13 (checked by running it): SIGTERM, SIGINT and SIGHUP to the agent stop the
workers with that same signal and the agent exits 1 (``SignalException``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.test_run_cli import gone_within, script, start_elastic_run, tag, wait_files

__all__ = ["tag"]  # the fixture, re-exported for pytest

# Each worker starts a grandchild, then reports both pids; ``STUBBORN=1`` makes both
# ignore SIGTERM, so only the kill after the grace period ends them.
FAMILY = """
    import json, os, signal, subprocess, sys, time
    stubborn = os.environ.get("STUBBORN") == "1"
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = "import signal, time\\n"
    if stubborn:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    code += "time.sleep(300)\\n"
    child = subprocess.Popen([sys.executable, "-c", code])
    path = os.path.join(os.environ["OUT_DIR"], "pids." + os.environ["RANK"])
    with open(path + ".tmp", "w") as f:
        json.dump([os.getpid(), child.pid], f)
    os.rename(path + ".tmp", path)
    time.sleep(300)
"""


def _family(tmp_path: Path, n: int) -> tuple[str, Path]:
    out = tmp_path / "out"
    out.mkdir()
    return script(tmp_path, FAMILY), out


def _pids(out: Path, n: int) -> set[int]:
    files = [out / f"pids.{r}" for r in range(n)]
    wait_files(files)
    return {pid for f in files for pid in json.loads(f.read_text())}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_agent_stops_workers_and_descendants_and_exits_1(
    tmp_path: Path, tag: str, sig: signal.Signals
) -> None:
    train, out = _family(tmp_path, 2)
    agent = start_elastic_run(
        ["--standalone", "--nproc-per-node", "2", train], tag, OUT_DIR=str(out)
    )
    try:
        pids = _pids(out, 2)
        agent.send_signal(sig)
        _, err = agent.communicate(timeout=30)
        assert gone_within(pids, 1.0) is not None
    finally:
        agent.kill()
        agent.communicate()
    assert agent.returncode == 1
    assert f"SignalException: Process {agent.pid} got signal: {int(sig)}" in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("via", ["flag", "env"])
def test_workers_ignoring_sigterm_are_killed_after_the_shutdown_timeout(
    tmp_path: Path, tag: str, via: str
) -> None:
    train, out = _family(tmp_path, 2)
    flags = ["--shutdown-timeout", "1"] if via == "flag" else []
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "1"} if via == "env" else {}
    agent = start_elastic_run(
        ["--nproc-per-node", "2", *flags, train], tag, OUT_DIR=str(out), STUBBORN="1", **env
    )
    try:
        pids = _pids(out, 2)
        t0 = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        agent.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        agent.kill()
        agent.communicate()
    assert all(gone_within({p}, 0.5) is not None for p in pids)
    assert agent.returncode == 1
    # the grace period (1 s) is spent (they ignore SIGTERM), then SIGKILL: not much more
    assert 0.9 <= took < 4.0, took


@pytest.mark.timeout(60)
def test_signals_to_handle_flag_names_the_signals_the_agent_handles(
    tmp_path: Path, tag: str
) -> None:
    train, out = _family(tmp_path, 1)
    agent = start_elastic_run(
        ["--nproc-per-node", "1", "--signals-to-handle", "SIGUSR1", train], tag, OUT_DIR=str(out)
    )
    try:
        pids = _pids(out, 1)
        agent.send_signal(signal.SIGUSR1)
        _, err = agent.communicate(timeout=30)
        assert gone_within(pids, 1.0) is not None
    finally:
        agent.kill()
        agent.communicate()
    assert agent.returncode == 1
    assert f"got signal: {int(signal.SIGUSR1)}" in err


@pytest.mark.timeout(60)
def test_sigkill_of_the_agent_takes_workers_and_descendants_within_a_second(
    tmp_path: Path, tag: str
) -> None:
    train, out = _family(tmp_path, 2)
    agent = start_elastic_run(["--nproc-per-node", "2", train], tag, OUT_DIR=str(out), STUBBORN="1")
    try:
        pids = _pids(out, 2)
        os.kill(agent.pid, signal.SIGKILL)
        agent.communicate()
        took = gone_within(pids, 5.0)
    finally:
        agent.kill()
        agent.communicate()
    assert took is not None and took < 1.0, took
