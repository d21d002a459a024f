"""torch-compatible process contexts: signal handling, stopped peers in the failures,
filtered log copies, torch's constructors, return values as tagged data, and the names
torch's ``api`` module re-exports."""

from __future__ import annotations

import inspect
import io
import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from elastic.multiprocessing import (
    DefaultLogsSpecs,
    MultiprocessContext,
    PContext,
    SignalException,
    Std,
    SubprocessContext,
    start_processes,
)
from elastic.multiprocessing import api as mp_api
from elastic.multiprocessing import pcontext as pcontext_mod
from elastic.real import _fn_runner
from elastic.real import workers as real_workers
from elastic.workers import WorkerLaunch
from tests.leftovers import gone, no_leftover_processes

pytestmark = pytest.mark.timeout(60)

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@pytest.fixture(autouse=True)
def leaves_no_process() -> Iterator[None]:
    with no_leftover_processes():
        yield


@pytest.fixture(autouse=True)
def handlers_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts and ends with this process's own signal handlers."""
    monkeypatch.delenv("TORCHELASTIC_SIGNALS_TO_HANDLE", raising=False)
    sigs = (*HANDLED, signal.SIGUSR1)
    before = {s: signal.getsignal(s) for s in sigs}
    yield
    for s, h in before.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)
    handlers = getattr(pcontext_mod, "_Handlers", None)
    if handlers is not None:  # a failed test may leave its bookkeeping behind
        handlers.saved.clear()
        handlers.holders = 0


def envs(n: int) -> dict[int, dict[str, str]]:
    return {r: {"LOCAL_RANK": str(r), "TORCHELASTIC_RUN_ID": "compat"} for r in range(n)}


def sleepers(tmp_path: Path, n: int = 2) -> PContext:
    return start_processes(
        "sleep",
        "/bin/sleep",
        {r: ("60",) for r in range(n)},
        envs(n),
        DefaultLogsSpecs(str(tmp_path)),
    )


def all_gone(pids: dict[int, int]) -> bool:
    return all(gone(p) for p in pids.values())


# -- worker functions (spawn finds them by name) -----------------------------------------


def returns_object() -> object:
    return object()


def returns_too_much() -> str:
    return "x" * (_fn_runner.MAX_RESULT_BYTES + 10)


def returns_typed_data() -> dict[Any, Any]:
    return {0: (1, b"\x00\xff"), "loss": [1.5, math.inf], (2, "k"): None}


def echo_args_with_types(*args: Any) -> list[Any]:
    return [[type(a).__name__, a] for a in args]


def fail_or_sleep(rank: int) -> None:
    if rank == 0:
        raise RuntimeError("rank 0 gives up")
    time.sleep(60)


# -- 1. signal handlers ------------------------------------------------------------------


def test_start_installs_a_handler_raising_signal_exception_and_close_puts_back_the_old(
    tmp_path: Path,
) -> None:
    originals = {s: signal.getsignal(s) for s in HANDLED}
    pc = sleepers(tmp_path)
    pids = pc.pids()
    sigval = None
    try:
        for s in HANDLED:
            assert signal.getsignal(s) is mp_api._terminate_process_handler
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        with pytest.raises(SignalException) as e:
            pc.wait()
        sigval = e.value.sigval
        assert sigval == signal.SIGTERM
        assert f"Process {os.getpid()} got signal" in str(e.value)
    finally:
        pc.close(sigval, timeout=5)
    assert all_gone(pids)
    assert {s: signal.getsignal(s) for s in HANDLED} == originals


def test_signals_to_handle_come_from_the_environment_and_bad_names_are_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGUSR1, SIGNOPE,SIGKILL")
    term_before = signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.WARNING, logger="elastic.multiprocessing.pcontext"):
        pc = sleepers(tmp_path, 1)
    try:
        assert signal.getsignal(signal.SIGUSR1) is mp_api._terminate_process_handler
        assert signal.getsignal(signal.SIGTERM) is term_before
        assert "SIGNOPE" in caplog.text and "SIGKILL" in caplog.text
    finally:
        pc.close(timeout=5)


