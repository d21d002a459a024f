"""What a user of ``elastic run`` sees of failures and restarts (issue 13): torchrun's log
lines at torchrun's levels, and a failure report that lists every failed rank."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_run_cli import elastic_run, script, tag

__all__ = ["tag"]

EXIT_2 = """
    import sys
    sys.exit(2)
"""


@pytest.mark.timeout(90)
def test_a_failure_and_its_restart_are_logged_in_torchruns_words(tmp_path: Path, tag: str) -> None:
    train = script(tmp_path, EXIT_2)
    p = elastic_run(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(tmp_path / "l"), train],
        tag,
        LOGLEVEL="INFO",
    )
    assert p.returncode == 1, p.stderr
    err = p.stderr
    assert re.search(r"ERROR:\S+:failed \(exitcode: 2\) local_rank: \d \(pid: \d+\) of binary", err)
    assert "INFO:elastic.agent.server.local_elastic_agent:[default] Worker group FAILED. " in err
    assert "1/1 attempts left; will restart worker group" in err
    assert "Rendezvous complete for workers. Result: restart_count=1" in err
    # at torchrun's default level (WARNING) the failure is still shown, the INFO lines not
    quiet = elastic_run(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(tmp_path / "q"), train],
        tag,
    )
    assert "failed (exitcode: 2)" in quiet.stderr
    assert "attempts left" not in quiet.stderr


@pytest.mark.timeout(90)
def test_the_failure_report_lists_every_failed_rank(tmp_path: Path, tag: str) -> None:
    train = script(tmp_path, EXIT_2)
    p = elastic_run(
        ["--nproc-per-node", "4", "--max-restarts", "0", "--log-dir", str(tmp_path / "l"), train],
        tag,
    )
    assert p.returncode == 1, p.stderr
    assert "<NO_OTHER_FAILURES>" not in p.stderr
    report = p.stderr[p.stderr.index("Failures:") :]
    ranks = re.findall(r"rank      : (\d) \(local_rank: \d\)", report)
    assert sorted(ranks) == ["0", "1", "2", "3"], report
    root = report[report.index("Root Cause") :]
    assert "exitcode  : 2 " in root


@pytest.mark.timeout(60)
def test_a_run_that_succeeds_leaves_no_temp_log_dir(tmp_path: Path, tag: str) -> None:
    import os

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    train = script(tmp_path, "print('ok')")
    p = elastic_run(["--nproc-per-node", "2", train], tag, TMPDIR=str(tmp))
    assert p.returncode == 0, p.stderr
    assert os.listdir(tmp) == []
    # a failed run keeps its logs: the report names the error files in them
    failing = script(tmp_path, EXIT_2, name="fail.py")
    p = elastic_run(["--nproc-per-node", "1", failing], tag, TMPDIR=str(tmp))
    assert p.returncode == 1
    assert [d.startswith("torchelastic_") for d in os.listdir(tmp)] == [True]
