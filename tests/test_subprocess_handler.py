"""torch's ``SubprocessHandler``/``get_subprocess_handler`` and ``utils.log_level``."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from elastic.multiprocessing.subprocess_handler import SubprocessHandler, get_subprocess_handler
from elastic.utils.log_level import get_log_level
from elastic.utils.logging import get_logger


@pytest.mark.timeout(60)
def test_runs_with_the_env_added_and_output_in_files(tmp_path: Path) -> None:
    out, err = tmp_path / "out", tmp_path / "err"
    code = "import os, sys; print(os.environ['X'], sys.argv[1:]); print('e', file=sys.stderr)"
    h = get_subprocess_handler(
        sys.executable, ("-c", code, 1, 2.5), {"X": "y"}, str(out), str(err), local_rank_id=3
    )
    assert isinstance(h, SubprocessHandler) and h.local_rank_id == 3
    assert h.proc.wait(timeout=30) == 0
    h.close()
    assert out.read_text() == "y ['1', '2.5']\n" and err.read_text() == "e\n"


@pytest.mark.timeout(60)
def test_close_signals_the_whole_group_and_is_quiet_once_it_is_gone(tmp_path: Path) -> None:
    # the worker starts a child of its own: closing reaches it through the process group
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(c.pid, flush=True); time.sleep(60)"
    )
    out = tmp_path / "out"
    h = SubprocessHandler(sys.executable, ("-c", code), {}, str(out), None, 0)
    try:
        assert os.getpgid(h.proc.pid) == h.proc.pid  # a session of its own
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.02)
        child = psutil.Process(int(out.read_text()))
        h.close()
        assert h.proc.wait(timeout=30) == -signal.SIGTERM
        _, alive = psutil.wait_procs([child], timeout=30)
        assert not alive
        h.close(signal.SIGKILL)  # already gone: no ProcessLookupError
    finally:
        if h.proc.poll() is None:
            os.killpg(h.proc.pid, signal.SIGKILL)
            h.proc.wait()


def test_a_program_that_cannot_start_leaves_no_open_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        SubprocessHandler(str(tmp_path / "missing"), (), {}, str(tmp_path / "o"), None, 0)


def test_log_level_is_loggers_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOGLEVEL", raising=False)
    assert get_log_level() == "WARNING"
    assert get_logger("elastic.test.level").level == 30
