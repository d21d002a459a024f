"""Issue 15, "bounded work for every input": each parser this change owns, fuzzed.

For every parser — error files, the timer pipe, health requests, the agent's
environment (health port, signals to handle) and scenario text — hypothesis feeds
arbitrary and near-valid input and each example must: raise nothing but the parser's
own one-line refusal, finish within ``TIME_BOUND`` seconds (generous: a loaded 2-core
machine), and allocate at most ``MEMORY_BOUND`` bytes at its peak (tracemalloc).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic.agent.server.health_check_server import HealthCheckServer
from elastic.agent.server.local_elastic_agent import health_port, parse_signals
from elastic.errors import ConfigError
from elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from elastic.timer import file_based_local_timer as fbt
from sim.scenario import load_scenario_text

TIME_BOUND = 5.0
MEMORY_BOUND = 64 << 20

T = TypeVar("T")

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def bounded(fn: Callable[[], T]) -> T:
    """Run ``fn`` and check its time and peak memory; return its result."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        result = fn()
    finally:
        took = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert took < TIME_BOUND, f"took {took:.2f} s"
    assert peak < MEMORY_BOUND, f"peak {peak >> 20} MiB"
    return result


JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
JSON = st.recursive(
    JSON_LEAF,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)
KEYS = ["message", "timestamp", "extraInfo", "py_callstack", "errorTraits", "x"]
NEAR_ERROR_FILE = st.recursive(
    st.dictionaries(st.sampled_from(KEYS), JSON_LEAF, max_size=4),
    lambda c: st.dictionaries(st.sampled_from(KEYS), c | JSON_LEAF, max_size=4),
    max_leaves=12,
)


# -- error.json ---------------------------------------------------------------------------


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=300),
        JSON.map(lambda j: json.dumps(j).encode()),
        NEAR_ERROR_FILE.map(lambda j: json.dumps(j).encode()),
        st.integers(1, 200_000).map(lambda n: b"[" * n),
    )
)
def test_error_files_never_raise_and_stay_bounded(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "error.json"
    path.write_bytes(data)

    def report() -> str:
        failure = ProcessFailure(0, 7, 1, str(path), fallback_timestamp=1_700_000_000)
        return str(ChildFailedError("train.py", {3: failure}, hostname="h"))

    text = bounded(report)
    assert "Root Cause" in text
    assert "\x1b" not in text


# -- the timer pipe ------------------------------------------------------------------------

REQUEST_KEYS = ["version", "pid", "scope_id", "expiration_time", "signal"]
NEAR_REQUEST = st.fixed_dictionaries(
    {},
    optional={k: JSON_LEAF | st.just(1) | st.just(os.getpid()) for k in REQUEST_KEYS},
)


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=200),
            NEAR_REQUEST.map(lambda j: json.dumps(j).encode() + b"\n"),
            st.integers(1, 5000).map(lambda n: b"{" * n + b"\n"),
            st.integers(1, 3).map(lambda n: b"x" * (fbt.MAX_LINE_BYTES * n) + b"\n"),
        ),
        max_size=20,
    )
)
def test_the_timer_pipe_never_raises_and_stays_bounded(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes]
) -> None:
    server = fbt.FileTimerServer(str(tmp_path_factory.mktemp("t") / "pipe"), "run")
    got: list[fbt.FileTimerRequest] = []
    server.register_timers = got.extend  # type: ignore[method-assign]
    r, w = os.pipe()
    os.set_blocking(r, False)
    server._rfd = r
    logging.getLogger(fbt.__name__).disabled = True
    try:
        for chunk in chunks:
            if chunk:
                with contextlib.suppress(BlockingIOError):
                    os.write(w, chunk[:60000])
            bounded(server._drain)
        # every timer that parses is accepted (torch's); the guard acts at the reap
        assert all(
            isinstance(req, fbt.FileTimerRequest) and isinstance(req.worker_pid, int) for req in got
        )
        assert len(server._buf) <= fbt.MAX_LINE_BYTES
    finally:
        logging.getLogger(fbt.__name__).disabled = False
        os.close(r)
        os.close(w)
        server._rfd = None
        server.stop()


