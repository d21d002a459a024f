"""The agent's health-check server: HTTP ``/health`` and ``/metrics`` on a port.

torch's path and names (``HealthCheckServer(alive_callback, port, timeout)``,
``create_healthcheck_server``, ``start``/``stop``, ``alive_callback``); torch's OSS
version is a stub that serves nothing — this one serves (a real adapter: stdlib
``http.server`` in a daemon thread).

Endpoints:

* ``GET /health`` — 200 while ``now - alive_callback() <= timeout``, else 503 (also
  503 if ``alive_callback`` raises: liveness cannot be shown).  The body is JSON:
  ``{"status": "ok"|"stalled", "last_progress_time": t, "age_seconds": a,
  "timeout_seconds": timeout, ...status_callback()}`` — the agent's callback adds
  agent state, restart count, worker-group state and so on.
* ``GET /metrics`` — Prometheus text format (version 0.0.4) of
  ``metrics_callback()``: ``{name: number}`` or ``{name: {labels_str: number}}``
  where ``labels_str`` is ``'role="trainer",rank="0"'``; plus
  ``elastic_health_up`` and ``elastic_health_last_progress_time_seconds``.
  Names are sanitised to Prometheus' alphabet.
* ``HEAD`` of those paths: the same status, no body.  Anything else: unknown path
  404, other methods 405 (with ``Allow``), a malformed request 400 (http.server's
  parser).  An exception in a callback gives 500 for that request only; the server
  goes on serving and the agent never sees it.

Limits (a health port is reachable by anything on the host): a port in
``[0, 65535]`` (else ``ValueError`` at construction); at most ``max_connections``
(64) connections served at once — more are closed at once, unanswered — and a listen
backlog of 128; each connection must deliver its whole request (request line and
headers, at most 64 KiB and 100 headers: ``http.server``'s limits) within
``request_timeout`` seconds (5) in total, however slowly it trickles, else it is
closed; responses are written with the same timeout per write.

It binds to 127.0.0.1 unless given ``host``; ``port=0`` picks a free port (read
:attr:`HealthCheckServer.port` after ``start()``).  ``alive_callback`` returns
seconds on the same time base as ``now`` (default wall-clock ``time.time``, torch's
convention: ``int(time.time())``).

Agent use (``TORCHELASTIC_HEALTH_CHECK_PORT``)::

    server = create_healthcheck_server(alive_callback, port=int(port), timeout=60)
    server.status_callback = lambda: {"state": ..., "restart_count": ...}
    server.metrics_callback = lambda: {"elastic_restarts_total": ...}
    server.start()
    ...
    server.stop()
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elastic.utils.gpu_health_check import GPUHealthCheck

__all__ = [
    "GPUHealthCheckServer",
    "HealthCheckServer",
    "create_gpu_healthcheck_server",
    "create_healthcheck_server",
]

log = logging.getLogger(__name__)

Metrics = Mapping[str, float | int | bool | Mapping[str, float | int | bool]]

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")
MAX_CONNECTIONS = 64
REQUEST_TIMEOUT = 5.0  # seconds for a client to send its whole request
LISTEN_BACKLOG = 128
_PATHS = ("/health", "/metrics")


def _metric_name(name: str) -> str:
    clean = _NAME_BAD.sub("_", name)
    return clean if clean and not clean[0].isdigit() else f"_{clean}"


def _metric_value(v: float | int | bool) -> str:
    f = float(v)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    return repr(int(f)) if f.is_integer() and abs(f) < 2**53 else repr(f)


def render_metrics(metrics: Metrics) -> str:
    """Prometheus text exposition (gauges), names sorted for stable output."""
    lines: list[str] = []
    for raw in sorted(metrics):
        name = _metric_name(raw)
        value = metrics[raw]
        lines.append(f"# TYPE {name} gauge")
        if isinstance(value, Mapping):
            for labels in sorted(value):
                lines.append(f"{name}{{{labels}}} {_metric_value(value[labels])}")
        else:
            lines.append(f"{name} {_metric_value(value)}")
    return "\n".join(lines) + "\n"


class HealthCheckServer:
    """Serves ``/health`` and ``/metrics``; see the module docstring."""

    def __init__(
        self,
        alive_callback: Callable[[], float],
        port: int,
        timeout: float,
        *,
        host: str = "127.0.0.1",
        status_callback: Callable[[], Mapping[str, Any]] | None = None,
        metrics_callback: Callable[[], Metrics] | None = None,
        now: Callable[[], float] = time.time,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"health check port: got {port!r}; expected 0..65535")
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self._alive_callback = alive_callback
        self._port = port
        self._timeout = timeout
        self._host = host
        self.status_callback = status_callback
        self.metrics_callback = metrics_callback
        self._now = now
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def alive_callback(self) -> Callable[[], float]:
        return self._alive_callback

    @property
    def port(self) -> int:
        """The bound port (the chosen one when constructed with 0) once started."""
        return self._httpd.server_address[1] if self._httpd is not None else self._port

    def start(self) -> None:
        """Bind and serve in a daemon thread (returns once listening)."""
        if self._httpd is not None:
            return
        self._httpd = _Server((self._host, self._port), _Handler, self)
        self._thread = threading.Thread(
            target=self._serve, args=(self._httpd,), daemon=True, name="health-check-server"
        )
        self._thread.start()
        log.info("health check server listening on %s:%s", self._host, self.port)

    @staticmethod
    def _serve(httpd: _Server) -> None:
        # serve_forever wakes every poll_interval to look for shutdown; instead block
        # in accept until a request comes, and let stop() wake us with a connection
        while not httpd.stopping:
            httpd.handle_request()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.stopping = True
            host, port = httpd.server_address[:2]
            with contextlib.suppress(OSError):
                socket.create_connection((str(host), int(port)), timeout=1).close()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        if httpd is not None:
            httpd.server_close()
        log.info("Stopping health check server.")

    # request logic (called from handler threads)

    def health(self) -> tuple[int, dict[str, Any]]:
        body: dict[str, Any] = {"timeout_seconds": self._timeout}
        try:
            last = float(self._alive_callback())
        except Exception as e:
            log.exception("health check: alive_callback failed")
            body.update(status="unknown", error=f"alive_callback failed: {type(e).__name__}")
            return HTTPStatus.SERVICE_UNAVAILABLE, body
        age = self._now() - last
        ok = age <= self._timeout
        body.update(
            status="ok" if ok else "stalled", last_progress_time=last, age_seconds=round(age, 3)
        )
        if self.status_callback is not None:
            try:
                extra = dict(self.status_callback())
            except Exception as e:
                log.exception("health check: status_callback failed")
                extra = {"status_error": type(e).__name__}
            body.update({k: v for k, v in extra.items() if k not in body})
        return (HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE), body

    def metrics(self) -> str:
        extra: dict[str, Any] = {}
        try:
            last = float(self._alive_callback())
            extra["elastic_health_last_progress_time_seconds"] = last
            extra["elastic_health_up"] = int(self._now() - last <= self._timeout)
        except Exception:
            extra["elastic_health_up"] = 0
        user = dict(self.metrics_callback()) if self.metrics_callback is not None else {}
        return render_metrics({**user, **extra})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], owner: HealthCheckServer
    ) -> None:
        self.owner = owner
        self.stopping = False
        self._active = 0
        self._lock = threading.Lock()
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # the cap: one thread per connection, so connections beyond it are closed at
        # once rather than queued (a flood cannot grow the agent's threads)
        with self._lock:
            full = self._active >= self.owner.max_connections
            if not full:
                self._active += 1
        if full:
            log.debug("health check: %s connections open; closing %s", self._active, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._lock:
            self._active -= 1


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, each with what remains of one deadline as its timeout:
    a client trickling a byte at a time cannot keep its connection past the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("health check: the request took too long to arrive")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a broken client connection must not print tracebacks to the agent's stderr
        log.debug("health check: error serving %s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 5  # a slow or silent client cannot hold a thread for long
    protocol_version = "HTTP/1.0"
    server_version = "elastic-health"

    def setup(self) -> None:
        super().setup()
        deadline = time.monotonic() + self.server.owner.request_timeout
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("health check: " + format, *args)

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _not_allowed(self) -> None:
        self._reply(
            HTTPStatus.METHOD_NOT_ALLOWED,
            b"method not allowed: use GET\n",
            "text/plain",
            True,
            extra={"Allow": "GET, HEAD"},
        )

    def __getattr__(self, name: str) -> Any:
        # http.server answers 501 to a method it has no do_X for; any method other
        # than GET/HEAD is "not allowed" here, whatever its name
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _serve(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        owner = self.server.owner
        try:
            if path == "/health":
                code, obj = owner.health()
                data = (json.dumps(obj, sort_keys=True, default=str) + "\n").encode()
                self._reply(code, data, "application/json", body)
            elif path == "/metrics":
                text = owner.metrics()
                self._reply(
                    HTTPStatus.OK, text.encode(), "text/plain; version=0.0.4; charset=utf-8", body
                )
            else:
                self._reply(
                    HTTPStatus.NOT_FOUND,
                    b"not found: try /health or /metrics\n",
                    "text/plain",
                    body,
                )
        except OSError as e:  # the client went away (or is too slow): nothing to answer
            log.debug("health check: connection lost serving %s: %s", path, e)
        except Exception:
            log.exception("health check: handler failed for %s", path)
            with contextlib.suppress(OSError):
                self._reply(
                    HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", "text/plain", body
                )

    def _reply(
        self,
        code: int,
        data: bytes,
        ctype: str,
        body: bool,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        self.connection.settimeout(self.timeout)  # the reads' deadline is over
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if body:
            self.wfile.write(data)


def create_healthcheck_server(
    alive_callback: Callable[[], float],
    port: int,
    timeout: float,
) -> HealthCheckServer:
    """torch's factory: a :class:`HealthCheckServer` on 127.0.0.1:``port``."""
    return HealthCheckServer(alive_callback, port, timeout)


