"""torch's ``TailLog``: copy lines appended to log files to one stream, each with a header.

For programs that use torch's helper directly.  ``elastic``'s own launcher does not: it
reads each worker's pipe when the kernel says it is readable and tees it through
:mod:`elastic.multiprocessing.tail`, with no polling and no line split between two
headers.  A file written by another process gives no such signal, so this helper does what
torch's does: one thread per file reads lines and sleeps ``interval_sec`` at the end of
the file, until :meth:`TailLog.stop`; a file that does not exist yet is waited for.

Behaviour kept from torch: the header is ``[<name><key>]:`` unless ``log_line_prefixes``
gives one; lines for which ``log_line_filter`` is false are dropped; ``stop`` lets each
thread read to the end of its file before it returns; an error in one file's thread is
logged (``logger.error``) and does not stop the others.  ``dst`` may also be a path, which
is opened for appending (torch 2.13 takes only a text stream).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TextIO

__all__ = ["TailLog", "tail_logfile"]

logger = logging.getLogger(__name__)


def tail_logfile(
    header: str,
    file: str,
    dst: TextIO,
    finished: threading.Event,
    interval_sec: float,
    log_line_filter: Callable[[str], bool] | None = None,
) -> None:
    """Copy ``file``'s lines to ``dst`` with ``header`` until ``finished`` is set and the
    end of the file is reached (returns at once if the file never appeared)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    with open(file, errors="replace") as fp:
        while True:
            line = fp.readline()
            if line:
                if log_line_filter is None or log_line_filter(line):
                    dst.write(f"{header}{line}")
            elif finished.is_set():
                return
            else:
                time.sleep(interval_sec)


class TailLog:
    """Tail ``log_files`` (key -> path) into ``dst`` from :meth:`start` until :meth:`stop`.

    Usage::

        tailer = TailLog("trainer", {0: "/tmp/0.log", 1: "/tmp/1.log"}, sys.stdout).start()
        run_trainers()
        tailer.stop()

    Lines of different files interleave in the order they are read, not written.
    """

    def __init__(
        self,
        name: str,
        log_files: dict[int, str],
        dst: TextIO | str,
        log_line_prefixes: dict[int, str] | None = None,
        interval_sec: float = 0.1,
        log_line_filter: Callable[[str], bool] = (lambda _: True),
    ) -> None:
        self._name = name
        self._log_files = dict(log_files)
        self._dst = dst
        self._log_line_prefixes = log_line_prefixes or {}
        self._interval_sec = interval_sec
        self._log_line_filter = log_line_filter
        self._finished = {key: threading.Event() for key in self._log_files}
        self._futs: list[tuple[int, Future[None]]] = []
        self._threadpool: ThreadPoolExecutor | None = None
        if self._log_files:
            self._threadpool = ThreadPoolExecutor(
                max_workers=len(self._log_files),
                thread_name_prefix=f"{type(self).__qualname__}_{name}",
            )
        self._owned_dst: TextIO | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> TailLog:
        """Start one reader per file; returns ``self``."""
        if self._threadpool is None or not self._dst:
            return self
        out: TextIO
        if isinstance(self._dst, str):
            self._owned_dst = out = open(self._dst, "a")  # noqa: SIM115 (closed in stop)
        else:
            out = self._dst
        sink = _LockedWriter(out, self._lock)
        for key, path in self._log_files.items():
            header = self._log_line_prefixes.get(key, f"[{self._name}{key}]:")
            fut = self._threadpool.submit(
                tail_logfile,
                header=header,
                file=path,
                dst=sink,  # type: ignore[arg-type]  # has the one method used: write
                finished=self._finished[key],
                interval_sec=self._interval_sec,
                log_line_filter=self._log_line_filter,
            )
            self._futs.append((key, fut))
        return self

    def stop(self) -> None:
        """Let every reader finish its file, then stop them; errors are logged."""
        for finished in self._finished.values():
            finished.set()
        for key, fut in self._futs:
            try:
                fut.result()
            except Exception as exc:
                logger.error(
                    "error in log tailer for %s%s: %s",
                    self._name,
                    key,
                    type(exc).__qualname__,
                    exc_info=True,
                )
        if self._threadpool is not None:
            self._threadpool.shutdown(wait=True)
        if self._owned_dst is not None:
            self._owned_dst.close()
            self._owned_dst = None
        self._stopped = True

    def stopped(self) -> bool:
        """Whether :meth:`stop` has returned."""
        return self._stopped


class _LockedWriter:
    """``write`` under a lock: whole lines from different readers never interleave."""

    __slots__ = ("_lock", "_out")

    def __init__(self, out: TextIO, lock: threading.Lock) -> None:
        self._out = out
        self._lock = lock

    def write(self, text: str) -> int:
        with self._lock:
            return self._out.write(text)
