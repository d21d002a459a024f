"""torch's file-based timer pair, over a named pipe carrying one JSON object per line.

Wire format (torch's, version 1): one line per request, at most ``MAX_LINE_BYTES``
(``select.PIPE_BUF``, so a write is atomic), a JSON object
``{"version": 1, "pid": int, "scope_id": str, "expiration_time": number, "signal": int}``;
a negative ``expiration_time`` is a release.  Nothing else is accepted: a longer line,
another version, a missing or mistyped field, JSON nested deeper than Python can parse
is logged and dropped (the other requests read with it are kept).

Limits (anything that can write the pipe is untrusted): lines of at most
``MAX_LINE_BYTES``; at most ``MAX_TIMERS`` (1,024) live timers per server — an acquire
of a new scope beyond that is refused (a renewal or a release always passes);
warnings about refused or malformed requests, and about refused reaps, are
rate-limited to ``_LOG_BURST`` (10) lines per ``_LOG_WINDOW`` (10 s), followed by one
line counting what was suppressed.

The pipe's path (``TORCHELASTIC_TIMER_FILE``): created as a FIFO.  A stale FIFO of this
user at that path is replaced (torch's behaviour); any other existing file, or a path
that cannot be created, is refused with a :class:`~elastic.errors.ConfigError` naming
the variable — the server never deletes a file that is not a FIFO, and ``stop()``
removes the pipe only if it is still the one it made.

Server (real adapter): the FIFO is created with mode 0o600 (owner only).  The driver
loop watches it with ``loop.add_reader`` — it wakes when a client writes, never on a
timer — and keeps a write end open itself so the pipe does not report end-of-file
between clients.

Every well-formed request is accepted and listed by ``get_expired_timers``, whatever
pid and signal it names, as in torch.  The safety check is in the reap: the default
``_reap_worker(pid, signal)`` (torch's hook, which tests mock) sends only the allowed
signals to this agent's workers, through a :class:`~elastic.timer.guard.ReapGuard`;
anything else — a pid ≤ 0, the server itself, a process that is not one of its
workers — is logged, not signalled, and its timers are dropped.

A worker that has already exited has its timers dropped without a signal and without
reporting a kill, as torch's ``clear_timers`` drops the timers of processes no longer
running.  That check is :meth:`FileTimerServer.is_process_running` (psutil: gone, or a
zombie awaiting its parent, is not running), made when the worker's timer expires —
not on every pass, as there are no passes — and through ``self`` so that a subclass or
a test can replace it, as in torch.

Unlike torch, after reaping a worker the server does **not** send the same signal to its
own process: it reports the reap (``log_event("kill worker process", request)`` and
``on_reap(Reaped)``) and the agent goes on with its restart policy.

Agent-side use::

    server = FileTimerServer(path, run_id, max_interval=0.1, log_event=..., on_reap=...)
    server.start()
    server.set_worker_pids(pids)      # after every (re)start of the group
    ...
    server.stop()
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import signal as signal_mod
import stat
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from elastic.errors import ConfigError
from elastic.timer.api import TimerClient, TimerError, TimerRequest
from elastic.timer.debug_info_logging import log_debug_info_for_expired_timers
from elastic.timer.guard import DEFAULT_ALLOWED_SIGNALS, Reaped, ReapGuard
from elastic.timer.serving import DriverThread
from elastic.timer.table import TimerTable
from elastic.timer.wallclock import wall_time

__all__ = ["MAX_LINE_BYTES", "FileTimerClient", "FileTimerRequest", "FileTimerServer"]

log = logging.getLogger(__name__)

MAX_LINE_BYTES = select.PIPE_BUF
"""Longest request line, newline included; writes up to PIPE_BUF are atomic."""

PROTOCOL_VERSION = 1
MAX_TIMERS = 1024
"""Most live timers a server holds; a new scope beyond it is refused."""
_LOG_BURST = 10
_LOG_WINDOW = 10.0  # seconds


class _RateLimited:
    """At most ``_LOG_BURST`` warnings per ``_LOG_WINDOW`` seconds, then a count."""

    def __init__(self) -> None:
        self._window_start = -math.inf
        self._sent = 0
        self._suppressed = 0

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window_start >= _LOG_WINDOW:
            if self._suppressed:
                log.warning(
                    "%d more timer request warnings suppressed in the last %gs",
                    self._suppressed,
                    _LOG_WINDOW,
                )
            self._window_start, self._sent, self._suppressed = now, 0, 0
        if self._sent < _LOG_BURST:
            self._sent += 1
            log.warning(msg, *args)
        else:
            self._suppressed += 1


_warn = _RateLimited()
_NOBODY = -(2**63)  # no pid refused by the last _reap_worker (not a valid request pid)

_DEFAULT_SIGNAL = signal_mod.SIGKILL if sys.platform != "win32" else signal_mod.CTRL_C_EVENT  # type: ignore[attr-defined,unused-ignore]


@dataclass(frozen=True, slots=True, init=False)
class FileTimerRequest(TimerRequest):
    """A :class:`TimerRequest` with the signal the server should reap the worker with."""

    version: int = field(default=PROTOCOL_VERSION)
    signal: int = field(default=0)

    def __init__(
        self, worker_pid: int, scope_id: str, expiration_time: float, signal: int = 0
    ) -> None:
        object.__setattr__(self, "worker_id", worker_pid)
        object.__setattr__(self, "scope_id", scope_id)
        object.__setattr__(self, "expiration_time", expiration_time)
        object.__setattr__(self, "version", PROTOCOL_VERSION)
        object.__setattr__(self, "signal", signal)

    @property
    def worker_pid(self) -> int:
        return int(self.worker_id)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "pid": self.worker_pid,
                "scope_id": self.scope_id,
                "expiration_time": self.expiration_time,
                "signal": self.signal,
            }
        )


def parse_line(line: bytes) -> FileTimerRequest | None:
    """One pipe line as a request, or None (logged) when it breaks the schema."""
    if len(line) > MAX_LINE_BYTES:
        _warn.warning("dropping timer request of %d bytes: limit is %d", len(line), MAX_LINE_BYTES)
        return None
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        _warn.warning("dropping timer request: not JSON")
        return None
    except RecursionError:
        _warn.warning("dropping timer request: JSON nested too deeply")
        return None
    if not isinstance(obj, dict):
        _warn.warning("dropping timer request: expected a JSON object")
        return None
    if obj.get("version") != PROTOCOL_VERSION:
        _warn.warning(
            "dropping timer request with version %r: this server speaks version %d",
            obj.get("version"),
            PROTOCOL_VERSION,
        )
        return None
    pid, scope, exp, sig = (obj.get(k) for k in ("pid", "scope_id", "expiration_time", "signal"))
    if (
        type(pid) is not int
        or not isinstance(scope, str)
        or not isinstance(exp, int | float)
        or isinstance(exp, bool)
        or not math.isfinite(exp)
        or type(sig) is not int
    ):
        _warn.warning(
            "dropping timer request with missing or mistyped fields: %s", sorted(obj)[:10]
        )
        return None
    return FileTimerRequest(pid, scope, float(exp), sig)


class FileTimerClient(TimerClient):
    """Client of :class:`FileTimerServer`: writes one JSON line per request to the FIFO.

    ``signal`` is what the server should reap this worker with (0 or negative: never).
    """

    def __init__(self, file_path: str, signal: int = _DEFAULT_SIGNAL) -> None:
        self._file_path = file_path
        self.signal = int(signal)

    def _open_non_blocking(self) -> int:
        # The server may not be up yet: a non-blocking open fails at once (ENXIO)
        # instead of blocking the worker; retry for about a second, as torch does.
        for attempt in range(10):
            try:
                return os.open(self._file_path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                if attempt == 9:
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send_request(self, request: FileTimerRequest) -> None:
        data = (request.to_json() + "\n").encode()
        if len(data) > MAX_LINE_BYTES:
            raise TimerError(
                f"FileTimerRequest larger than {MAX_LINE_BYTES} bytes is not supported: "
                f"{data[:200]!r}... (use a shorter scope id)"
            )
        try:
            fd = self._open_non_blocking()
        except OSError as e:
            raise BrokenPipeError(
                "Could not send the FileTimerRequest because FileTimerServer is not available."
            ) from e
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._send_request(FileTimerRequest(os.getpid(), scope_id, expiration_time, self.signal))

    def release(self, scope_id: str) -> None:
        self._send_request(FileTimerRequest(os.getpid(), scope_id, -1, 0))


class FileTimerServer:
    """Server of :class:`FileTimerClient` s on this host (see the module docstring).

    torch's arguments, plus (ours, keyword-only): ``allowed_signals`` and ``on_reap``.
    ``max_interval`` is the retry period of a failed reap and the time ``stop()``
    waits; the server itself wakes only on requests and deadlines.
    """

    def __init__(
        self,
        file_path: str,
        run_id: str,
        max_interval: float = 10,
        daemon: bool = True,
        log_event: Callable[[str, FileTimerRequest | None], None] | None = None,
        *,
        allowed_signals: Iterable[int] = DEFAULT_ALLOWED_SIGNALS,
        on_reap: Callable[[Reaped], None] | None = None,
    ) -> None:
        self._file_path = file_path
        self._run_id = run_id
        self._max_interval = max_interval
        self._daemon = daemon
        self._log_event = log_event if log_event is not None else (lambda name, request: None)
        self._on_reap = on_reap
        self.guard = ReapGuard(allowed_signals)
        self._timers: TimerTable[FileTimerRequest] = TimerTable()
        self._core = DriverThread(
            type(self).__name__, self._reap, max_interval, self._timers, daemon
        )
        self._request_count = 0
        self._rfd: int | None = None
        self._wfd: int | None = None
        self._buf = b""
        self._discarding = False
        # acquires admitted by the running _drain, not yet registered: (worker, scope)
        self._pending: set[tuple[Any, str]] = set()
        self._fifo_id: tuple[int, int] | None = None  # (device, inode) of the pipe we made
        self._refused = _NOBODY
        self._make_fifo()

    def _make_fifo(self) -> None:
        path = self._file_path
        where = "TORCHELASTIC_TIMER_FILE"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise ConfigError(
                where, f"{path!r}: {e.strerror}; give a path for a new pipe"
            ) from None
        else:
            if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.getuid():
                raise ConfigError(
                    where,
                    f"{path!r} exists and is not a timer pipe of this user; it is left "
                    "alone: give the path of a file that does not exist",
                )
            os.remove(path)  # a stale pipe of ours (torch replaces it too)
        old = os.umask(0o077)  # no window where the pipe is wider than 0o600
        try:
            os.mkfifo(path, 0o600)
            os.chmod(path, 0o600)
            st = os.lstat(path)
        except (OSError, ValueError) as e:
            why = getattr(e, "strerror", None) or e
            raise ConfigError(where, f"{path!r}: cannot create the pipe ({why})") from None
        finally:
            os.umask(old)
        self._fifo_id = (st.st_dev, st.st_ino)

    def _remove_fifo(self) -> None:
        """Remove the pipe if it is still the one this server made."""
        try:
            st = os.lstat(self._file_path)
        except OSError:
            return
        if stat.S_ISFIFO(st.st_mode) and (st.st_dev, st.st_ino) == self._fifo_id:
            os.remove(self._file_path)

    # lifecycle

    def start(self) -> None:
        """Open the pipe and start the watchdog (returns at once)."""
        log.info(
            "Starting %s... max_interval=%s, daemon=%s, file_path=%s",
            type(self).__name__,
            self._max_interval,
            self._daemon,
            self._file_path,
        )
        if not os.path.exists(self._file_path):
            self._make_fifo()
        self._core.start(self._open_pipe, self._close_pipe)
        self._log_event("watchdog started", None)

    def stop(self) -> None:
        """Stop the watchdog, remove the pipe."""
        log.info("Stopping %s", type(self).__name__)
        self._core.stop(self._max_interval)
        self._remove_fifo()
        self._log_event("watchdog stopped", None)

    def run_once(self) -> None:
        """Process what is in the pipe now, then stop (torch's test helper)."""
        if self._rfd is not None:
            self._core.call(self._drain)
        self._core.stop(None)
        self._remove_fifo()

    async def _open_pipe(self, loop: Any) -> None:
        st = os.lstat(self._file_path)
        if not stat.S_ISFIFO(st.st_mode):
            raise TimerError(f"{self._file_path}: expected the timer FIFO, found another file")
        self._rfd = os.open(self._file_path, os.O_RDONLY | os.O_NONBLOCK)
        # our own writer keeps the pipe from reporting EOF (and waking us) between clients
        self._wfd = os.open(self._file_path, os.O_WRONLY | os.O_NONBLOCK)
        self._buf, self._discarding = b"", False
        loop.add_reader(self._rfd, self._drain)

    async def _close_pipe(self, loop: Any) -> None:
        if self._rfd is not None:
            loop.remove_reader(self._rfd)
            os.close(self._rfd)
            self._rfd = None
        if self._wfd is not None:
            os.close(self._wfd)
            self._wfd = None

    # reading (on the loop)

    def _drain(self) -> None:
        assert self._rfd is not None
        requests: list[FileTimerRequest] = []
        while True:
            try:
                chunk = os.read(self._rfd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._buf += chunk
            while True:
                nl = self._buf.find(b"\n")
                if nl < 0:
                    if len(self._buf) > MAX_LINE_BYTES:
                        _warn.warning(
                            "dropping an over-long timer request (> %d bytes)", MAX_LINE_BYTES
                        )
                        self._buf, self._discarding = b"", True
                    break
                line, self._buf = self._buf[: nl + 1], self._buf[nl + 1 :]
                if self._discarding:  # the tail of a line already refused
                    self._discarding = False
                    continue
                request = parse_line(line)
                if request is not None and self._admit(request):
                    requests.append(request)
        self._pending.clear()
        if requests:
            self.register_timers(requests)

    def _admit(self, request: FileTimerRequest) -> bool:
        # Any pid and signal are accepted, as torch does: the guard is applied when the
        # timer expires, in _reap_worker.  Only the number of live timers is bounded.
        if (
            request.expiration_time >= 0
            and len(self._timers) + len(self._pending) >= MAX_TIMERS
            and not self._timers.has(request.worker_id, request.scope_id)
            # a renewal of a timer acquired earlier in the same read is no new timer
            and (request.worker_id, request.scope_id) not in self._pending
        ):
            _warn.warning(
                "refusing timer %r of pid %s: %d timers are live (the limit)",
                request.scope_id[:100],
                request.worker_pid,
                MAX_TIMERS,
            )
            return False
        if request.expiration_time >= 0:
            self._pending.add((request.worker_id, request.scope_id))
        return True

    # torch's storage API

    def register_timers(self, timer_requests: list[FileTimerRequest]) -> None:
        self._request_count += len(timer_requests)
        self._core.submit(timer_requests)

    def clear_timers(self, worker_pids: set[int]) -> None:
        self._core.clear(worker_pids)

    def get_expired_timers(self, deadline: float) -> dict[int, list[FileTimerRequest]]:
        out: dict[int, list[FileTimerRequest]] = {}

        def read() -> None:
            out.update(self._timers.expired(deadline))  # type: ignore[arg-type]

        if not self._core.call(read):
            read()
        return out

    @staticmethod
    def is_process_running(pid: int) -> bool:
        """True if ``pid`` is a live process: not gone, not a zombie (it ran its last
        instruction and cannot be reaped again).  psutil; a pid ≤ 0 is no process.

        The server asks ``self.is_process_running`` when a worker's timer expires; a
        worker not running has its timers dropped without a reap.
        """
        if pid <= 0:
            return False
        try:
            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return False
        except psutil.Error:  # exists, but not ours to inspect
            return True

    def set_worker_pids(self, pids: Iterable[int] | None) -> None:
        """Allow only these workers (and descendants); drop timers of the others."""
        self.guard.set_worker_pids(pids)
        stale = {
            r.worker_pid for r in self._timers.timers() if not self.guard.pid_allowed(r.worker_pid)
        }
        if stale:
            self.clear_timers(stale)

    def get_last_progress_time(self) -> int:
        """Now while the watchdog runs and is not stuck; see ``DriverThread``."""
        return self._core.last_progress_time()

    # reaping (on the loop)

    def _reap_worker(self, worker_pid: int, signal: int) -> bool:
        """Send ``signal`` to the worker, if the guard allows it (else a warning, False)."""
        why = self.guard.refusal(worker_pid, signal)
        if why is not None:
            _warn.warning("refusing to signal pid %s with %s: %s", worker_pid, signal, why)
            self._refused = worker_pid
            return False
        return self.guard.send(worker_pid, signal)

    async def _reap(self, worker_id: Any, scope_id: str, expired_at: float) -> bool:
        pid = int(worker_id)
        now = self._core_now()
        expired = sorted(
            (r for r in self._timers.timers(pid) if r.expiration_time <= now),
            key=lambda r: r.expiration_time,
        )
        chosen: FileTimerRequest | None = None
        for request in expired:
            self._log_event("timer expired", request)
            if request.signal > 0:
                chosen = request
                break
        log_debug_info_for_expired_timers(self._run_id, {pid: [r.to_json() for r in expired]})
        if chosen is None:
            log.info("No signal specified with worker=[%s]. Do not reap it.", pid)
            return True
        if not self.is_process_running(pid):  # torch drops an exited process's timers
            log.info("Process with pid=%s does not exist. Skipping", pid)
            return True
        log.info("Reaping worker_pid=[%s]. Expired timers: %s", pid, [r.scope_id for r in expired])
        self._refused = _NOBODY
        if not self._reap_worker(pid, chosen.signal):
            if self._refused == pid:
                # the guard refused: retrying would only repeat it, so the timers go
                self._refused = _NOBODY
                return True
            return False
        log.info("Successfully reaped worker=[%s] with signal=%s", pid, chosen.signal)
        self._log_event("kill worker process", chosen)
        if self._on_reap is not None:
            try:
                self._on_reap(Reaped(pid, chosen.scope_id, chosen.expiration_time, chosen.signal))
            except Exception:
                log.exception("on_reap callback failed")
        return True

    @staticmethod
    def _core_now() -> float:
        return wall_time()