class GPUHealthCheckServer(HealthCheckServer):
    """A :class:`HealthCheckServer` that also watches this host's GPUs (newer torch's
    name, after NVIDIA's resiliency extension).

    A thread checks the GPUs (``gpu_device_index``: one, or None for all) at
    :meth:`start` and then every ``gpu_check_interval`` seconds, with
    :class:`~elastic.utils.gpu_health_check.GPUHealthCheck` (NVML: lost GPUs, pending
    retired pages or row remaps, uncorrectable ECC errors, recovery actions).  ``/health``
    carries the last verdict as ``gpu_health`` and answers 503 (``"status":
    "gpu_unhealthy"``) while it is unhealthy; :meth:`get_gpu_health_status` and
    :meth:`get_health_summary` give the same as dictionaries.  Where the check is
    disabled (no NVML, a driver older than r570) the GPUs count as healthy and the
    status says ``"enabled": false``.  :meth:`stop` ends the thread at once (it waits
    on an event between checks, never sleeps).
    """

    def __init__(
        self,
        alive_callback: Callable[[], float],
        port: int,
        timeout: float,
        gpu_device_index: int | None = None,
        gpu_check_interval: float = 60,
        enable_gpu_monitoring: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(alive_callback, port, timeout, **kwargs)
        if not gpu_check_interval > 0:
            raise ValueError(
                f"gpu_check_interval: got {gpu_check_interval!r}; expected seconds > 0"
            )
        self._gpu_device_index = gpu_device_index
        self._gpu_check_interval = gpu_check_interval
        self._gpu_monitoring_enabled = enable_gpu_monitoring
        self._gpu_health_check: GPUHealthCheck | None = None
        self._gpu_health_lock = threading.Lock()
        self._last_gpu_health_status = True
        self._last_gpu_check_time: float | None = None
        self._gpu_health_stop_event = threading.Event()
        self._gpu_health_thread: threading.Thread | None = None
        if enable_gpu_monitoring:
            from elastic.utils.gpu_health_check import GPUHealthCheck

            self._gpu_health_check = GPUHealthCheck(
                device_index=gpu_device_index, interval=int(gpu_check_interval)
            )

    def start(self) -> None:
        """Serve ``/health`` and ``/metrics`` and start watching the GPUs."""
        super().start()
        check = self._gpu_health_check
        if check is None or not check.enabled or self._gpu_health_thread is not None:
            return
        self._gpu_health_stop_event.clear()
        self._gpu_health_thread = threading.Thread(
            target=self._gpu_monitoring_loop, daemon=True, name="gpu-health-monitor"
        )
        self._gpu_health_thread.start()

    def stop(self) -> None:
        """Stop watching the GPUs and serving."""
        thread, self._gpu_health_thread = self._gpu_health_thread, None
        if thread is not None:
            self._gpu_health_stop_event.set()
            thread.join(5.0)
            if thread.is_alive():
                log.warning("the GPU health thread is still in an NVML call; left behind")
        super().stop()

    def _gpu_monitoring_loop(self) -> None:
        check = self._gpu_health_check
        assert check is not None
        while not self._gpu_health_stop_event.is_set():
            try:
                healthy = bool(check())
            except Exception:
                log.exception("GPU health check failed")
                healthy = False
            with self._gpu_health_lock:
                was = self._last_gpu_health_status
                self._last_gpu_health_status = healthy
                self._last_gpu_check_time = self._now()
            if was and not healthy:
                log.warning("GPU health check: unhealthy GPU(s) on this host")
            elif healthy and not was:
                log.info("GPU health check: the GPUs are healthy again")
            self._gpu_health_stop_event.wait(self._gpu_check_interval)

    def get_gpu_health_status(self) -> dict[str, Any]:
        """The last GPU verdict: ``enabled``, ``device_index``, ``is_healthy``,
        ``pynvml_available``, ``timestamp`` and ``last_check_time`` (None before the
        first check); ``{"error": ...}`` when monitoring was not asked for."""
        check = self._gpu_health_check
        if not self._gpu_monitoring_enabled or check is None:
            return {"error": "GPU monitoring not enabled"}
        with self._gpu_health_lock:
            return {
                "enabled": bool(check.enabled),
                "device_index": self._gpu_device_index,
                "is_healthy": self._last_gpu_health_status,
                "pynvml_available": bool(check.pynvml_available),
                "timestamp": time.time(),
                "last_check_time": self._last_gpu_check_time,
            }

    def get_health_summary(self) -> dict[str, Any]:
        """The process's liveness (``alive_callback`` against ``timeout``) and the GPUs'
        verdict, and both together as ``overall_healthy``."""
        try:
            last: float | None = float(self._alive_callback())
        except Exception:
            log.exception("health check: alive_callback failed")
            last = None
        alive = last is not None and self._now() - last <= self._timeout
        gpu = self.get_gpu_health_status()
        gpu_ok = bool(gpu.get("is_healthy", True)) if "error" not in gpu else True
        return {
            "process_health": {"alive": alive, "last_progress_time": last},
            "gpu_health": gpu,
            "overall_healthy": alive and gpu_ok,
            "timestamp": time.time(),
        }

    def health(self) -> tuple[int, dict[str, Any]]:
        code, body = super().health()
        gpu = self.get_gpu_health_status()
        body["gpu_health"] = gpu
        if "error" not in gpu and not gpu["is_healthy"] and code == HTTPStatus.OK:
            body["status"] = "gpu_unhealthy"
            code = HTTPStatus.SERVICE_UNAVAILABLE
        return code, body


def create_gpu_healthcheck_server(
    alive_callback: Callable[[], float],
    port: int,
    timeout: float,
    gpu_device_index: int | None = None,
    gpu_check_interval: float = 60,
    enable_gpu_monitoring: bool = True,
) -> GPUHealthCheckServer:
    """A :class:`GPUHealthCheckServer` (newer torch's factory)."""
    return GPUHealthCheckServer(
        alive_callback,
        port,
        timeout,
        gpu_device_index=gpu_device_index,
        gpu_check_interval=gpu_check_interval,
        enable_gpu_monitoring=enable_gpu_monitoring,
    )
