"""``elastic run`` end to end, with real processes: environment, restarts, report, exit codes.

Every test has a time limit, and the ``tag`` fixture fails it if any process started
under it (found by a tag in its environment, which every worker and descendant
inherits) is still alive afterwards.  The helpers here are shared by the other
``test_run_*`` modules.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic.real import proctree
from tests.leftovers import no_leftover_processes

PY = sys.executable
ELASTIC_RUN = [PY, "-m", "elastic.cli", "run"]
TAG = "ELASTIC_TEST_TAG"

# -- helpers -------------------------------------------------------------------------


@pytest.fixture
def tag() -> Iterator[str]:
    """A tag for this test's processes; fails the test if any is left when it ends."""
    value = uuid.uuid4().hex
    with no_leftover_processes(lambda: [proctree.Marker(TAG, value)]):
        yield value


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    if state == b"Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def env_for(tag: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("OMP_NUM_THREADS", None)
    env[TAG] = tag
    env.update(extra)
    return env


def script(tmp_path: Path, code: str, name: str = "train.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


def elastic_run(
    args: list[str], tag: str, timeout: float = 60, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ELASTIC_RUN, *args],
        env=env_for(tag, **extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_elastic_run(args: list[str], tag: str, **extra_env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*ELASTIC_RUN, *args],
        env=env_for(tag, **extra_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_files(paths: list[Path], timeout: float = 30.0) -> None:
    """Test-side wait for workers to say they are ready (each writes its file)."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.stat().st_size > 0 for p in paths):
        assert time.monotonic() < deadline, f"not all of {paths} appeared"
        time.sleep(0.01)


def gone_within(pids: set[int], timeout: float) -> float | None:
    """Seconds until every pid is gone, or None if some outlived ``timeout``."""
    t0 = time.monotonic()
    while any(_alive(p) for p in pids):
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(0.005)
    return time.monotonic() - t0


ENV_DUMP = """
    import json, os, sys
    out = os.environ["OUT_DIR"]
    with open(os.path.join(out, "env." + os.environ["RANK"]), "w") as f:
        json.dump({"env": dict(os.environ), "argv": sys.argv[1:]}, f)
"""


def dumped_envs(out: Path, n: int) -> dict[int, dict[str, Any]]:
    return {r: json.loads((out / f"env.{r}").read_text()) for r in range(n)}


# -- environment ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_standalone_gives_each_worker_torchs_environment(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    train = script(tmp_path, ENV_DUMP)
    p = elastic_run(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            train,
            "--lr",
            "${local_rank}",
        ],
        tag,
        OUT_DIR=str(out),
    )
    assert p.returncode == 0, p.stderr
    dumps = dumped_envs(out, 2)
    ports = {d["env"]["MASTER_PORT"] for d in dumps.values()}
    run_ids = {d["env"]["TORCHELASTIC_RUN_ID"] for d in dumps.values()}
    assert len(ports) == 1 and len(run_ids) == 1
    assert 0 < int(ports.pop()) < 65536
    for rank, d in dumps.items():
        env = d["env"]
        assert d["argv"] == ["--lr", str(rank)]  # the ${local_rank} macro
        assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "ROLE_RANK")} == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "ROLE_RANK": str(rank),
        }
        assert env["GROUP_RANK"] == "0"
        assert env["ROLE_NAME"] == "default"
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "2"
        assert env["GROUP_WORLD_SIZE"] == "1"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "2"
        # the agent's store is not a c10d TCPStore: rank 0 hosts torch's store itself
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert env["OMP_NUM_THREADS"] == "1"
        assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{rank}/error.json")
        assert env["MASTER_ADDR"]


@pytest.mark.timeout(60)
def test_inherited_settings_are_kept_not_overwritten(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    train = script(tmp_path, ENV_DUMP)
    p = elastic_run(
        ["--nproc-per-node", "2", train],
        tag,
        OUT_DIR=str(out),
        OMP_NUM_THREADS="3",
        TORCH_NCCL_ASYNC_ERROR_HANDLING="0",
        CUDA_VISIBLE_DEVICES="1,0",
    )
    assert p.returncode == 0, p.stderr
    for d in dumped_envs(out, 2).values():
        assert d["env"]["OMP_NUM_THREADS"] == "3"
        assert d["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
        assert d["env"]["CUDA_VISIBLE_DEVICES"] == "1,0"


@pytest.mark.timeout(60)
def test_virtual_local_rank_gives_each_worker_its_own_device(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    train = script(tmp_path, ENV_DUMP)
    p = elastic_run(
        ["--nproc-per-node", "2", "--virtual-local-rank", train],
        tag,
        OUT_DIR=str(out),
        CUDA_VISIBLE_DEVICES="5,7",
    )
    assert p.returncode == 0, p.stderr
    dumps = dumped_envs(out, 2)
    assert [dumps[r]["env"]["CUDA_VISIBLE_DEVICES"] for r in (0, 1)] == ["5", "7"]
    assert [dumps[r]["env"]["LOCAL_RANK"] for r in (0, 1)] == ["0", "0"]


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_worker_sees_the_same_variable_names_as_under_torchrun(tmp_path: Path, tag: str) -> None:
    pytest.importorskip("torch", reason="torch (CPU) is needed to run torchrun")
    flags = ["--standalone", "--nproc-per-node", "2"]
    names: dict[str, set[str]] = {}
    for which, cmd in (
        ("elastic", ELASTIC_RUN),
        ("torchrun", [PY, "-m", "torch.distributed.run"]),
    ):
        out = tmp_path / which
        out.mkdir()
        train = script(tmp_path, ENV_DUMP)
        p = subprocess.run(
            [*cmd, *flags, train],
            env=env_for(tag, OUT_DIR=str(out)),
            capture_output=True,
            text=True,
            timeout=100,
        )
        assert p.returncode == 0, p.stderr
        base = set(env_for(tag, OUT_DIR=""))
        per_rank = [set(d["env"]) - base for d in dumped_envs(out, 2).values()]
        assert per_rank[0] == per_rank[1]
        names[which] = per_rank[0]
    assert names["elastic"] == names["torchrun"]


# -- bad input -------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "args, where",
    [
        (["--nproc-per-node", "zero"], "--nproc-per-node"),
        (["--max-restarts", "-1"], "--max-restarts"),
        (["--redirects", "9"], "--redirects"),
        (["--no-such-flag"], "unrecognized"),
        (["--event-log-handler", "nowhere"], "--event-log-handler"),
    ],
)
def test_bad_flag_is_one_line_and_exit_2(
    tmp_path: Path, tag: str, args: list[str], where: str
) -> None:
    train = script(tmp_path, "print('never')")
    p = elastic_run([*args, train], tag)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and where in lines[0], p.stderr
    assert "Traceback" not in p.stderr


# -- torch's filtered copies of the tee'd output ----------------------------------------

FILTERED = """
    import os, sys, time
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print("loss 1.0 at attempt", attempt, flush=True)
    print("noise", flush=True)
    print("NaN, once", file=sys.stderr, flush=True)
    if attempt == "0":
        # both ranks print before either fails (the first failure stops the other)
        out = os.environ["OUT_DIR"]
        open(os.path.join(out, "printed." + os.environ["RANK"]), "w").close()
        deadline = time.monotonic() + 20
        while len([f for f in os.listdir(out) if f.startswith("printed.")]) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        sys.exit(3)
"""


@pytest.mark.timeout(60)
def test_duplicate_filters_copy_matching_tee_lines_to_each_attempts_files(
    tmp_path: Path, tag: str
) -> None:
    train = script(tmp_path, FILTERED)
    logs = tmp_path / "logs"
    p = elastic_run(
        [
            "--nproc-per-node", "2", "--max-restarts", "1", "--tee", "3",
            "--log-dir", str(logs),
            "--duplicate-stdout-filters", "loss,acc",
            "--duplicate-stderr-filters", "NaN",
            train,
        ],
        tag,
        OUT_DIR=str(tmp_path),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    for attempt in (0, 1):
        (run_dir,) = logs.iterdir()
        out = (run_dir / f"attempt_{attempt}" / "filtered_stdout.log").read_text()
        err = (run_dir / f"attempt_{attempt}" / "filtered_stderr.log").read_text()
        assert sorted(out.splitlines()) == [
            f"[default{r}]:loss 1.0 at attempt {attempt}" for r in (0, 1)
        ], out
        assert sorted(err.splitlines()) == [f"[default{r}]:NaN, once" for r in (0, 1)], err
    assert "noise" in p.stdout  # the console still gets every line


# -- restarts and the failure report ----------------------------------------------------

CRASH_ONCE = """
    import os
    from elastic.multiprocessing.errors import record

    @record
    def main():
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        out = os.environ["OUT_DIR"]
        open(os.path.join(out, f"ran.{os.environ['RANK']}.{attempt}"), "w").close()
        if os.environ["RANK"] == "1" and int(attempt) < int(os.environ["CRASH_ATTEMPTS"]):
            raise RuntimeError(f"boom on attempt {attempt}")

    main()
"""


@pytest.mark.timeout(60)
def test_worker_crashing_once_is_restarted_with_restart_count_1(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    train = script(tmp_path, CRASH_ONCE)
    p = elastic_run(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", train],
        tag,
        OUT_DIR=str(out),
        CRASH_ATTEMPTS="1",
    )
    assert p.returncode == 0, p.stderr
    ran = {f.name for f in out.iterdir()}
    # rank 0's first attempt may be stopped before it gets to run: only the rest is sure
    assert {"ran.1.0", "ran.0.1", "ran.1.1"} <= ran <= {"ran.0.0", "ran.1.0", "ran.0.1", "ran.1.1"}


@pytest.mark.timeout(60)
def test_restarts_exhausted_exits_1_with_the_root_cause_report(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    train = script(tmp_path, CRASH_ONCE)
    p = elastic_run(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs), train],
        tag,
        OUT_DIR=str(out),
        CRASH_ATTEMPTS="5",
    )
    assert p.returncode == 1
    report = p.stderr[p.stderr.index("ChildFailedError") :]
    assert f"{train} FAILED" in report
    assert "Root Cause (first observed failure):" in report
    assert "rank      : 1 (local_rank: 1)" in report
    assert "exitcode  : 1 (pid: " in report
    assert "host      : " in report and "time      : " in report
    assert "RuntimeError: boom on attempt 1" in report  # the traceback from error.json
    assert "attempt_1/1/error.json" in report
    assert "Traceback" not in p.stderr[: p.stderr.index("ChildFailedError")].split("boom")[-1]


@pytest.mark.timeout(60)
def test_worker_killed_by_a_signal_is_reported_with_the_signal_name(
    tmp_path: Path, tag: str
) -> None:
    train = script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    p = elastic_run(["--nproc-per-node", "1", train], tag)
    assert p.returncode == 1
    assert "exitcode  : -11 (pid: " in p.stderr and "(SIGSEGV)" in p.stderr
    assert "Signal 11 (SIGSEGV) received by PID" in p.stderr


@pytest.mark.timeout(60)
def test_successful_job_exits_0_and_output_reaches_the_console(tmp_path: Path, tag: str) -> None:
    # one write per line: unbuffered workers share the agent's stdout, as under torchrun
    train = script(
        tmp_path, "import os, sys\nsys.stdout.write(f'hello {os.environ[\"RANK\"]}\\n')\n"
    )
    p = elastic_run(["--nproc-per-node", "2", train], tag)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["hello 0", "hello 1"]


@pytest.mark.timeout(60)
def test_event_log_handler_console_records_torchs_events_on_stderr(
    tmp_path: Path, tag: str
) -> None:
    train = script(tmp_path, "print('ok')\n")
    p = elastic_run(["--nproc-per-node", "2", "--event-log-handler", "console", train], tag)
    assert p.returncode == 0, p.stderr
    recorded = []
    for line in p.stderr.splitlines():
        try:
            recorded.append(json.loads(line))
        except ValueError:
            continue
    names = [(e["name"], e["source"]) for e in recorded]
    assert names.count(("torchelastic.worker.status.START", "WORKER")) == 2
    assert names.count(("torchelastic.worker.status.SUCCEEDED", "WORKER")) == 2
    assert names[:2] == [
        ("torchelastic.worker.status.RENDEZVOUS", "AGENT"),
        ("torchelastic.worker.status.ASSIGN_WORKER_RANKS", "AGENT"),
    ]
    done = [
        e
        for e in recorded
        if e["name"] == "torchelastic.worker.status.SUCCEEDED" and e["source"] == "WORKER"
    ]
    assert sorted(e["metadata"]["global_rank"] for e in done) == [0, 1]
    assert {e["metadata"]["state"] for e in done} == {"SUCCEEDED"}
    assert {json.loads(e["metadata"]["metadata"])["entry_point"] for e in done} == {Path(PY).name}
    # and, last, the agent's own status, as torch's launch_agent records it
    assert names[-1] == ("torchelastic.worker.status.SUCCEEDED", "AGENT")
    assert recorded[-1]["metadata"]["raw_error"] is None
    # the default, "null", records nothing
    quiet = elastic_run(["--nproc-per-node", "1", train], tag)
    assert quiet.returncode == 0 and "torchelastic.worker.status" not in quiet.stderr


@pytest.mark.timeout(60)
def test_module_flag_runs_python_dash_m(tmp_path: Path, tag: str) -> None:
    pkg = tmp_path / "mymod.py"
    pkg.write_text("import os\nprint('module', os.environ['RANK'])\n")
    p = elastic_run(["--nproc-per-node", "1", "-m", "mymod"], tag, PYTHONPATH=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "module 0" in p.stdout


def test_no_sidecar_means_one_line_and_no_launch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # elastic run starts its reaper sidecar first; where no process can be started, it
    # says so in one line instead of launching workers it could not protect
    import errno

    from elastic.run import cli_main

    def refuse(*a: object, **k: object) -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "posix_spawn", refuse)
    code = cli_main(["--standalone", "--nproc-per-node", "1", "--no-python", "/bin/true"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == [
        "elastic run: error: cannot start the reaper sidecar: "
        "[Errno 11] Resource temporarily unavailable"
    ]
