"""The one leftover-process sweep of the test suite.

A test that starts processes must leave none behind.  :func:`no_leftover_processes` wraps
the test: it notes this process's descendants before, and afterwards waits (up to
``grace`` seconds: stopping takes a moment) until every new descendant — and every process
carrying one of the given environment markers, which finds the daemons that escaped the
process tree with ``setsid`` — is gone; whatever is still alive then is SIGKILLed and the
test fails naming it.  Zombies count as gone (and our own are reaped on the way).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator

import psutil

from elastic.real import proctree

__all__ = ["gone", "is_mp_helper", "no_leftover_processes"]


def gone(pid: int) -> bool:
    """Dead or a zombie; a zombie child of ours is reaped on the way."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return True
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return True


def is_mp_helper(p: psutil.Process) -> bool:
    """multiprocessing's resource tracker: it lives as long as this process, by design
    (an ``ignore`` for :func:`no_leftover_processes`)."""
    try:
        return any("resource_tracker" in part for part in p.cmdline())
    except psutil.Error:
        return True


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _ignored(pid: int, ignore: Callable[[psutil.Process], bool] | None) -> bool:
    if ignore is None:
        return False
    try:
        return ignore(psutil.Process(pid))
    except psutil.Error:
        return True


@contextlib.contextmanager
def no_leftover_processes(
    markers: Callable[[], Iterable[proctree.Marker | None]] = tuple,
    *,
    ignore: Callable[[psutil.Process], bool] | None = None,
    grace: float = 3.0,
) -> Iterator[None]:
    """Fail if a process started inside the block outlives it (after ``grace`` seconds).

    ``markers``: called at the end, the environment markers whose carriers must be gone
    too.  ``ignore``: processes that live as long as the test process by design.
    """
    before = _descendants()
    yield
    deadline = time.monotonic() + grace
    while True:
        left = _descendants() - before
        for m in markers():
            if m is not None:
                left |= proctree.pids_with_env(m, exclude={os.getpid()})
        left = {p for p in left if not gone(p) and not _ignored(p, ignore)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {sorted(left)}"
