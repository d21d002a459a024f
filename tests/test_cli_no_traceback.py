"""``elastic sim`` / ``elastic report`` never end in a traceback (issue 13 item 5, issue 15
item 8): bad flags, bad output paths, bad event logs, a closed pipe and Ctrl-C each give
one line and a documented exit code; ``--json`` is always valid JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic.cli import main
from sim.eventlog import MAX_LINE_BYTES, EventLogError, parse_event

ROOT = Path(__file__).resolve().parent.parent
CLEAN = str(ROOT / "scenarios" / "clean_run.yaml")
GOOD_LINE = (
    '{"fields":{"restarts":0,"state":"SUCCEEDED"},"kind":"agent.finish",'
    '"node":"h","rank":null,"role":"default","t":1.5}'
)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _bad_sim_args(tmp: Path) -> list[list[str]]:
    return [
        [str(tmp / "missing.yaml")],
        [str(tmp)],
        [CLEAN, "--seed", "-1"],
        [CLEAN, "--seed", "abc"],
        [CLEAN, "--seed", "9" * 40],
        [CLEAN, "--plot", str(tmp / "out.xyz")],
        [CLEAN, "--plot", str(tmp / "noext")],
        [CLEAN, "--plot", str(tmp / "missing" / "t.png")],
        [CLEAN, "--plot", str(tmp)],
        [CLEAN, "--events", str(tmp)],
        [CLEAN, "--events", str(tmp / "missing" / "ev.jsonl")],
        [CLEAN, "--events", ""],
        [CLEAN, "--write-faults", "/nonexistent/x.yaml"],
        [CLEAN, "--write-faults", str(tmp)],
        [CLEAN, "--no-such-flag"],
        [],
    ]


def test_bad_flag_values_of_elastic_sim_give_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in _bad_sim_args(tmp_path):
        code, out, err = _run(["sim", *argv], capsys)
        assert code == 2, (argv, code, err)
        assert "Traceback" not in err and out == "", argv
        assert len(err.strip().splitlines()) == 1, (argv, err)
        assert not list(tmp_path.glob("*.png")), "a bad flag must be refused before the run"


def _bad_logs() -> dict[str, bytes]:
    deep = b'{"t":1,"node":0,"kind":"k","fields":{"a":' + b"[" * 5000 + b"]" * 5000 + b"}}"
    good = GOOD_LINE.encode()
    return {
        "empty": b"",
        "blank lines": b"\n\n  \n",
        "not json": b"hello\n",
        "a json array": b"[1, 2]\n",
        "a json string": b'"event"\n',
        "NaN time": b'{"t":NaN,"node":0,"kind":"k"}\n',
        "Infinity in fields": b'{"t":1,"node":0,"kind":"k","fields":{"x":Infinity}}\n',
        "huge float": b'{"t":1e999,"node":0,"kind":"k"}\n',
        "huge int": b'{"t":1,"node":0,"kind":"k","fields":{"x":' + b"9" * 5000 + b"}}\n",
        "int beyond 2**63": b'{"t":1,"node":0,"kind":"k","fields":{"x":' + b"9" * 30 + b"}}\n",
        "time as string": b'{"t":"1","node":0,"kind":"k"}\n',
        "time far away": b'{"t":1e20,"node":0,"kind":"k"}\n',
        "list node": b'{"t":1,"node":[0],"kind":"k"}\n',
        "bool node": b'{"t":1,"node":true,"kind":"k"}\n',
        "negative node": b'{"t":1,"node":-3,"kind":"k"}\n',
        "empty kind": b'{"t":1,"node":0,"kind":""}\n',
        "no kind": b'{"t":1,"node":0}\n',
        "unknown key": b'{"t":1,"node":0,"kind":"k","extra":1}\n',
        "fields a list": b'{"t":1,"node":0,"kind":"k","fields":[1]}\n',
        "rank a string": b'{"t":1,"node":0,"kind":"k","rank":"0"}\n',
        "restarts a string": b'{"t":1,"node":0,"kind":"agent.finish","fields":{"restarts":"x"}}\n',
        "round a float": b'{"t":1,"node":0,"kind":"RENDEZVOUS","fields":{"round":1.5}}\n',
        "world size negative": (
            b'{"t":1,"node":0,"kind":"agent.group_started","fields":{"world_size":-2}}\n'
        ),
        "deep json": deep + b"\n",
        "not utf-8": b'{"t":1,"node":0,"kind":"\xff"}\n',
        "overlong line": b'{"t":1,"node":0,"kind":"k","fields":{"x":"'
        + b"a" * MAX_LINE_BYTES
        + b'"}}\n',
        "good then bad": good + b"\n" + b'{"t":1}\n',
        "binary": bytes(range(256)) * 4,
    }


def test_bad_event_logs_give_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, data in _bad_logs().items():
        log = tmp_path / "bad.jsonl"
        log.write_bytes(data)
        for extra in ([], ["--json"]):
            code, out, err = _run(["report", str(log), *extra], capsys)
            assert code == 2, (name, code, out, err)
            assert out == "" and len(err.strip().splitlines()) == 1, (name, err)
            assert err.startswith(f"elastic report: {log}"), (name, err)


@pytest.mark.timeout(30)
def test_report_refuses_what_is_not_a_regular_file_without_waiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: opening it to read would wait forever
    for path in (str(fifo), "/dev/zero", str(tmp_path), str(tmp_path / "missing")):
        t0 = time.monotonic()
        code, out, err = _run(["report", path], capsys)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (path, err)
        assert time.monotonic() - t0 < 5


def _strict_json(text: str) -> object:
    def refuse(name: str) -> object:
        raise AssertionError(f"{name} in --json output")

    return json.loads(text, parse_constant=refuse)


def test_a_real_runs_log_reports_what_a_real_run_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        {"t": 100.0, "node": "h", "kind": "agent.start", "fields": {"max_restarts": 2}},
        {"t": 100.1, "node": "h", "kind": "RENDEZVOUS", "fields": {"round": 0}},
        {"t": 100.2, "node": "h", "kind": "agent.group_started", "fields": {"world_size": 4}},
        {
            "t": 103.0,
            "node": "h",
            "kind": "torchelastic.worker.status.FAILED",
            "rank": 1,
            "fields": {"exit_code": 3},
        },
        {"t": 103.0, "node": "h", "kind": "agent.restart", "fields": {"reason": "failure"}},
        {"t": 103.1, "node": "h", "kind": "RENDEZVOUS", "fields": {"round": 1}},
        {"t": 103.4, "node": "h", "kind": "agent.group_started", "fields": {"world_size": 2}},
        {
            "t": 110.0,
            "node": "h",
            "kind": "agent.finish",
            "fields": {"state": "SUCCEEDED", "restarts": 1},
        },
    ]
    log = tmp_path / "real.jsonl"
    log.write_text("".join(json.dumps(d) + "\n" for d in lines))
    code, out, err = _run(["report", str(log)], capsys)
    assert code == 0, err
    for simulator_only in ("seed", "steps done", "goodput", "simulated", "wall time"):
        assert simulator_only not in out, simulator_only
    assert "world sizes          4 → 2" in out
    assert "10.000 s (first to last event)" in out
    code, out, _ = _run(["report", str(log), "--json"], capsys)
    report = _strict_json(out)
    assert isinstance(report, dict)
    assert report["restarts"] == 1 and report["world_sizes"] == [4, 2]
    assert report["recovery_s"] == [pytest.approx(0.4)]
    assert not {"seed", "steps_done", "goodput", "sim_time_s"} & set(report)


def test_a_failed_run_says_why_one_line_per_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sc = tmp_path / "gpu.yaml"
    sc.write_text(
        "name: a GPU error leaves too few nodes\nseed: 1\nuntil: 2h\n"
        "cluster: {nodes: 2, nproc_per_node: 2}\n"
        "job: {steps: 2000, step_time: 2s, startup_time: 10s, checkpoint_every: 100}\n"
        "rendezvous: {min_nodes: 2, max_nodes: 2, join_timeout: 5m}\n"
        "faults:\n  - {at: 10m, kind: gpu_error, node: 1, restart_after: 1h}\n"
        "expect: {state: SUCCEEDED}\n"
    )
    code, out, _ = _run(["sim", str(sc)], capsys)
    assert code == 1
    why = out[out.index("why it ended FAILED:") : out.index("expectations FAILED:")]
    assert "node 1 excluded by gpu_error at 600.0 s" in why
    assert "min_nodes=2" in why


def test_check_determinism_prints_its_verdict_and_the_hash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _run(["sim", CLEAN, "--check-determinism"], capsys)
    assert code == 0
    assert "determinism" in out and "same event log twice (sha256 " in out
    code, out, _ = _run(["sim", CLEAN, "--check-determinism", "--json"], capsys)
    assert len(_strict_json(out)["event_log_sha256"]) == 64  # type: ignore[index]


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=2000)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.fixed_dictionaries(
            {},
            optional={
                "t": _JSONISH,
                "node": _JSONISH,
                "kind": st.sampled_from(["agent.finish", "RENDEZVOUS", "sim.start", "k"])
                | _JSONISH,
                "rank": _JSONISH,
                "role": _JSONISH,
                "fields": _JSONISH,
            },
        ).map(lambda d: json.dumps(d).encode()),
    )
)
def test_any_line_parses_to_an_event_or_one_error(line: bytes) -> None:
    try:
        event = parse_event(line, "f:1")
    except EventLogError as e:
        assert str(e).startswith("f:1: ") and "\n" not in str(e)
        return
    json.loads(event.to_json(), parse_constant=lambda c: pytest.fail(f"{c} accepted"))


def _elastic(*args: str) -> list[str]:
    return [sys.executable, "-c", "from elastic.cli import entry; entry()", *args]


@pytest.mark.timeout(120)
def test_a_closed_output_pipe_ends_quietly() -> None:
    with subprocess.Popen(
        _elastic("sim", CLEAN), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as p:
        assert p.stdout is not None and p.stderr is not None
        # the reader goes away before the report is printed (the interpreter's start-up
        # alone takes longer than this close), as `head` does after its lines
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=100) == 141, err
    assert err == ""


def _default_sigint() -> None:
    """In the child: Ctrl-C's default action, whatever this suite inherited (a shell
    starts background jobs with SIGINT ignored, and a Python started so keeps ignoring
    it, as it should)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(120)
