"""Why a worker ended, in one line: the signal decoder and the OOM check of the report.

An exit code alone does not say who killed a worker: ``-9`` is the agent escalating a
stop, an operator's ``kill -9``, or the kernel's OOM killer.  :func:`describe_exit`
combines the exit code with what the agent knows (:class:`~elastic.workers.ExitCause`)::

    (-15, STOPPED_BY_AGENT) → "killed by the agent (SIGTERM during group stop)"
    (-9, SIGNALED)          → "killed from outside by SIGKILL"
    (-11, SIGNALED)         → "crashed: SIGSEGV (raised by the process itself: a fault or abort())"
    (-9, OOM_KILLED)        → "killed by the kernel's OOM killer (SIGKILL)"

The launcher decides ``OOM_KILLED`` with :func:`read_oom_counters` (before the group starts
and after a SIGKILL exit) and :func:`oom_verdict`, which live in :mod:`elastic.multiprocessing.oom`
(the launcher reads the counters on every start; this module, with the error-file
machinery it imports, is needed only when there is a failure to report) and are
re-exported here.  What they check, in order:

1. the ``oom_kill`` count of the memory cgroup the agent (or a given pid) is in —
   cgroup v2 ``<cgroup>/memory.events``, cgroup v1 ``memory/<cgroup>/memory.oom_control``.
   It counts processes of that cgroup killed by any OOM killer (cgroup limit or whole
   machine); in v2 it includes child cgroups, so workers in a sub-cgroup are seen;
2. failing that, the machine-wide ``oom_kill`` count in ``/proc/vmstat`` (Linux ≥ 4.13):
   a rise says *some* process was OOM-killed, very likely the worker that just died of
   SIGKILL, but it is a heuristic.

Files that are absent, unreadable or odd count as "not known"; nothing here raises, runs
``dmesg`` or needs privileges.  A rise in a count is shared by all workers that died of
SIGKILL between two readings.
"""

from __future__ import annotations

import signal

from elastic.multiprocessing.errors import ProcessFailure
from elastic.multiprocessing.oom import OomCounters, OomVerdict, oom_verdict, read_oom_counters
from elastic.workers import ExitCause, WorkerExit

__all__ = [
    "OomCounters",
    "OomVerdict",
    "describe_exit",
    "failure_from_exit",
    "oom_verdict",
    "read_oom_counters",
    "signal_name",
]


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for numbers with no name here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


#: SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS: a process's own fault
_SELF_INFLICTED = frozenset({4, 5, 6, 7, 8, 11, 31})


def describe_exit(exit_code: int, cause: ExitCause | None = None) -> str:
    """One line saying how a worker ended: who killed it, or how it exited.

    ``exit_code`` is negative for a signal (``-9`` = SIGKILL).  ``cause`` is what the
    agent knows; None means nothing beyond the code.
    """
    sig = signal_name(-exit_code) if exit_code < 0 else None
    if cause is ExitCause.OOM_KILLED:
        return f"killed by the kernel's OOM killer ({sig or 'SIGKILL'})"
    if cause is ExitCause.LOST:
        return "lost with its node (no exit status was seen)"
    if cause is ExitCause.STOPPED_BY_AGENT:
        if sig is not None and -exit_code in _SELF_INFLICTED:
            # the agent stops workers with SIGTERM (or the signal it was stopped by) and
            # SIGKILL: a fault signal during the stop is the worker's own crash
            return (
                f"crashed: {sig} (raised by the process itself while the agent stopped the group)"
            )
        if sig is not None:
            return f"killed by the agent ({sig} during group stop)"
        return f"exited with code {exit_code} while the agent stopped the group"
    if sig is not None:
        if -exit_code in _SELF_INFLICTED:
            # the kernel sends these to a process for its own fault (or abort()): nobody
            # outside killed it, whatever sent the signal
            return f"crashed: {sig} (raised by the process itself: a fault or abort())"
        if cause is ExitCause.SIGNALED:
            return f"killed from outside by {sig}"
        return f"killed by {sig}"
    if exit_code == 0:
        return "exited normally (code 0)"
    if 128 < exit_code < 128 + 65:
        # A shell or wrapper between us and the worker reports "killed by N" as 128+N.
        inner = signal_name(exit_code - 128)
        return f"exited with code {exit_code} (a shell's way of saying its child got {inner})"
    return f"exited with code {exit_code}"


def failure_from_exit(exit: WorkerExit, fallback_timestamp: float | None = None) -> ProcessFailure:
    """The :class:`ProcessFailure` for a worker exit, carrying the agent's cause.

    ``fallback_timestamp`` (seconds since the epoch; in the simulator, simulated time) is
    used when the worker wrote no error file.  ``WorkerExit.time`` is not used for it: in
    real mode it is on the monotonic clock.
    """
    return ProcessFailure(
        exit.local_rank,
        exit.pid if exit.pid is not None else -1,
        exit.exit_code,
        exit.error_file or "",
        fallback_timestamp=fallback_timestamp,
        cause=None if exit.cause is ExitCause.EXITED else exit.cause,
    )