def test_start_from_another_thread_warns_and_installs_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = {s: signal.getsignal(s) for s in HANDLED}
    out: dict[str, Any] = {}

    def run() -> None:
        pc = start_processes(
            "t",
            "/bin/sh",
            {
                0: (
                    "-c",
                    "exit 0",
                )
            },
            envs(1),
            DefaultLogsSpecs(str(tmp_path)),
        )
        out["during"] = {s: signal.getsignal(s) for s in HANDLED}
        out["result"] = pc.wait()
        pc.close()

    with caplog.at_level(logging.WARNING, logger="elastic.multiprocessing.pcontext"):
        t = threading.Thread(target=run)
        t.start()
        t.join(30)
    assert out["during"] == before
    assert out["result"] is not None and not out["result"].is_failed()
    assert "child thread" in caplog.text


def test_a_signal_during_a_stop_is_held_until_the_stop_is_over() -> None:
    signal.signal(signal.SIGUSR1, mp_api._terminate_process_handler)
    reached_end_of_block = False
    with pytest.raises(SignalException) as e, mp_api._signals_held():
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)  # the handler has run by now (main thread, between bytecodes)
        reached_end_of_block = True
    assert reached_end_of_block and e.value.sigval == signal.SIGUSR1


AGENT_SCRIPT = """
import sys
from elastic.multiprocessing import DefaultLogsSpecs, SignalException, start_processes

pc = start_processes(
    "z", "/bin/sleep", {0: ("60",), 1: ("60",)}, {0: {}, 1: {}}, DefaultLogsSpecs(sys.argv[1])
)
try:
    print(*pc.pids().values(), flush=True)  # in the try: the test signals once it reads it
    pc.wait()
except SignalException as e:
    pc.close(e.sigval)
    print("closed", e.sigval.name, flush=True)
finally:
    print("finally ran", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_terminated_caller_closes_its_processes_and_runs_its_finally(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert f"closed {sig.name}" in out and "finally ran" in out
    assert proc.returncode == 0
    assert all(gone(p) for p in pids)


# -- 2. stopped peers in the failures ------------------------------------------------------


def test_a_binary_run_reports_the_peers_it_stopped_as_torch_does(tmp_path: Path) -> None:
    pc = start_processes(
        "fail",
        "/bin/sh",
        {0: ("-c", "exit 3"), 1: ("-c", "sleep 60"), 2: ("-c", "sleep 60")},
        envs(3),
        DefaultLogsSpecs(str(tmp_path)),
    )
    assert isinstance(pc, SubprocessContext)
    pids = pc.pids()
    result = pc.wait()
    assert result is not None and set(result.failures) == {0, 1, 2}
    assert result.failures[0].exitcode == 3
    for r in (1, 2):
        f = result.failures[r]
        assert (f.exitcode, f.pid, f.signal_name()) == (-15, pids[r], "SIGTERM")
        assert f.message == f"Signal 15 (SIGTERM) received by PID {pids[r]}"
    assert all_gone(pids)


def test_a_binary_that_succeeded_before_the_failure_is_not_a_failure(tmp_path: Path) -> None:
    pc = start_processes(
        "mixed",
        "/bin/sh",
        {0: ("-c", "exit 0"), 1: ("-c", "sleep 0.5; exit 2")},
        envs(2),
        DefaultLogsSpecs(str(tmp_path)),
    )
    result = pc.wait()
    assert result is not None and set(result.failures) == {1}


def test_a_peer_that_ends_on_its_own_before_the_next_look_is_not_stopped(
    tmp_path: Path,
) -> None:
    # rank 0 fails once the wait has begun (torch's first look, which would find a
    # failure at once; 1.5 s leave room for a slow start); rank 1 ends 1 s later, well
    # before torch's next look at period 6 s would find the failure: it is its own exit,
    # not a SIGTERM
    pc = start_processes(
        "race",
        "/bin/sh",
        {0: ("-c", "sleep 1.5; exit 3"), 1: ("-c", "sleep 2.5")},
        envs(2),
        DefaultLogsSpecs(str(tmp_path)),
    )
    t0 = time.monotonic()
    result = pc.wait(period=6)
    took = time.monotonic() - t0
    assert result is not None and set(result.failures) == {0}
    assert result.failures[0].exitcode == 3
    assert took < 5  # every process ended: nothing left to wait for, no look to wait for


def test_a_failure_is_acted_on_at_the_next_look_of_the_period(tmp_path: Path) -> None:
    pc = start_processes(
        "look",
        "/bin/sh",
        {0: ("-c", "sleep 1.5; exit 3"), 1: ("-c", "sleep 60")},
        envs(2),
        DefaultLogsSpecs(str(tmp_path)),
    )
    t0 = time.monotonic()
    result = pc.wait(period=4)
    took = time.monotonic() - t0
    assert result is not None and set(result.failures) == {0, 1}
    assert result.failures[1].exitcode == -15
    assert 3.9 <= took < 7  # the look at 4 s, not at the failure and not a later one


def test_a_timeout_before_the_next_look_gives_none_and_the_next_wait_acts(
    tmp_path: Path,
) -> None:
    pc = start_processes(
        "late",
        "/bin/sh",
        {0: ("-c", "sleep 1.5; exit 3"), 1: ("-c", "sleep 60")},
        envs(2),
        DefaultLogsSpecs(str(tmp_path)),
    )
    pids = pc.pids()
    assert pc.wait(timeout=3, period=30) is None  # torch's loop ends before its next look
    assert psutil.pid_exists(pids[1]) and psutil.Process(pids[1]).status() != "zombie"
    t0 = time.monotonic()
    result = pc.wait(timeout=0)  # the failure seen earlier: acted on at this first look
    assert time.monotonic() - t0 < 5
    assert result is not None and set(result.failures) == {0, 1}
    assert all_gone(pids)


def test_a_run_that_succeeds_returns_when_the_last_process_ends(tmp_path: Path) -> None:
    pc = start_processes(
        "ok",
        "/bin/sh",
        {r: ("-c", "sleep 0.2") for r in range(2)},
        envs(2),
        DefaultLogsSpecs(str(tmp_path)),
    )
    t0 = time.monotonic()
    result = pc.wait(period=30)
    assert result is not None and not result.is_failed()
    assert time.monotonic() - t0 < 5


def test_a_function_run_reports_the_failure_it_saw_as_torch_does(tmp_path: Path) -> None:
    pc = start_processes(
        "fn", fail_or_sleep, {0: (0,), 1: (1,)}, envs(2), DefaultLogsSpecs(str(tmp_path))
    )
    assert isinstance(pc, MultiprocessContext)
    pids = pc.pids()
    result = pc.wait()
    assert result is not None and set(result.failures) == {0}
    assert "rank 0 gives up" in str(result.failures[0].message)
    assert all_gone(pids)


# -- 3. filtered copies of the tee'd streams ---------------------------------------------------

LINES = (
    "echo helloA out $LOCAL_RANK; echo helloB out $LOCAL_RANK; "
    "echo worldA err $LOCAL_RANK >&2; echo worldB err $LOCAL_RANK >&2; echo plain >&2"
)


def test_lines_matching_a_filter_are_copied_with_their_prefix(tmp_path: Path) -> None:
    pc = start_processes(
        "trainer",
        "/bin/sh",
        {r: ("-c", LINES) for r in range(3)},
        envs(3),
        DefaultLogsSpecs(str(tmp_path), tee={0: Std.OUT, 1: Std.ERR}),  # rank 2: no tee
        log_line_prefixes={0: "[r0]:", 1: "[r1]:"},
        duplicate_stdout_filters=["helloA"],
        duplicate_stderr_filters=["worldA", "B"],
    )
    out, err = pc.filtered_stdout, pc.filtered_stderr
    assert isinstance(out, io.TextIOBase) and isinstance(err, io.TextIOBase)
    result = pc.wait()
    assert result is not None and not result.is_failed()
    assert out.closed and err.closed  # wait() closed the context
    assert Path(out.name).name == "filtered_stdout.log"
    assert Path(out.name).read_text().splitlines() == ["[r0]:helloA out 0"]
    assert sorted(Path(err.name).read_text().splitlines()) == [
        "[r1]:worldA err 1",
        "[r1]:worldB err 1",
    ]


def test_without_filters_there_are_no_filtered_files(tmp_path: Path) -> None:
    pc = start_processes(
        "t", "/bin/true", {0: ()}, envs(1), DefaultLogsSpecs(str(tmp_path), tee=Std.ALL)
    )
    assert pc.filtered_stdout is None and pc.filtered_stderr is None
    pc.wait()


def test_filters_with_no_log_directory_write_nowhere(tmp_path: Path) -> None:
    pc = start_processes(
        "t",
        "/bin/sh",
        {0: ("-c", "echo keep")},
        envs(1),
        DefaultLogsSpecs(os.devnull, tee=Std.ALL),
        duplicate_stdout_filters=["keep"],
    )
    assert pc.filtered_stdout is not None and pc.filtered_stdout.name == os.devnull
    result = pc.wait()
    assert result is not None and not result.is_failed()


# -- 4. torch's constructors -----------------------------------------------------------------


def _params(cls: type) -> list[str]:
    return list(inspect.signature(cls.__init__).parameters)[1:]


def test_constructors_take_torchs_parameters_in_torchs_order() -> None:
    assert _params(MultiprocessContext) == [
        "name",
        "entrypoint",
        "args",
        "envs",
        "start_method",
        "logs_specs",
        "log_line_prefixes",
        "numa_options",
        "duplicate_stdout_filters",
        "duplicate_stderr_filters",
    ]
    assert _params(SubprocessContext) == [
        "name",
        "entrypoint",
        "args",
        "envs",
        "logs_specs",
        "log_line_prefixes",
        "numa_options",
        "duplicate_stdout_filters",
        "duplicate_stderr_filters",
    ]
    assert _params(PContext)[:8] == [
        "name",
        "entrypoint",
        "args",
        "envs",
        "logs_specs",
        "log_line_prefixes",
        "duplicate_stdout_filters",
        "duplicate_stderr_filters",
    ]


def test_a_multiprocess_context_built_positionally_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pc = MultiprocessContext(
        "pos", echo_args_with_types, {0: (1,)}, envs(1), "spawn", DefaultLogsSpecs(str(tmp_path))
    )
    pc.start()
    result = pc.wait()
    assert result is not None and result.return_values == {0: [["int", 1]]}
    assert pc.start_method == "spawn"


def test_numa_options_are_accepted_and_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic.multiprocessing.pcontext"):
        pc = start_processes(
            "numa", "/bin/true", {0: ()}, envs(1), DefaultLogsSpecs(str(tmp_path)), numa_options={}
        )
    result = pc.wait()
    assert result is not None and not result.is_failed()
    assert "numa_options" in caplog.text and "ignored" in caplog.text


def test_no_warning_when_numa_options_is_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic.multiprocessing.pcontext"):
        pc = start_processes("numa", "/bin/true", {0: ()}, envs(1), DefaultLogsSpecs(str(tmp_path)))
    pc.wait()
    assert "numa_options" not in caplog.text


# -- 5. return values and arguments as tagged data ---------------------------------------------


def test_a_return_value_that_is_not_data_fails_its_rank_with_the_reason(tmp_path: Path) -> None:
    pc = start_processes("obj", returns_object, {0: ()}, envs(1), DefaultLogsSpecs(str(tmp_path)))
    result = pc.wait()
    assert result is not None and set(result.failures) == {0}
    failure = result.failures[0]
    assert failure.exitcode == 1
    message = json.dumps(failure.message)
    assert "ReturnValueError" in message and "returns_object()" in message
    assert "is a object, which is not data" in message


def test_a_return_value_over_the_limit_fails_its_rank(tmp_path: Path) -> None:
    pc = start_processes("big", returns_too_much, {0: ()}, envs(1), DefaultLogsSpecs(str(tmp_path)))
    result = pc.wait()
    assert result is not None and set(result.failures) == {0}
    assert "byte limit" in json.dumps(result.failures[0].message)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_int_keys_tuples_bytes_and_non_finite_floats_come_back_as_sent(
    tmp_path: Path, start_method: str
) -> None:
    pc = start_processes(
        "typed",
        returns_typed_data,
        {0: ()},
        envs(1),
        DefaultLogsSpecs(str(tmp_path)),
        start_method=start_method,
    )
    result = pc.wait()
    assert result is not None and result.return_values == {0: returns_typed_data()}


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_arguments_keep_their_types(tmp_path: Path, start_method: str) -> None:
    args = ((1, "a"), {3: "x"}, b"raw", [1, 2])
    pc = start_processes(
        "args",
        echo_args_with_types,
        {0: args},
        envs(1),
        DefaultLogsSpecs(str(tmp_path)),
        start_method=start_method,
    )
    result = pc.wait()
    assert result is not None
    assert result.return_values[0] == [
        ["tuple", (1, "a")],
        ["dict", {3: "x"}],
        ["bytes", b"raw"],
        ["list", [1, 2]],
    ]


@pytest.mark.parametrize(
    "value",
    [
        {"__elastic_tuple__": [1, 2]},  # a user's dict that looks like a tag stays a dict
        {"__elastic_tensor__": "not a tensor"},
        (),
        {(): {b"": ((),)}},
        [math.nan],
        {True: 1, None: 2, 1.5: 3},
    ],
)
def test_the_encoding_round_trips_awkward_values(value: Any) -> None:
    text = json.dumps(_fn_runner.to_data(value), allow_nan=False)
    back = json.loads(text, object_hook=_fn_runner.decode)
    if value == [math.nan]:
        assert math.isnan(back[0])
    else:
        assert back == value and type(back) is type(value)


@pytest.mark.parametrize(
    "text",
    [
        '{"__elastic_tuple__": 5}',
        '{"__elastic_bytes__": "not base64!"}',
        '{"__elastic_dict__": [[1, 2, 3]]}',
        '{"__elastic_dict__": [[[1], 2]]}',  # a list cannot be a key
        '{"__elastic_float__": "1e5"}',
    ],
)
def test_malformed_tags_are_refused_with_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="malformed"):
        json.loads(text, object_hook=_fn_runner.decode)


def test_a_cycle_is_refused_not_recursed_forever() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="levels deep"):
        _fn_runner.to_data(loop)


def test_a_result_the_agent_cannot_read_fails_the_worker_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    monkeypatch.setattr(real_workers, "_read_result", lambda path: (None, "garbled result"))

    async def main() -> Any:
        pw = real_workers.ProcessWorkers(
            DefaultLogsSpecs(str(tmp_path)), subreaper=False, reaper=False
        )
        async with pw:
            group = await pw.start(
                [WorkerLaunch(0, 0, {"TORCHELASTIC_RUN_ID": "r"}, echo_args_with_types, ())]
            )
            ex = await asyncio.wait_for(group.next_exit(), 20)
            await group.stop(1.0)
            return ex

    ex = asyncio.run(main())
    assert ex.failed and ex.exit_code == 1
    assert ex.extra["return_value_error"] == "garbled result"
    assert ex.error_file is not None
    assert "ReturnValueError: garbled result" in Path(ex.error_file).read_text()


# -- 6. the names torch's api module re-exports ------------------------------------------------


def test_api_re_exports_torchs_names() -> None:
    from elastic.multiprocessing import errors, redirects, subprocess_handler, tail_log
    from elastic.multiprocessing.api import (
        ProcessFailure,
        SubprocessHandler,
        TailLog,
        get_std_cm,
        get_subprocess_handler,
        record,
        redirect_stderr,
        redirect_stdout,
    )

    assert ProcessFailure is errors.ProcessFailure and record is errors.record
    assert TailLog is tail_log.TailLog
    assert SubprocessHandler is subprocess_handler.SubprocessHandler
    assert get_subprocess_handler is subprocess_handler.get_subprocess_handler
    assert redirect_stdout is redirects.redirect_stdout
    assert redirect_stderr is redirects.redirect_stderr
    with get_std_cm("", redirect_stdout):
        pass


def test_api_imports_alone_and_stays_light() -> None:
    code = textwrap.dedent(
        """
        import sys
        import elastic.multiprocessing.api as api
        heavy = [m for m in ("elastic.multiprocessing.pcontext", "elastic.real.workers")
                 if m in sys.modules]
        assert not heavy, heavy
        from elastic.multiprocessing.api import TailLog, ProcessFailure, SubprocessHandler
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


