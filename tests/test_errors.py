"""Error files, ProcessFailure, ChildFailedError's report, @record, and the exit decoder."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from elastic.errors import ElasticError
from elastic.multiprocessing.errors import (
    ChildFailedError,
    ErrorHandler,
    ProcessFailure,
    get_error_handler,
    record,
)
from elastic.multiprocessing.errors.error_handler import MAX_ERROR_FILE_BYTES, read_error_file
from elastic.multiprocessing.errors.report import (
    OomCounters,
    describe_exit,
    failure_from_exit,
    oom_verdict,
    read_oom_counters,
)
from elastic.workers import ExitCause, WorkerExit

T0 = 1_700_000_000


def _torch_error_file(path: Path, message: str, ts: int, stack: str = "Traceback: boom") -> str:
    data = {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": stack, "timestamp": str(ts)},
        }
    }
    path.write_text(json.dumps(data))
    return str(path)


# --- @record and ErrorHandler --------------------------------------------------------


def test_record_writes_torch_error_file_and_reraises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(err))

    @record
    def main() -> None:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        main()
    data = json.loads(err.read_text())
    assert data["message"]["message"] == "ValueError: bad batch"
    assert "raise ValueError" in data["message"]["extraInfo"]["py_callstack"]
    assert int(data["message"]["extraInfo"]["timestamp"]) > T0
    assert not list(tmp_path.glob("*.tmp")), "temporary file left behind"


def test_record_returns_none_on_exit_zero_and_propagates_other_exit_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(err))

    @record
    def ok() -> int:
        raise SystemExit(0)

    @record
    def bad() -> int:
        raise SystemExit(3)

    assert ok() is None
    with pytest.raises(SystemExit) as info:
        bad()
    assert info.value.code == 3
    assert not err.exists(), "SystemExit is not an error to record"


def test_record_passes_return_value_and_writes_nothing_on_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(err))
    assert record(lambda x: x + 1)(41) == 42
    assert not err.exists()


def test_record_copies_root_cause_file_of_child_failed_error_with_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = _torch_error_file(tmp_path / "child.json", "RuntimeError: nccl", T0)
    later = _torch_error_file(tmp_path / "later.json", "RuntimeError: later", T0 + 5)
    own = tmp_path / "own.json"
    own.write_text("stale, not json")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(own))

    @record
    def agent_main() -> None:
        raise ChildFailedError(
            "train.py",
            {4: ProcessFailure(1, 11, 1, later), 3: ProcessFailure(0, 10, -11, child)},
            hostname="h",
        )

    with pytest.raises(ChildFailedError):
        agent_main()
    copied = json.loads(own.read_text())
    assert copied["message"]["message"] == "RuntimeError: nccl"
    assert copied["message"]["errorCode"] == -11


def test_dump_error_file_skips_malformed_child_file_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = tmp_path / "child.json"
    child.write_text('{"message": ')
    own = tmp_path / "own.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(own))
    ErrorHandler().dump_error_file(str(child), 1)
    assert not own.exists()


def test_error_handler_warns_instead_of_raising_when_file_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "missing-dir" / "e.json"))
    with pytest.warns(UserWarning, match="Unable to write error to file"):
        get_error_handler().record_exception(RuntimeError("x"))


def test_error_handler_without_env_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    ErrorHandler().record_exception(RuntimeError("x"))
    assert list(tmp_path.iterdir()) == []


# --- ProcessFailure -------------------------------------------------------------------


def test_process_failure_reads_message_and_timestamp_from_error_file(tmp_path: Path) -> None:
    f = _torch_error_file(tmp_path / "e.json", "KeyError: 'x'", T0 + 7)
    pf = ProcessFailure(2, 99, 1, f, fallback_timestamp=T0)
    assert pf.error_file == f
    assert pf.timestamp == T0 + 7
    assert isinstance(pf.message, dict)
    assert pf.traceback_text() == "Traceback: boom"
    assert pf.error_file_problem is None


def test_process_failure_reads_new_string_message_format(tmp_path: Path) -> None:
    f = tmp_path / "e.json"
    f.write_text(json.dumps({"message": "plain text", "timestamp": T0 + 3}))
    pf = ProcessFailure(0, 1, 1, str(f))
    assert (pf.message, pf.timestamp) == ("plain text", T0 + 3)


def test_process_failure_without_file_names_the_signal(tmp_path: Path) -> None:
    pf = ProcessFailure(0, 1234, -9, str(tmp_path / "absent.json"), fallback_timestamp=T0)
    assert pf.error_file == "<N/A>"
    assert pf.message == "Signal 9 (SIGKILL) received by PID 1234"
    assert pf.timestamp == T0
    assert pf.signal_name() == "SIGKILL"


def test_process_failure_without_file_and_positive_code_points_to_record(tmp_path: Path) -> None:
    pf = ProcessFailure(0, 1, 2, "", fallback_timestamp=T0)
    assert pf.error_file == "<N/A>"
    assert "elastic/errors.html" in str(pf.message)
    assert pf.error_file_data["errorTraits"]["category"] == "system_terminated_error"
    assert pf.signal_name() == "<N/A>"
    assert ProcessFailure(0, 1, -200, "").signal_name() == "<N/A>"


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


BAD_FILES: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("truncated", b'{"message": {"message": "x", "extraI'),
    ("not json", b"Segmentation fault (core dumped)\n"),
    ("not utf-8", b"\xff\xfe\x00garbage"),
    ("a list", b"[1, 2, 3]"),
    ("no message", b'{"error": "x"}'),
    ("message is a number", b'{"message": 5}'),
    ("too deep", _nested(200_000)),
    ("huge", b'{"message": "' + b"x" * (MAX_ERROR_FILE_BYTES + 10) + b'"}'),
]


@pytest.mark.parametrize(("label", "content"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_process_failure_never_raises_on_bad_error_file(
    tmp_path: Path, label: str, content: bytes
) -> None:
    f = tmp_path / "error.json"
    f.write_bytes(content)
    pf = ProcessFailure(1, 7, -6, str(f), fallback_timestamp=T0)
    assert pf.error_file == str(f), "the path stays so the user can look at it"
    assert isinstance(pf.message, str) and pf.message.startswith("<N/A> (error file ")
    assert pf.error_file_problem
    assert pf.timestamp == T0
    report = str(ChildFailedError("w", {1: pf}, hostname="h"))
    assert "<N/A> (error file" in report


def test_process_failure_tolerates_odd_but_valid_shapes(tmp_path: Path) -> None:
    f = tmp_path / "e.json"
    f.write_text(json.dumps({"message": {"extraInfo": "nope"}}))
    pf = ProcessFailure(0, 1, 1, str(f), fallback_timestamp=T0)
    assert pf.timestamp == T0
    assert pf.traceback_text() == "<N/A>"
    f.write_text(json.dumps({"message": {"message": "m", "extraInfo": {"timestamp": "abc"}}}))
    pf = ProcessFailure(0, 1, 1, str(f), fallback_timestamp=T0)
    assert (pf.timestamp, pf.traceback_text()) == (T0, "m")


@pytest.mark.timeout(10)
def test_process_failure_does_not_block_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "error.json"
    os.mkfifo(fifo)
    pf = ProcessFailure(0, 1, 1, str(fifo))
    assert pf.error_file == "<N/A>"


def test_read_error_file_reports_why(tmp_path: Path) -> None:
    assert read_error_file(str(tmp_path / "x")).problem == "no such file"
    f = tmp_path / "e.json"
    f.write_text("{}")
    assert read_error_file(str(f)).problem == 'no "message" field'
    f.write_text('{"message": "ok"}')
    assert read_error_file(str(f)).data == {"message": "ok"}


# --- ChildFailedError -----------------------------------------------------------------


def test_child_failed_error_puts_earliest_failure_last_as_root_cause(tmp_path: Path) -> None:
    early = _torch_error_file(tmp_path / "a.json", "ValueError: first", T0, "Trace\nline2")
    failures = {
        5: ProcessFailure(1, 501, -15, "", fallback_timestamp=T0 + 9),
        4: ProcessFailure(0, 500, 1, early),
    }
    e = ChildFailedError("train.py", failures, hostname="node-7")
    assert e.get_first_failure() == (4, failures[4])
    lines = str(e).split("\n")
    assert lines[0] == ""
    width = len(lines[1])
    assert width <= 60 and set(lines[1]) == {"="} and lines[-1] == lines[1]
    assert lines[2] == "train.py FAILED"
    assert lines[3] == "-" * width and lines[4] == "Failures:"
    root_at = lines.index("Root Cause (first observed failure):")
    other = "\n".join(lines[5:root_at])
    root = "\n".join(lines[root_at + 1 : -1])
    assert "rank      : 5 (local_rank: 1)" in other
    assert "exitcode  : -15 (pid: 501)  (SIGTERM)" in other  # torch: two spaces in other
    assert "rank      : 4 (local_rank: 0)" in root
    assert "host      : node-7" in root
    assert "exitcode  : 1 (pid: 500) \n" in root
    assert "traceback : Trace\n  line2" in root
    assert f"error_file: {early}" in root


def test_child_failed_error_with_one_failure_says_no_other_failures() -> None:
    e = ChildFailedError("w", {0: ProcessFailure(0, 1, 1, "", fallback_timestamp=T0)}, "h")
    assert "Failures:\n  <NO_OTHER_FAILURES>\n" in str(e)


def test_child_failed_error_keeps_fields_in_args_and_rebuilds_from_them() -> None:
    failures = {0: ProcessFailure(0, 1, -9, "", fallback_timestamp=T0)}
    e = ChildFailedError("w", failures, "h")
    assert isinstance(e, ElasticError)
    assert e.args == ("w", failures, "h")
    again = type(e)(*e.args)
    assert str(again) == str(e)


def test_child_failed_error_refuses_empty_failures() -> None:
    with pytest.raises(AssertionError):
        ChildFailedError("w", {})


def test_report_adds_cause_line_only_when_the_agent_knows_the_cause() -> None:
    plain = ProcessFailure(0, 1, -9, "", fallback_timestamp=T0)
    oom = ProcessFailure(0, 1, -9, "", fallback_timestamp=T0, cause=ExitCause.OOM_KILLED)
    assert "cause" not in str(ChildFailedError("w", {0: plain}, "h"))
    text = str(ChildFailedError("w", {0: oom}, "h"))
    assert (
        "exitcode  : -9 (pid: 1)  (SIGKILL)\n"
        "  cause     : killed by the kernel's OOM killer (SIGKILL)\n" in text
    )


@pytest.mark.torch
def test_report_and_error_files_match_torch_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    import torch.distributed.elastic.multiprocessing.errors as terr

    # A file written by torch's @record is read by us, and the report is torch's.
    tfile = tmp_path / "torch.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tfile))

    def boom() -> None:
        raise RuntimeError("from torch")

    with pytest.raises(RuntimeError):
        terr.record(boom)()
    ofile = tmp_path / "ours.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(ofile))
    with pytest.raises(RuntimeError):
        record(boom)()
    # Both files are read by torch without error, and by us.
    for f in (tfile, ofile):
        tf = terr.ProcessFailure(0, 10, 1, str(f))
        of = ProcessFailure(0, 10, 1, str(f))
        assert (of.message, of.timestamp) == (tf.message, tf.timestamp)

    cases: dict[int, tuple[int, int, int, str]] = {
        0: (0, 10, 1, str(tfile)),
        1: (1, 11, -9, str(tmp_path / "absent.json")),
        7: (3, 12, 2, str(ofile)),
    }
    tfails: dict[int, Any] = {r: terr.ProcessFailure(*c) for r, c in cases.items()}
    ofails = {
        r: ProcessFailure(*c, fallback_timestamp=tfails[r].timestamp) for r, c in cases.items()
    }
    ours = ChildFailedError("trainer", ofails, hostname=socket.getfqdn())
    theirs = terr.ChildFailedError("trainer", tfails)
    assert str(ours) == str(theirs)
    assert ours.get_first_failure()[0] == theirs.get_first_failure()[0]


# --- report: exit decoder and OOM ------------------------------------------------------


SEGV = "crashed: SIGSEGV (raised by the process itself: a fault or abort())"


@pytest.mark.parametrize(
    ("code", "cause", "text"),
    [
        (-15, ExitCause.STOPPED_BY_AGENT, "killed by the agent (SIGTERM during group stop)"),
        (-9, ExitCause.STOPPED_BY_AGENT, "killed by the agent (SIGKILL during group stop)"),
        (  # the agent sends no SIGABRT: an abort() in the worker while it was being stopped
            -6,
            ExitCause.STOPPED_BY_AGENT,
            "crashed: SIGABRT (raised by the process itself while the agent stopped the group)",
        ),
        (-9, ExitCause.SIGNALED, "killed from outside by SIGKILL"),
        (-9, ExitCause.OOM_KILLED, "killed by the kernel's OOM killer (SIGKILL)"),
        (-11, None, SEGV),
        (-11, ExitCause.EXITED, SEGV),
        (0, None, "exited normally (code 0)"),
        (3, None, "exited with code 3"),
        (137, None, "exited with code 137 (a shell's way of saying its child got SIGKILL)"),
        (-1, ExitCause.LOST, "lost with its node (no exit status was seen)"),
        (0, ExitCause.STOPPED_BY_AGENT, "exited with code 0 while the agent stopped the group"),
        (-99, ExitCause.SIGNALED, "killed from outside by signal 99"),
    ],
)
def test_describe_exit_says_who_ended_the_worker(
    code: int, cause: ExitCause | None, text: str
) -> None:
    assert describe_exit(code, cause) == text


def _fake_host(tmp_path: Path, cgroup_line: str, files: dict[str, str]) -> tuple[str, str]:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_line)
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(proc), str(root)


def test_read_oom_counters_reads_cgroup_v2_memory_events(tmp_path: Path) -> None:
    proc, root = _fake_host(
        tmp_path,
        "0::/job.slice/agent\n",
        {"job.slice/agent/memory.events": "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n"},
    )
    (Path(proc) / "vmstat").write_text("nr_free_pages 5\noom_kill 17\n")
    c = read_oom_counters(proc_root=proc, cgroup_root=root)
    assert c == OomCounters("v2:/job.slice/agent", 2, 17)


def test_read_oom_counters_reads_cgroup_v1_oom_control(tmp_path: Path) -> None:
    proc, root = _fake_host(
        tmp_path,
        "12:pids:/x\n4:memory:/docker/abc\n0::/\n",
        {"memory/docker/abc/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"},
    )
    assert read_oom_counters(proc_root=proc, cgroup_root=root) == OomCounters(
        "v1:/docker/abc", 1, None
    )


def test_read_oom_counters_is_safe_when_nothing_is_there(tmp_path: Path) -> None:
    c = read_oom_counters(proc_root=str(tmp_path / "no"), cgroup_root=str(tmp_path / "none"))
    assert c == OomCounters(None, None, None)
    c = read_oom_counters(pid=2**22 + 12345)  # no such process on this machine
    assert (c.cgroup, c.cgroup_oom_kills) == (None, None)


def test_read_oom_counters_on_this_machine_does_not_raise() -> None:
    c = read_oom_counters()
    assert c.cgroup_oom_kills is None or c.cgroup_oom_kills >= 0


def test_oom_verdict_trusts_the_cgroup_count() -> None:
    before = OomCounters("v2:/a", 1, 5)
    assert oom_verdict(-9, before, OomCounters("v2:/a", 2, 5)).oom is True
    # the machine-wide count rose, but not ours: another cgroup's victim
    assert oom_verdict(-9, before, OomCounters("v2:/a", 1, 9)).oom is False
    assert oom_verdict(137, before, OomCounters("v2:/a", 2, 5)).oom is True


def test_oom_verdict_falls_back_to_machine_wide_count_then_unknown() -> None:
    v = oom_verdict(-9, OomCounters(None, None, 3), OomCounters(None, None, 4))
    assert v.oom is True and "likely" in v.reason
    assert oom_verdict(-9, OomCounters(None, None, 3), OomCounters(None, None, 3)).oom is False
    assert oom_verdict(-9, OomCounters(None, None, None), OomCounters(None, None, None)).oom is None
    # different cgroups are not compared
    v = oom_verdict(-9, OomCounters("v2:/a", 1, None), OomCounters("v2:/b", 5, None))
    assert v.oom is None


def test_oom_verdict_says_no_for_exits_other_than_sigkill() -> None:
    c = OomCounters("v2:/a", 1, 1)
    assert oom_verdict(-int(signal.SIGTERM), c, OomCounters("v2:/a", 9, 9)).oom is False
    assert oom_verdict(1, c, OomCounters("v2:/a", 9, 9)).oom is False


def test_failure_from_exit_carries_cause_and_fallback_time() -> None:
    ex = WorkerExit(local_rank=2, exit_code=-9, time=3.5, cause=ExitCause.OOM_KILLED, pid=77)
    pf = failure_from_exit(ex, fallback_timestamp=T0)
    assert (pf.local_rank, pf.pid, pf.exitcode, pf.error_file) == (2, 77, -9, "<N/A>")
    assert (pf.cause, pf.timestamp) == (ExitCause.OOM_KILLED, T0)
    plain = failure_from_exit(WorkerExit(local_rank=0, exit_code=1, time=0.0), T0)
    assert plain.cause is None and plain.pid == -1


def test_a_fault_signal_is_a_crash_not_a_kill_from_outside() -> None:
    from elastic.multiprocessing.errors.report import describe_exit
    from elastic.workers import ExitCause

    assert describe_exit(-11, ExitCause.SIGNALED).startswith("crashed: SIGSEGV")
    assert describe_exit(-6, ExitCause.SIGNALED).startswith("crashed: SIGABRT")
    assert describe_exit(-9, ExitCause.SIGNALED) == "killed from outside by SIGKILL"
