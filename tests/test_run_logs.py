"""``elastic run``'s logs: torch's directory layout, redirects, tee prefixes, rank filter."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_run_cli import elastic_run, script, tag

__all__ = ["tag"]

TALK = """
    import os, sys
    rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    sys.stdout.write(f"out {rank} {attempt}\\n")
    sys.stderr.write(f"err {rank} {attempt}\\n")
    if os.environ.get("CRASH") and rank == "0" and attempt == "0":
        sys.stdout.flush()
        sys.stderr.flush()
        open(os.path.join(os.environ["CRASH"], "rank0_spoke"), "w").close()
    if os.environ.get("CRASH") and rank == "1" and attempt == "0":
        # rank 0 must have spoken before this attempt fails and stops it
        import time
        while not os.path.exists(os.path.join(os.environ["CRASH"], "rank0_spoke")):
            time.sleep(0.01)
        from elastic.multiprocessing.errors import record
        record(lambda: 1 / 0)()
"""


def _run_dir(logs: Path) -> Path:
    (run_dir,) = list(logs.iterdir())
    assert re.fullmatch(r"[0-9a-f-]{36}_\w+", run_dir.name), run_dir.name
    return run_dir


@pytest.mark.timeout(60)
def test_redirects_write_torchs_layout_and_keep_failed_attempts(tmp_path: Path, tag: str) -> None:
    logs = tmp_path / "logs"
    train = script(tmp_path, TALK)
    p = elastic_run(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs), "-r", "3", train],
        tag,
        CRASH=str(tmp_path),
    )
    assert p.returncode == 0, p.stderr
    run_dir = _run_dir(logs)
    assert sorted(d.name for d in run_dir.iterdir()) == ["attempt_0", "attempt_1"]
    for attempt in (0, 1):
        for rank in (0, 1):
            d = run_dir / f"attempt_{attempt}" / str(rank)
            assert (d / "stdout.log").read_text() == f"out {rank} {attempt}\n"
            assert (d / "stderr.log").read_text().startswith(f"err {rank} {attempt}\n")
    # the failed attempt's error file is kept, with the traceback @record wrote
    assert "ZeroDivisionError" in (run_dir / "attempt_0" / "1" / "error.json").read_text()
    assert not (run_dir / "attempt_1" / "1" / "error.json").exists()
    assert "out 0" not in p.stdout  # redirected, not shown


@pytest.mark.timeout(60)
def test_tee_shows_prefixed_lines_and_writes_the_files(tmp_path: Path, tag: str) -> None:
    logs = tmp_path / "logs"
    train = script(tmp_path, TALK)
    p = elastic_run(["--nproc-per-node", "2", "--log-dir", str(logs), "-t", "3", train], tag)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[default0]:out 0 0", "[default1]:out 1 0"]
    assert "[default1]:err 1 0" in p.stderr.splitlines()
    attempt = _run_dir(logs) / "attempt_0"
    assert (attempt / "1" / "stdout.log").read_text() == "out 1 0\n"


@pytest.mark.timeout(60)
def test_local_ranks_filter_limits_the_console_not_the_files(tmp_path: Path, tag: str) -> None:
    logs = tmp_path / "logs"
    train = script(tmp_path, TALK)
    p = elastic_run(
        [
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(logs),
            "-t",
            "3",
            "--local-ranks-filter",
            "1",
            train,
        ],
        tag,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[default1]:out 1 0"]
    attempt = _run_dir(logs) / "attempt_0"
    assert (attempt / "0" / "stdout.log").read_text() == "out 0 0\n"


@pytest.mark.timeout(60)
def test_log_line_prefix_template_from_the_environment(tmp_path: Path, tag: str) -> None:
    train = script(tmp_path, TALK)
    p = elastic_run(
        ["--nproc-per-node", "2", "-t", "1", train],
        tag,
        TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="<${role_name}|${rank}|${local_rank}>",
    )
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["<default|0|0>out 0 0", "<default|1|1>out 1 0"]


CHATTY = """
    import os, sys
    rank = os.environ["LOCAL_RANK"]
    for i in range(300):
        for name, stream in (("out", sys.stdout), ("err", sys.stderr)):
            # each line in three writes, flushed apart: the pipe sees partial lines
            stream.write(f"{name} {rank} {i} ")
            stream.flush()
            stream.write("x" * (i % 50))
            stream.flush()
            stream.write(" end\\n")
            stream.flush()
"""


@pytest.mark.timeout(90)
def test_tee_never_glues_two_ranks_lines_on_a_shared_console(tmp_path: Path, tag: str) -> None:
    """stdout and stderr of 3 chatty ranks share one console (as a terminal does): every
    console line is one whole line of one rank and stream, and none is lost."""
    import subprocess

    from tests.test_run_cli import ELASTIC_RUN, env_for

    train = script(tmp_path, CHATTY)
    p = subprocess.run(
        [
            *ELASTIC_RUN,
            "--nproc-per-node",
            "3",
            "--log-dir",
            str(tmp_path / "logs"),
            "-t",
            "3",
            train,
        ],
        env=env_for(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=80,
    )
    assert p.returncode == 0, p.stdout[-2000:]
    line = re.compile(rb"\[default(\d)\]:(out|err) (\d) (\d+) x* end")
    seen: set[tuple[bytes, bytes, bytes]] = set()
    for ln in p.stdout.splitlines():
        if not ln.startswith(b"[default"):
            continue  # the agent's own log lines
        m = line.fullmatch(ln)
        assert m is not None, f"a glued or broken console line: {ln[:200]!r}"
        assert m.group(1) == m.group(3)
        seen.add((m.group(2), m.group(3), m.group(4)))
    assert len(seen) == 3 * 2 * 300
