"""How a real worker is started: the C path (``elastic.real._spawn``) and the shim fallback.

Both must give the worker the same start: its own process group, its streams, the
parent-death signal armed before it runs, SIGPIPE/SIGXFSZ at their defaults, the
environment asked for; and a program that cannot be executed is one clear error.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from elastic.errors import ConfigError
from elastic.multiprocessing.api import DefaultLogsSpecs, Std
from elastic.real import workers as real_workers
from elastic.real.workers import ProcessWorkers
from elastic.workers import WorkerLaunch

PY = sys.executable

PROBE = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
sig = ctypes.c_int(0)
libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
print(json.dumps({
    "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "ppid": os.getppid(),
    "pdeathsig": sig.value,
    "argv": sys.argv[1:],
    "probe_env": os.environ.get("PROBE_ENV"),
}))
"""


@pytest.fixture(params=["c", "shim"])
def start_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "shim":
        monkeypatch.setattr(real_workers, "_cspawn", None)
    elif real_workers._cspawn is None:
        pytest.fail("the C start path was not built (pip install -e . builds it with gcc)")
    return str(request.param)


def _no_children_left() -> None:
    deadline = time.monotonic() + 3.0
    me = psutil.Process()
    while time.monotonic() < deadline:
        alive = [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.02)
    pytest.fail(f"processes left behind: {alive}")


async def _run_probe(tmp_path: Path, args: list[str]) -> dict[str, Any]:
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(PROBE))
    logs = DefaultLogsSpecs(str(tmp_path / "logs"), redirects=Std.ALL)
    async with ProcessWorkers(logs, reaper=False, subreaper=False) as pw:
        la = WorkerLaunch(0, 0, {"PROBE_ENV": "yes"}, PY, ("-u", str(script), *args))
        group = await pw.start([la])
        ex = await group.next_exit()
        assert ex.exit_code == 0
        out = Path(group.logs.stdouts[0]).read_text()
    data: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return data


@pytest.mark.timeout(30)
def test_worker_starts_in_its_own_session_with_death_signal_and_default_signals(
    start_path: str, tmp_path: Path
) -> None:
    info = asyncio.run(_run_probe(tmp_path, ["a b", "${local_rank}"]))
    assert info["pgid"] == info["pid"]  # leads its own process group
    assert info["sid"] == info["pid"]  # in a session of its own, as torch's workers
    assert info["ppid"] == os.getpid()  # exec'd in place: no shim process in between
    assert info["pdeathsig"] == signal.SIGKILL
    assert info["argv"] == ["a b", "0"]
    assert info["probe_env"] == "yes"
    _no_children_left()


@pytest.mark.timeout(30)
def test_worker_program_starts_with_sigpipe_and_sigxfsz_at_default_and_nothing_blocked(
    start_path: str, tmp_path: Path
) -> None:
    """Python ignores SIGPIPE and SIGXFSZ, and ignored signals survive exec: put back."""
    logs = DefaultLogsSpecs(str(tmp_path / "logs"), redirects=Std.ALL)

    async def go() -> str:
        async with ProcessWorkers(logs, reaper=False, subreaper=False) as pw:
            group = await pw.start([WorkerLaunch(0, 0, {}, "cat", ("/proc/self/status",))])
            assert (await group.next_exit()).exit_code == 0
            return Path(group.logs.stdouts[0]).read_text()

    status = dict(line.split(":\t", 1) for line in asyncio.run(go()).splitlines() if ":\t" in line)
    ignored = int(status["SigIgn"].strip(), 16)
    assert not {s for s in (signal.SIGPIPE, signal.SIGXFSZ) if ignored >> (s - 1) & 1}
    assert int(status["SigBlk"].strip(), 16) == 0
    _no_children_left()


@pytest.mark.timeout(30)
def test_a_file_that_is_not_a_program_is_one_config_error(tmp_path: Path) -> None:
    if real_workers._cspawn is None:
        pytest.fail("the C start path was not built")
    bogus = tmp_path / "bogus"
    bogus.write_bytes(b"\x00\x01not a program\n")
    bogus.chmod(0o755)

    async def go() -> None:
        async with ProcessWorkers(DefaultLogsSpecs(str(tmp_path)), reaper=False) as pw:
            await pw.start([WorkerLaunch(0, 0, {}, str(bogus))])

    with pytest.raises(ConfigError) as e:
        asyncio.run(go())
    assert str(bogus) in str(e.value) and "cannot execute" in str(e.value)
    _no_children_left()


@pytest.mark.timeout(30)
def test_c_spawn_reports_exec_failure_and_reaps_the_child() -> None:
    spawn = real_workers._cspawn
    if spawn is None:
        pytest.fail("the C start path was not built")
    with pytest.raises(FileNotFoundError):
        spawn.spawn(b"/nonexistent/program", [b"x"], [], [], parent_pid=os.getpid())
    with pytest.raises(ValueError):
        spawn.spawn(b"/bin/true", [], [], [])  # argv needs argv[0]
    with pytest.raises(TypeError):
        spawn.spawn(b"/bin/true", ["str, not bytes"], [], [])  # type: ignore[list-item]
    _no_children_left()


@pytest.mark.timeout(30)
def test_c_spawn_child_kills_itself_when_its_parent_is_already_gone() -> None:
    """parent_pid that is not the parent: the death signal would never come, so it dies."""
    spawn = real_workers._cspawn
    if spawn is None:
        pytest.fail("the C start path was not built")
    pid = spawn.spawn(b"/bin/sleep", [b"sleep", b"30"], [], [], parent_pid=1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.timeout(30)
def test_c_spawn_dups_fds_and_clears_close_on_exec_of_a_same_numbered_one(
    tmp_path: Path,
) -> None:
    spawn = real_workers._cspawn
    if spawn is None:
        pytest.fail("the C start path was not built")
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        code = f"import os; os.write(1, b'one'); os.write({fd}, b'+two')"
        pid = spawn.spawn(PY.encode(), [b"python", b"-c", code.encode()], [], [(fd, 1), (fd, fd)])
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert out.read_text() == "one+two"


SUBREAPER_PROBE = """
import ctypes, sys
from elastic.real import proctree
if sys.argv[1] == "ctypes":
    proctree._ctypes_set_child_subreaper()
else:
    assert proctree.become_subreaper()
libc = ctypes.CDLL(None, use_errno=True)
flag = ctypes.c_int(0)
libc.prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
print(flag.value, "ctypes" in sys.modules)
"""


@pytest.mark.parametrize("how", ["c", "ctypes"])
def test_the_agent_becomes_a_child_subreaper_by_either_path(how: str) -> None:
    import subprocess

    out = subprocess.run(
        [PY, "-c", SUBREAPER_PROBE, how], capture_output=True, text=True, timeout=60, check=True
    )
    flag, _ = out.stdout.split()
    assert flag == "1", out.stderr


def test_becoming_a_subreaper_does_not_import_ctypes_when_the_extension_is_built() -> None:
    import subprocess

    if real_workers._cspawn is None:
        pytest.fail("the C start path was not built (pip install -e . builds it with gcc)")
    code = (
        "import sys; from elastic.real import proctree; assert proctree.become_subreaper(); "
        "print('ctypes' in sys.modules)"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