# -- wait() closes, as torch's -----------------------------------------------------------------


def test_wait_with_a_result_closes_the_context(tmp_path: Path) -> None:
    before = {s: signal.getsignal(s) for s in HANDLED}
    pc = start_processes("t", "/bin/true", {0: ()}, envs(1), DefaultLogsSpecs(str(tmp_path)))
    assert signal.getsignal(signal.SIGTERM) is mp_api._terminate_process_handler
    result = pc.wait()
    assert result is not None and not result.is_failed()
    assert {s: signal.getsignal(s) for s in HANDLED} == before
    assert pc.wait() is result
    pc.close()  # a no-op now
    assert all(not psutil.pid_exists(p) or gone(p) for p in pc.pids().values())


# -- 7. torch's start sequence and helpers, read through the api module ------------------------


class _RecordingSignals:
    """A stand-in for the ``signal`` module as ``PContext.start`` reads it from
    ``elastic.multiprocessing.api``: records what would be installed, refuses some."""

    SIGTERM, SIGHUP, SIGUSR1 = signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1

    def __init__(self, refuse: tuple[signal.Signals, ...] = ()) -> None:
        self.installed: list[tuple[Any, Any]] = []
        self.refuse = refuse

    def getsignal(self, sig: Any) -> Any:
        return signal.SIG_DFL

    def signal(self, sig: Any, handler: Any) -> None:
        if sig in self.refuse:
            raise RuntimeError("not supported here")
        self.installed.append((sig, handler))


