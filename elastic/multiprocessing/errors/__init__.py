"""Worker error files and the failure report (torch's ``elastic.multiprocessing.errors``).

A worker's ``main`` decorated with :func:`record` writes the exception that ends it to
``TORCHELASTIC_ERROR_FILE`` (torch's JSON format, see :mod:`.error_handler`).  The agent
turns each failed worker into a :class:`ProcessFailure`, which reads that file, and raises
:class:`ChildFailedError` with all of them; its message is torch's report, root cause
(earliest failure) last::

    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
      <NO_OTHER_FAILURES>
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      time      : 2026-01-02_03:04:05
      host      : node-7
      rank      : 3 (local_rank: 3)
      exitcode  : 1 (pid: 4242)
      error_file: /tmp/.../attempt_0/3/error.json
      traceback : Traceback (most recent call last): ...
    ============================================================

Differences from torch, all on the side of never losing the report:

* a malformed, truncated, non-JSON, foreign or huge error file never raises: the failure
  keeps the path, its message becomes ``<N/A> (error file …: <why>)`` and its timestamp
  falls back to the exit time;
* a failure may carry the agent's :class:`~elastic.workers.ExitCause`; the report then
  adds a ``cause`` line that says who killed the worker (see :mod:`.report`).  Without
  a cause the layout is torch's, line for line;
* the time used when there is no error file can be given (``fallback_timestamp``), so a
  simulated run's report does not depend on the host's clock.

Limits on an error file (it is written by the worker, so it is untrusted input): at most
``MAX_ERROR_FILE_BYTES`` (1 MiB; larger is not read), UTF-8 JSON nested at most as deep
as Python's recursion limit allows (deeper: refused), an object with a ``"message"``
string or object; a ``timestamp`` (integer, or a string of at most 4,300 digits) outside
``[0, MAX_TIMESTAMP]`` (0 to the end of year 9999) is ignored and the exit time used.
Control characters in what the report shows (ANSI escapes, carriage returns, NULs; all
of C0 and C1 but newline and tab) are written as ``\\xNN`` escapes, so an error file
cannot drive the operator's terminal.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import wraps
from string import Template
from typing import Any, ParamSpec, TypeVar

from elastic.errors import ElasticError
from elastic.multiprocessing.errors.error_handler import ErrorHandler, read_error_file
from elastic.multiprocessing.errors.handlers import get_error_handler
from elastic.workers import ExitCause

__all__ = [
    "ChildFailedError",
    "ErrorHandler",
    "ProcessFailure",
    "get_error_handler",
    "record",
]

logger = logging.getLogger(__name__)

JSON = dict[str, Any]
GlobalRank = int

_NOT_AVAILABLE = "<N/A>"

_R = TypeVar("_R")
_P = ParamSpec("_P")


def _empty_error_data() -> JSON:
    # A fresh dict each time: ProcessFailure adds "errorTraits" to it.
    return {"message": "<NONE>"}


#: The latest timestamp an error file may give: 9999-12-31T00:00:00Z (``datetime``'s
#: last year, a day early so that every time zone can show it).
MAX_TIMESTAMP = 253402214400

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters but newline and tab escaped as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _as_timestamp(value: object) -> int | None:
    """An integer timestamp from the file's ``"timestamp"`` (int or digit string), or
    None when absent, malformed or outside ``[0, MAX_TIMESTAMP]``."""
    if isinstance(value, bool):
        return None
    stamp: int | None = None
    if isinstance(value, int):
        stamp = value
    elif isinstance(value, str) and len(value) <= 4300:
        try:
            stamp = int(value.strip())
        except ValueError:
            return None
    if stamp is None or not 0 <= stamp <= MAX_TIMESTAMP:
        return None
    return stamp


@dataclass(frozen=True, slots=True)
class ProcessFailure:
    """One failed worker process, with what its error file says.

    ``message`` is the file's ``"message"`` (a string, or torch's object with
    ``extraInfo.py_callstack``); ``timestamp`` is the file's (seconds since the epoch).
    Without an error file, ``error_file`` becomes ``"<N/A>"``, the timestamp is
    ``fallback_timestamp`` (or now) and the message is made up from the exit code, as
    torch does.  An unreadable file keeps its path and explains itself in ``message``.
    Never raises on a bad file.
    """

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    error_file_data: JSON = field(init=False)
    message: str | JSON = field(init=False)
    timestamp: int = field(init=False)
    #: Why the error file was refused (None when read, or when there was none).
    error_file_problem: str | None = field(init=False)
    #: Seconds since the epoch to use when the error file gives no time.
    fallback_timestamp: float | None = field(default=None, kw_only=True, compare=False)
    #: What the agent knows about the end of the process (None: nothing).
    cause: ExitCause | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        fallback = (
            int(self.fallback_timestamp)
            if self.fallback_timestamp is not None
            else int(time.time())
        )
        data: JSON = _empty_error_data()
        message: str | JSON = ""
        timestamp = fallback
        problem: str | None = None
        read = read_error_file(self.error_file) if self.error_file else None
        if read is None or read.problem == "no such file":
            object.__setattr__(self, "error_file", _NOT_AVAILABLE)
        elif read.data is None:
            problem = read.problem
            data = {"message": _NOT_AVAILABLE}
            message = f"{_NOT_AVAILABLE} (error file {problem})"
            logger.warning("error file %s of pid %s: %s", self.error_file, self.pid, problem)
        else:
            data = read.data
            message, file_timestamp = self._get_error_data(data)
            if file_timestamp is not None:
                timestamp = file_timestamp
        if not message:
            # A process killed by a signal writes no message: say which signal.
            if self.exitcode < 0:
                message = (
                    f"Signal {-self.exitcode} ({self.signal_name()}) received by PID {self.pid}"
                )
            else:
                data["errorTraits"] = {
                    "category": "system_terminated_error",
                    "retryability": "False",
                }
                message = (
                    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
                )
        object.__setattr__(self, "error_file_data", data)
        object.__setattr__(self, "message", message)
        object.__setattr__(self, "timestamp", timestamp)
        object.__setattr__(self, "error_file_problem", problem)

    @staticmethod
    def _get_error_data(data: JSON) -> tuple[str | JSON, int | None]:
        """(message, timestamp) from a checked error file; timestamp None if absent."""
        message = data["message"]
        if isinstance(message, str):
            return message, _as_timestamp(data.get("timestamp"))
        extra = message.get("extraInfo")
        stamp = _as_timestamp(extra.get("timestamp")) if isinstance(extra, dict) else None
        return message, stamp

    def signal_name(self) -> str:
        """The name of the signal that killed the process, or ``"<N/A>"``."""
        if self.exitcode < 0:
            try:
                return signal.Signals(-self.exitcode).name
            except ValueError:
                return _NOT_AVAILABLE
        return _NOT_AVAILABLE

    def timestamp_isoformat(self) -> str:
        """The timestamp as local time, ``YYYY-MM-DD_HH:MM:SS`` (the number itself where
        the platform cannot show it as a date)."""
        try:
            return datetime.fromtimestamp(self.timestamp).isoformat(sep="_")
        except (OverflowError, OSError, ValueError):
            return str(self.timestamp)

    def traceback_text(self) -> str:
        """What the report shows as the traceback: the call stack, else the message."""
        msg = self.message
        if isinstance(msg, str):
            return msg
        extra = msg.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        if isinstance(stack, str):
            return stack
        inner = msg.get("message")
        return inner if isinstance(inner, str) else _NOT_AVAILABLE


_FAILURE_FORMAT_TEMPLATE = """[${idx}]:
  time      : ${time}
  host      : ${hostname}
  rank      : ${rank} (local_rank: ${local_rank})
  exitcode  : ${exitcode} (pid: ${pid}) ${signal_name}${cause}
  error_file: ${error_file}
  traceback : ${message}"""

# The empty first line and the borders are torch's layout.
_MSG_FORMAT_TEMPLATE = """
${boarder}
${title}
${section}
Failures:
${other_failures}
${section}
Root Cause (first observed failure):
${root_failure}
${boarder}"""


class ChildFailedError(ElasticError):
    """Worker processes failed; ``str(e)`` is the report, root cause last.

    ``failures`` maps global rank → :class:`ProcessFailure` and must not be empty.  The
    root cause is the failure with the smallest timestamp (ties: the first in
    ``failures``' order, which the agent fills in exit order).  ``hostname`` is shown on
    every failure (default: this machine's FQDN).  All fields are in ``args``.
    """

    def __init__(
        self, name: str, failures: dict[GlobalRank, ProcessFailure], hostname: str | None = None
    ) -> None:
        if not failures:
            raise AssertionError("ChildFailedError needs at least one failure")
        super().__init__(name, failures, hostname)
        self.name = name
        self.failures = failures
        self.hostname = hostname
        self._msg = self.format_msg()

    def __str__(self) -> str:
        return self._msg

    def get_first_failure(self) -> tuple[GlobalRank, ProcessFailure]:
        """(global rank, failure) of the earliest failure."""
        rank = min(self.failures.keys(), key=lambda r: self.failures[r].timestamp)
        return rank, self.failures[rank]

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        """torch's report: other failures first, then the root cause; width ≤ 60."""
        title = printable(f"{self.name} FAILED")
        root_rank, _ = self.get_first_failure()
        hostname = self.hostname if self.hostname is not None else socket.getfqdn()
        root_failure_fmt = ""
        other_failures_fmt: list[str] = []
        width = len(title)
        for idx, (rank, failure) in enumerate(self.failures.items()):
            fmt, w = self._format_failure(idx, rank, failure, hostname)
            width = max(width, w)
            if rank == root_rank:
                root_failure_fmt = fmt
            else:
                other_failures_fmt.append(fmt)
        width = min(width, 60)
        return Template(_MSG_FORMAT_TEMPLATE).substitute(
            boarder=boarder_delim * width,
            title=title,
            section=section_delim * width,
            root_failure=root_failure_fmt,
            other_failures="\n".join(other_failures_fmt or ["  <NO_OTHER_FAILURES>"]),
        )

    def _format_failure(
        self, idx: int, rank: int, failure: ProcessFailure, hostname: str
    ) -> tuple[str, int]:
        # Imported here: report imports this module for ProcessFailure.
        from elastic.multiprocessing.errors.report import describe_exit

        signal_name = failure.signal_name()
        signal_name_str = f" ({signal_name})" if signal_name != _NOT_AVAILABLE else ""
        cause = (
            ""
            if failure.cause is None
            else "\n  cause     : " + describe_exit(failure.exitcode, failure.cause)
        )
        fmt = Template(_FAILURE_FORMAT_TEMPLATE).substitute(
            idx=idx,
            time=failure.timestamp_isoformat(),
            hostname=hostname,
            rank=rank,
            local_rank=failure.local_rank,
            exitcode=failure.exitcode,
            pid=failure.pid,
            signal_name=signal_name_str,
            cause=cause,
            error_file=printable(failure.error_file),
            message=printable(self._failure_text(failure)).replace("\n", "\n  "),
        )
        width = max(len(line) for line in fmt.split("\n"))
        return fmt, width

    @staticmethod
    def _failure_text(failure: ProcessFailure) -> str:
        """What the report shows under ``traceback``: the failure's own text, which the
        error handler may enrich for a worker killed by a signal (torch's seam)."""
        text = failure.traceback_text()
        if failure.exitcode < 0:
            text = get_error_handler().maybe_enrich_signal_failure_message(text, failure.error_file)
        return text


def record(
    fn: Callable[_P, _R], error_handler: ErrorHandler | None = None
) -> Callable[_P, _R | None]:
    """Decorate a process's top-level function so that its failure reaches the report.

    Equivalent to::

        error_handler.initialize()
        try:
            return fn(*args, **kwargs)
        except SystemExit as se:          # exit(0) → return None; other codes propagate
            ...
        except ChildFailedError as e:      # a nested launcher: pass the root cause up
            error_handler.dump_error_file(root.error_file, root.exitcode); raise
        except Exception as e:
            error_handler.record_exception(e); raise
        error_handler.record_success()    # returned: torch's success hook

    Use once per process, on ``main``.
    """
    handler = error_handler if error_handler is not None else get_error_handler()
    handler.set_entrypoint_fn_name(getattr(fn, "__qualname__", None))

    @wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
        handler.initialize()
        try:
            result = fn(*args, **kwargs)
        except SystemExit as se:
            # A script run with runpy that calls exit(0) must not end its worker as failed.
            if se.code == 0:
                return None
            raise
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            if failure.error_file != _NOT_AVAILABLE:
                handler.dump_error_file(failure.error_file, failure.exitcode)
            else:
                logger.info(
                    "local_rank %s FAILED with no error file. Decorate your entrypoint fn "
                    "with @record for traceback info. "
                    "See: https://pytorch.org/docs/stable/elastic/errors.html",
                    rank,
                )
            raise
        except Exception as e:
            handler.record_exception(e)
            raise
        # outside the try: a record_success() that raises is not reported as the
        # entrypoint's failure
        handler.record_success()
        return result

    return wrapper
