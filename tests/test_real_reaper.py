"""The reaper sidecar tells a clean exit from a death, even when it starts after the agent left."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

from elastic.real.proctree import Marker

PY = sys.executable

# an "agent" that starts its sidecar, says "q" (its workers are stopped) and exits at
# once: the sidecar is still starting and finds its parent gone when it looks
AGENT = """
import sys
from elastic.real.reaper import ReaperSidecar
s = ReaperSidecar(sys.argv[1:4])
print(s.start(), flush=True)
if sys.argv[4] == "clean":
    s.request_exit()
"""


def _run_agent(script: str, marker: Marker, how: str) -> int:
    out = subprocess.run(
        [PY, "-c", textwrap.dedent(script), *marker.argv(), how],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return int(out.stdout.strip())


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False


# an agent that starts its sidecar first, sends the marker later (as ``elastic run``
# does: the sidecar starts before the agent's modules are imported), then exits without
# a word ("died"), says "q" ("clean"), or dies before it sent any marker ("early")
LATE = """
import sys, time
from elastic.real.reaper import ReaperSidecar
s = ReaperSidecar()
print(s.start(), flush=True)
time.sleep(0.2)  # the sidecar is up and waiting by now
if sys.argv[4] != "early":
    s.set_marker(sys.argv[1:4])
if sys.argv[4] == "clean":
    s.request_exit()
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("script", "how"),
    [
        (AGENT, "clean"),
        (AGENT, "died"),
        (LATE, "clean"),
        (LATE, "died"),
        (LATE, "early"),
    ],
    ids=["marker-at-start-clean", "marker-at-start-died", "late-clean", "late-died", "early"],
)
def test_sidecar_kills_marked_processes_only_when_the_agent_did_not_say_quit(
    script: str, how: str
) -> None:
    # the agent's marker is a prefix of its workers' error file paths
    run_dir = f"/tmp/no-such-dir/{uuid.uuid4().hex}/"
    marker = Marker("TORCHELASTIC_ERROR_FILE", run_dir, prefix=True)
    victim = subprocess.Popen(
        ["sleep", "30"],
        env={**os.environ, "TORCHELASTIC_ERROR_FILE": run_dir + "attempt_0/0/error.json"},
    )
    try:
        sidecar = _run_agent(script, marker, how)
        assert _wait_gone(sidecar, 10.0), "the sidecar did not exit"
        if how == "died":
            assert victim.wait(10) == -9  # the agent died without a word: kill
        else:
            time.sleep(0.1)
            assert victim.poll() is None, f"{how}: killed with no marker or after a clean exit"
    finally:
        victim.kill()
        victim.wait()


def test_orders_read_the_same_whatever_the_pipe_splits() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from elastic.real.reaper import _Orders, marker_message, needle

    @given(
        value=st.text(st.characters(blacklist_characters="\0", blacklist_categories=["Cs"])),
        first=st.text(st.characters(blacklist_characters="\0", blacklist_categories=["Cs"])),
        quit_=st.booleans(),
        cgroup=st.text(st.characters(blacklist_characters="\0", blacklist_categories=["Cs"])),
        cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
    )
    def check(value: str, first: str, quit_: bool, cgroup: str, cuts: list[int]) -> None:
        stream = marker_message(["NAME", first, "exact"])
        stream += b"c\0/old\0" + b"c\0" + cgroup.encode("utf-8", "surrogateescape") + b"\0"
        stream += marker_message(["ERR", value, "prefix"]) + (b"q\0" if quit_ else b"")
        orders = _Orders()
        at = 0
        for cut in sorted(min(c, len(stream)) for c in cuts):
            orders.feed(stream[at:cut])
            at = cut
        orders.feed(stream[at:])
        assert orders.needle == needle("ERR", value, "prefix")  # the last marker sent
        assert orders.quit is quit_
        assert orders.cgroup == os.fsdecode(cgroup.encode("utf-8", "surrogateescape"))

    check()