def _start_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``PContext.start`` of a context that starts no process, its log at INFO kept."""

    class Probe(SubprocessContext):
        def _start(self) -> None:
            pass

    with caplog.at_level(logging.INFO, logger="elastic.multiprocessing.api"):
        pc = Probe("p", "/bin/true", {0: ()}, envs(1), DefaultLogsSpecs(str(tmp_path)))
        pc.start()
    pc.close()


def test_start_installs_the_handlers_then_starts_then_starts_the_tailers(tmp_path: Path) -> None:
    calls: list[object] = []

    class Tail:
        def start(self) -> None:
            calls.append("tail")

    class Probe(SubprocessContext):
        def _start(self) -> None:
            handled = signal.getsignal(signal.SIGTERM) is mp_api._terminate_process_handler
            calls.append(("_start", handled))

    pc = Probe("p", "/bin/true", {0: ()}, envs(1), DefaultLogsSpecs(str(tmp_path)))
    pc._tail_logs = [Tail()]  # type: ignore[list-item]
    pc.start()
    try:
        assert calls == [("_start", True), "tail"]
    finally:
        pc.close()
    assert signal.getsignal(signal.SIGTERM) is not mp_api._terminate_process_handler


def test_start_reads_signal_and_the_platform_through_the_api_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = _RecordingSignals(refuse=(signal.SIGHUP,))
    monkeypatch.setattr(mp_api, "signal", fake)
    monkeypatch.setattr(mp_api, "IS_WINDOWS", True)
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGHUP,SIG_IGN,Signals,SIGUSR1")
    _start_nothing(tmp_path, caplog)
    assert fake.installed == [
        (signal.SIGTERM, mp_api._terminate_process_handler),
        (signal.SIGUSR1, mp_api._terminate_process_handler),
    ]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "Signal SIGHUP is not supported on Windows, skipping" in infos
    assert "Registered signal handler for SIGUSR1" in infos
    assert any("SIG_IGN" in w for w in warnings) and any("Signals" in w for w in warnings)
    # the process's own handlers were not touched, and nothing is left to put back
    assert pcontext_mod._Handlers.holders == 0 and not pcontext_mod._Handlers.saved


def test_a_refused_signal_off_windows_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(mp_api, "signal", _RecordingSignals(refuse=(signal.SIGHUP,)))
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGHUP")
    _start_nothing(tmp_path, caplog)
    assert [r.levelno for r in caplog.records if "SIGHUP" in r.getMessage()] == [logging.WARNING]


def test_start_may_be_called_once(tmp_path: Path) -> None:
    pc = start_processes("t", "/bin/true", {0: ()}, envs(1), DefaultLogsSpecs(str(tmp_path)))
    try:
        with pytest.raises(RuntimeError, match="called once"):
            pc.start()
    finally:
        pc.close()
    assert signal.getsignal(signal.SIGTERM) is not mp_api._terminate_process_handler


def _wrapped_echo(msg: str) -> str:
    # to the file descriptors (what the redirection moves; pytest replaces sys.stdout)
    os.write(1, f"{msg} stdout from {os.environ['RANK']}\n".encode())
    os.write(2, f"{msg} stderr from {os.environ['RANK']}\n".encode())
    return f"{msg}_{os.environ['RANK']}"


class _Queue:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def put(self, obj: Any, /) -> None:
        self.items.append(obj)


def test_wrap_runs_one_rank_in_this_process_as_torch_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "before")  # (restored after the test)
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    queue, done = _Queue(), threading.Event()
    done.set()
    mp_api._wrap(
        local_rank=1,
        fn=_wrapped_echo,
        args={1: ("hello",)},
        envs={1: {"RANK": "1"}},
        stdout_redirects={1: str(out)},
        stderr_redirects={1: str(err)},
        ret_vals={1: queue},
        queue_finished_reading_event=done,
        numa_options=None,
    )
    assert queue.items == ["hello_1"]
    assert "hello stdout from 1" in out.read_text()
    assert "hello stderr from 1" in err.read_text()
    assert os.environ["RANK"] == "1"


def test_wrap_looks_up_the_rank_before_it_changes_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "before")
    with pytest.raises(KeyError):
        mp_api._wrap(0, _wrapped_echo, {0: ("x",)}, {0: {"RANK": "0"}}, {0: ""}, {0: ""},
                     {}, threading.Event())  # fmt: skip
    assert os.environ["RANK"] == "before"
