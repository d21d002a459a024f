"""Issue 15: a crash-looping job whose workers leak keeps the agent's fds, threads,
zombies and memory flat, and leaves nothing behind however the agent ends.

The job and its sampling are ``bench/bench_soak.py``'s (which runs 1,000 restarts).
Samples are taken when an attempt's workers have started, which is often while the
agent is stopping them (these workers exit at once), so a sample may count the handles
and zombies of a stop in progress.  Bounds, after 5 warm-up attempts: the median of
the last 10 samples of fds and zombies at most 1 above the median of the 10 after the
warm-up (before the fix: +2 fds and +4 zombies per attempt); at any sample fds at most
8 above the warm-up value and zombies at most 8 (two workers' trees mid-stop); threads
+2; RSS +8 MiB at the end.

Without a usable cgroup v2 (not root, no cgroup2 mount) there is a known gap (SIGKILL
only): a double-forked daemon started with ``env={}`` carries no marker, so once the
agent is SIGKILLed nothing can tell it from any other process; the agent kills such
orphans at every restart and stop while it lives (so only the current attempt's can
survive), but the sidecar cannot.  The SIGKILL case then allows exactly that.  With a
cgroup (elastic.real.cgroup) the sidecar kills the agent's cgroup: nothing may be left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics

import pytest

from bench.bench_soak import Sample, growth, run
from elastic.real.cgroup import cgroup2_dir
from tests.test_run_cli import TAG, tag  # noqa: F401  # the fixture

pytestmark = pytest.mark.slow

RESTARTS = 55


@pytest.mark.timeout(240)
def test_fifty_five_restarts_keep_fds_threads_zombies_and_rss_flat(tag: str) -> None:  # noqa: F811
    result = run(RESTARTS, env_tag=(TAG, tag), timeout=200)
    assert result.returncode == 1, result.stderr[-2000:]  # restarts exhausted
    assert len(result.samples) >= 50, f"{len(result.samples)} attempts sampled"
    g = growth(result.samples)
    early, late = result.samples[5:15], result.samples[-10:]
    for name in ("fds", "zombies"):
        assert _median(late, name) <= _median(early, name) + 1, (name, result.samples)
    assert g["fds"][2] <= g["fds"][0] + 8, g
    assert g["zombies"][2] <= 8, g
    assert g["threads"][2] <= g["threads"][0] + 2, g
    assert g["rss"][1] <= g["rss"][0] + 8 * (1 << 20), g
    assert not result.leftovers, f"left behind: {result.leftovers}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("end", "mode", "code"),
    [
        ("exit", "3:ok", 0),
        ("SIGTERM", "3:wait", 1),
        ("SIGINT", "3:wait", 1),
        ("SIGHUP", "3:wait", 1),
        ("SIGKILL", "3:wait", -9),
        ("inject", "crash", 1),
    ],
)
def test_nothing_of_the_job_is_left_however_the_agent_ends(
    tag: str,  # noqa: F811
    end: str,
    mode: str,
    code: int,
) -> None:
    result = run(3, mode, end=end, env_tag=(TAG, tag), timeout=90)
    assert result.returncode == code, (result.samples, result.stderr[-2000:])
    # the signal went to an agent that had started its last attempt; under load a fast
    # attempt may pass unsampled (and a job that ends by itself may be gone before its
    # last attempt's sample is taken): one sample is required, and the last attempt seen
    last = 2 if end == "inject" else 3  # an injected failure ends the third restart
    assert result.samples, result.stderr[-2000:]
    assert result.reached == last, (result.reached, result.samples)
    if end not in ("exit", "inject"):  # the agent waits in its last attempt for the signal
        assert result.samples[-1].attempt == last, result.samples
    if end == "inject":
        assert "injected agent failure" in result.stderr
    left = set(result.leftovers)
    cgroups = os.geteuid() == 0 and cgroup2_dir() is not None
    if end == "SIGKILL" and not cgroups:  # the gap: the last attempt's unmarked daemons only
        last = max(result.pids)
        allowed = {worker[2] for worker in result.pids[last]}
        for pid in left & allowed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        left -= allowed
    assert not left, f"left behind after {end}: {sorted(left)}"


def _median(samples: list[Sample], name: str) -> float:
    return statistics.median(getattr(s, name) for s in samples)