# -- health requests -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def health() -> Iterator[HealthCheckServer]:
    srv = HealthCheckServer(lambda: time.time(), port=0, timeout=60, request_timeout=0.5)
    srv.start()
    yield srv
    srv.stop()


REQUEST_LINES = st.sampled_from(
    [b"GET /health HTTP/1.0", b"HEAD /metrics HTTP/1.1", b"POST / HTTP/1.0", b"GET", b""]
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        st.binary(max_size=400),
        st.tuples(REQUEST_LINES, st.lists(st.binary(max_size=40), max_size=5)).map(
            lambda t: t[0] + b"\r\n" + b"\r\n".join(t[1]) + b"\r\n\r\n"
        ),
    )
)
def test_health_requests_are_answered_or_closed_in_bounded_time(
    health: HealthCheckServer, data: bytes
) -> None:
    def exchange() -> bytes:
        with socket.create_connection(("127.0.0.1", health.port), timeout=4) as s:
            with contextlib.suppress(OSError):
                s.sendall(data)
            chunks = []
            with contextlib.suppress(OSError):
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            return b"".join(chunks)

    bounded(exchange)  # the server closes every connection within its request timeout
    with socket.create_connection(("127.0.0.1", health.port), timeout=4) as s:
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        assert s.recv(12).startswith(b"HTTP/1.0 200")


# -- the agent's environment ---------------------------------------------------------------


@FUZZ
@given(st.text(max_size=300) | st.integers(-(10**40), 10**40).map(str))
def test_health_port_values_give_a_port_or_one_logged_line(raw: str) -> None:
    port = bounded(lambda: health_port(raw))
    assert port is None or 0 <= port <= 65535


SIGNAL_NAMES = st.sampled_from(["SIGTERM", "SIGINT", "SIGCHLD", "SIGKILL", "SIGFOO", " ", ""])


@FUZZ
@given(st.lists(SIGNAL_NAMES | st.text(max_size=12), max_size=30).map(",".join))
def test_signals_to_handle_give_signals_or_one_config_error(raw: str) -> None:
    logging.getLogger("elastic").disabled = True
    try:
        signals = bounded(lambda: _signals_or_error(raw))
    finally:
        logging.getLogger("elastic").disabled = False
    if isinstance(signals, ConfigError):
        assert "\n" not in str(signals) and "SIGCHLD" in str(signals)
    else:
        assert all(int(s) > 0 for s in signals)


def _signals_or_error(raw: str) -> Any:
    try:
        return parse_signals(raw)
    except ConfigError as e:
        return e


# -- scenario text -------------------------------------------------------------------------

SCENARIO = """\
name: fuzz
cluster: {nodes: NODES, nproc_per_node: 2}
job: {steps: STEPS, step_time: STEP}
rendezvous: {min_nodes: 1, max_nodes: NODES, heartbeat_timeout: HB}
faults:
  - {at: AT, kind: worker_crash, node: 0, local_rank: 0, exit_code: CODE}
"""
NUMBERISH = st.one_of(
    st.integers(-(10**50), 10**50).map(str),
    st.sampled_from(["1e400", "1.0e+300", "-1", "0", "1ms", ".inf", "9" * 5000, "1h30m", "~"]),
    st.floats(allow_nan=True).map(str),
)


@FUZZ
@given(st.tuples(*[NUMBERISH] * 6))
def test_scenarios_with_extreme_numbers_load_or_refuse_in_one_line(values: tuple[str, ...]) -> None:
    text = SCENARIO
    for key, value in zip(("NODES", "STEPS", "STEP", "HB", "AT", "CODE"), values, strict=True):
        text = text.replace(key, value)

    def load() -> str:
        try:
            load_scenario_text(text, "fuzz.yaml")
        except ConfigError as e:
            return str(e)
        return ""

    message = bounded(load)
    assert "\n" not in message and len(message) < 1000