def test_ctrl_c_during_a_long_run_prints_one_line_and_exits_130() -> None:
    p = subprocess.Popen(
        # the longest scenario (2,048 nodes, 54 days: minutes): still running at any speed
        _elastic("sim", str(ROOT / "scenarios" / "llama3_405b.yaml")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    time.sleep(2.0)  # well into the simulation
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert err.strip() == "elastic sim: interrupted" and out == ""


@pytest.mark.timeout(60)
def test_ctrl_c_that_drops_a_fresh_coroutine_still_prints_one_line() -> None:
    # Ctrl-C between a coroutine's creation and its first step (a simulated store
    # operation hit this in CI): unwinding drops it un-awaited, and Python would warn
    # "coroutine ... was never awaited" on stderr before the one line
    code = """
import asyncio, os, signal, sys
from elastic.cli import _guarded

def command(argv):
    async def op():
        return 1
    pending = op()
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10**7):
        pass
    return 0

sys.exit(_guarded("sim", command, []))
"""
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=ROOT,
        preexec_fn=_default_sigint,
    )
    assert p.returncode == 130, p.stderr
    assert p.stderr.strip() == "elastic sim: interrupted" and p.stdout == ""


def _with_tty_stderr(argv: list[str]) -> tuple[int, bytes]:
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    # a terminal of 24 x 100 (a new pty has 0 columns, where a bar has no room)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        chunks: list[bytes] = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break  # EIO: the child closed its end
            if not data:
                break
            chunks.append(data)
        return p.wait(timeout=100), b"".join(chunks)
    finally:
        os.close(master)


@pytest.mark.timeout(120)
def test_progress_is_drawn_on_a_terminal_only_and_never_with_json(tmp_path: Path) -> None:
    code, err = _with_tty_stderr(_elastic("sim", CLEAN))
    assert code == 0 and b"simulated hours" in err, err
    code, err = _with_tty_stderr(_elastic("sim", CLEAN, "--json"))
    assert code == 0 and b"simulated hours" not in err, err
    piped = subprocess.run(_elastic("sim", CLEAN), capture_output=True, timeout=100)
    assert b"simulated hours" not in piped.stderr


def test_help_lists_every_command_and_version_names_the_distribution(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from importlib.metadata import entry_points

    code, out, _ = _run(["--help"], capsys)
    assert code == 0
    for name in {"run", *(ep.name for ep in entry_points(group="elastic.commands"))}:
        assert f"\n  {name} " in out, name
    code, out, _ = _run(["--version"], capsys)
    from elastic import __version__

    assert code == 0 and out == f"elastic-sim-agent {__version__} (import package: elastic)\n"


def test_a_log_over_the_size_cap_is_refused_without_reading_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.eventlog import MAX_LOG_BYTES

    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(MAX_LOG_BYTES + 1)  # sparse: no disk used
    t0 = time.monotonic()
    code, out, err = _run(["report", str(big)], capsys)
    assert code == 2 and out == "" and "may have at most" in err, err
    assert time.monotonic() - t0 < 5


@pytest.mark.timeout(120)
def test_the_report_of_a_large_log_holds_only_running_totals(tmp_path: Path) -> None:
    """One pass, events not kept: memory does not grow with the log (a 190 MB log once
    took 1.6 GB)."""
    import tracemalloc

    from sim.eventlog import iter_event_log
    from sim.report import build_report

    log = tmp_path / "large.jsonl"
    line = (
        '{"fields":{"attempt":%d,"local_rank":0,"worker_pid":%d,"world_size":64},'
        '"kind":"torchelastic.worker.status.START","node":%d,"rank":0,"role":"default",'
        '"t":%d.5}\n'
    )
    with open(log, "w") as f:
        f.writelines(line % (i, 1000 + i, i % 512, i) for i in range(30_000))
    tracemalloc.start()
    report = build_report(iter_event_log(str(log)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert report["events"] == 30_000 and report["nodes"] == 512
    assert peak < 4 * 2**20, peak  # the log is ≈ 5 MB; its events would take ≈ 30 MB


def test_ctrl_c_while_the_plugin_loads_prints_the_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the simulator's import takes up to seconds on a busy machine: a Ctrl-C then is
    # the same one line and 130 as during the run
    import elastic.cli

    def loading() -> dict[str, object]:
        raise KeyboardInterrupt

    monkeypatch.setattr(elastic.cli, "_plugins", loading)
    assert elastic.cli.main(["sim", "scenario.yaml"]) == elastic.cli.INTERRUPTED
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == "elastic sim: interrupted"
