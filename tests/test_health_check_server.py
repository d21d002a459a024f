"""The health-check server: /health follows progress, /metrics, and bad requests."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from elastic.agent.server.health_check_server import (
    HealthCheckServer,
    create_healthcheck_server,
    render_metrics,
)

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.progress = 1000.0


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(clock: Clock) -> Iterator[HealthCheckServer]:
    srv = HealthCheckServer(
        lambda: clock.progress,
        port=0,
        timeout=60,
        status_callback=lambda: {"state": "HEALTHY", "restart_count": 2},
        metrics_callback=lambda: {"elastic_restarts_total": 2, "worker up": {'rank="0"': 1}},
        now=lambda: clock.now,
    )
    srv.start()
    yield srv
    srv.stop()


def request(srv: HealthCheckServer, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def raw(srv: HealthCheckServer, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def test_health_flips_to_503_when_progress_stalls_and_back_when_it_advances(
    server: HealthCheckServer, clock: Clock
) -> None:
    status, headers, body = request(server, "GET", "/health")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    doc: dict[str, Any] = json.loads(body)
    assert doc["status"] == "ok"
    assert doc["state"] == "HEALTHY" and doc["restart_count"] == 2
    assert doc["last_progress_time"] == 1000.0

    clock.now = 1060.0  # exactly at the timeout: still alive
    assert request(server, "GET", "/health")[0] == 200
    clock.now = 1060.5
    status, _, body = request(server, "GET", "/health")
    assert status == 503
    assert json.loads(body)["status"] == "stalled"

    clock.progress = 1060.0
    assert request(server, "GET", "/health")[0] == 200


def test_metrics_are_prometheus_text(server: HealthCheckServer, clock: Clock) -> None:
    status, headers, body = request(server, "GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    assert "# TYPE elastic_restarts_total gauge\nelastic_restarts_total 2\n" in text
    assert 'worker_up{rank="0"} 1\n' in text  # the space in the name is sanitised
    assert "elastic_health_up 1\n" in text
    assert "elastic_health_last_progress_time_seconds 1000\n" in text
    clock.now = 5000.0
    assert "elastic_health_up 0\n" in request(server, "GET", "/metrics")[2].decode()


def test_render_metrics_values() -> None:
    assert render_metrics({"a": 1.5, "b": True, "9x": float("inf")}) == (
        "# TYPE _9x gauge\n_9x +Inf\n# TYPE a gauge\na 1.5\n# TYPE b gauge\nb 1\n"
    )


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("GET", "/nope", 404),
        ("POST", "/health", 405),
        ("DELETE", "/metrics", 405),
        ("BREW", "/health", 405),
        ("HEAD", "/health", 200),
    ],
)
def test_bad_requests_get_4xx_and_the_server_keeps_serving(
    server: HealthCheckServer, method: str, path: str, code: int
) -> None:
    status, headers, body = request(server, method, path)
    assert status == code
    if code == 405:
        assert headers["Allow"] == "GET, HEAD"
    if method == "HEAD":
        assert body == b""
    assert request(server, "GET", "/health")[0] == 200


def test_malformed_request_gets_400_and_the_server_keeps_serving(
    server: HealthCheckServer,
) -> None:
    # (a request line without a parsable version gets an HTTP/0.9-style bare body)
    assert b"Error code: 400" in raw(server, b"GET /health HTTP/1.1 extra-words\r\n\r\n")
    assert b"Error code: 400" in raw(server, b"GET /health HTTP/x.y\r\n\r\n")
    assert raw(server, b"GET /" + b"a" * 70000 + b" HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 414")
    raw(server, b"")  # connect and hang up
    assert request(server, "GET", "/health")[0] == 200


def test_a_failing_callback_is_contained(clock: Clock) -> None:
    def boom() -> float:
        raise RuntimeError("agent state unavailable")

    srv = HealthCheckServer(boom, port=0, timeout=60, metrics_callback=lambda: {"x": "y"})  # type: ignore[dict-item]
    srv.start()
    try:
        status, _, body = request(srv, "GET", "/health")
        assert status == 503
        assert json.loads(body)["status"] == "unknown"
        assert request(srv, "GET", "/metrics")[0] == 500
        assert request(srv, "GET", "/health")[0] == 503  # still serving
    finally:
        srv.stop()


def test_binds_to_loopback_by_default_and_stop_frees_the_port() -> None:
    srv = create_healthcheck_server(lambda: 0, port=0, timeout=1)
    srv.start()
    port = srv.port
    assert srv._httpd is not None and srv._httpd.server_address[0] == "127.0.0.1"
    srv.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_torch_interface_is_kept() -> None:
    def cb() -> int:
        return 0

    srv = create_healthcheck_server(cb, port=0, timeout=60)
    assert srv.alive_callback is cb
    srv.stop()  # stopping a server that never started is fine


# -- issue 15, item 10: slow clients, floods ----------------------------------------------


def test_a_slow_client_is_closed_at_the_request_deadline_however_it_trickles() -> None:
    srv = HealthCheckServer(lambda: 0, port=0, timeout=60, request_timeout=0.5)
    srv.start()
    try:
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            closed_after = None
            for byte in b"GET /health HTTP/1.0\r\nX: " + b"a" * 100:
                try:
                    s.sendall(bytes([byte]))
                    s.settimeout(0.1)
                    if s.recv(4096) == b"":
                        closed_after = time.monotonic() - t0
                        break
                except TimeoutError:
                    continue
                except OSError:
                    closed_after = time.monotonic() - t0
                    break
        assert closed_after is not None, "a trickling client kept its connection"
        assert closed_after < 5.0
        assert request(srv, "GET", "/health")[0] == 503  # still serving
    finally:
        srv.stop()


def test_connections_beyond_the_cap_are_closed_and_served_ones_still_answer() -> None:
    srv = HealthCheckServer(lambda: 0, port=0, timeout=1e12, max_connections=4, request_timeout=3)
    srv.start()
    idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(4)]
    try:
        deadline = time.monotonic() + 10
        while srv._httpd is None or srv._httpd._active < 4:  # all four are being served
            assert time.monotonic() < deadline
            time.sleep(0.01)
        threads_before = threading.active_count()
        extra = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(20)]
        for s in extra:  # closed by the server without an answer
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(10) == b""
            s.close()
        assert threading.active_count() <= threads_before + 1
    finally:
        for s in idle:
            s.close()
    # the idle ones are gone: the server answers again
    deadline = time.monotonic() + 10
    while True:
        try:
            assert request(srv, "GET", "/health")[0] == 200
            break
        except (ConnectionError, http.client.HTTPException):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    srv.stop()


def test_fifty_simultaneous_clients_are_all_accepted() -> None:
    srv = HealthCheckServer(lambda: 0, port=0, timeout=1e12)
    srv.start()
    try:
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(50)]
        for s in socks:
            s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        answers = [s.recv(12) for s in socks]
        for s in socks:
            s.close()
        assert all(a.startswith(b"HTTP/1.0 200") for a in answers)
    finally:
        srv.stop()


@pytest.mark.parametrize("port", [-1, 65536, 99999, True])
def test_a_port_out_of_range_is_a_value_error_naming_it(port: Any) -> None:
    with pytest.raises(ValueError, match=r"expected 0\.\.65535"):
        HealthCheckServer(lambda: 0, port=port, timeout=1)
