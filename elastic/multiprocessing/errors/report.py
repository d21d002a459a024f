"""Why a worker ended, in one line: the signal decoder and the OOM check of the report.

An exit code alone does not say who killed a worker: ``-9`` is the agent escalating a
stop, an operator's ``kill -9``, or the kernel's OOM killer.  :func:`describe_exit`
combines the exit code with what the agent knows (:class:`~elastic.workers.ExitCause`)::

    (-15, STOPPED_BY_AGENT) → "killed by the agent (SIGTERM during group stop)"
    (-9, SIGNALED)          → "killed from outside by SIGKILL"
    (-9, OOM_KILLED)        → "killed by the kernel's OOM killer (SIGKILL)"

The launcher decides ``OOM_KILLED`` with :func:`read_oom_counters` (before the group starts
and after a SIGKILL exit) and :func:`oom_verdict`.  What they check, in order:

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

import os
import signal
from dataclasses import dataclass

from elastic.multiprocessing.errors import ProcessFailure
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

_SMALL_FILE_BYTES = 64 * 1024  # memory.events, oom_control, vmstat and cgroup are ~1-4 kB


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for numbers with no name here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
        if sig is not None:
            return f"killed by the agent ({sig} during group stop)"
        return f"exited with code {exit_code} while the agent stopped the group"
    if sig is not None:
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


@dataclass(frozen=True, slots=True)
class OomCounters:
    """Kernel OOM-kill counts at one moment; None where not readable.

    ``cgroup`` names the cgroup read (``v2:/path`` or ``v1:/path``), so that two
    readings of different cgroups are not compared.
    """

    cgroup: str | None
    cgroup_oom_kills: int | None
    system_oom_kills: int | None


@dataclass(frozen=True, slots=True)
class OomVerdict:
    """Was a worker OOM-killed?  ``oom`` is None when the kernel's view is unknown."""

    oom: bool | None
    reason: str


def _read_small(path: str) -> str | None:
    try:
        with open(path, "rb") as fp:
            raw = fp.read(_SMALL_FILE_BYTES)
        return raw.decode("utf-8", errors="replace")
    except OSError:
        return None


def _field(text: str | None, name: str) -> int | None:
    """The integer value of a ``name value`` line (memory.events, vmstat, oom_control)."""
    if text is None:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            try:
                return int(parts[1])
            except ValueError:
                return None
    return None


def _memory_cgroup(proc_cgroup: str | None) -> tuple[str, str] | None:
    """("v2" | "v1", path) of the memory cgroup from a ``/proc/<pid>/cgroup`` text."""
    if proc_cgroup is None:
        return None
    v2: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            return "v1", path
        if hierarchy == "0" and controllers == "":
            v2 = path
    return ("v2", v2) if v2 is not None else None


def read_oom_counters(
    pid: int | None = None, *, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
) -> OomCounters:
    """Read the OOM-kill counts for the cgroup of ``pid`` (default: this process).

    Never raises; see the module docstring for what is read.  The roots are parameters
    for tests.
    """
    who = "self" if pid is None else str(pid)
    found = _memory_cgroup(_read_small(os.path.join(proc_root, who, "cgroup")))
    cgroup: str | None = None
    kills: int | None = None
    if found is not None:
        version, path = found
        rel = path.lstrip("/")
        if version == "v2":
            events = os.path.join(cgroup_root, rel, "memory.events")
            kills = _field(_read_small(events), "oom_kill")
        else:
            control = os.path.join(cgroup_root, "memory", rel, "memory.oom_control")
            kills = _field(_read_small(control), "oom_kill")
        if kills is not None:
            cgroup = f"{version}:{path}"
    system = _field(_read_small(os.path.join(proc_root, "vmstat")), "oom_kill")
    return OomCounters(cgroup=cgroup, cgroup_oom_kills=kills, system_oom_kills=system)


def oom_verdict(exit_code: int, before: OomCounters, after: OomCounters) -> OomVerdict:
    """Decide from two readings whether a worker that exited with ``exit_code`` was OOM-killed.

    The OOM killer sends SIGKILL, so other exits are never OOM.  The cgroup count is
    trusted when both readings have it for the same cgroup; otherwise a rise of the
    machine-wide count is taken as OOM (a heuristic, said so in ``reason``).
    """
    if exit_code not in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return OomVerdict(False, "not killed by SIGKILL, which is what the OOM killer sends")
    if (
        before.cgroup is not None
        and before.cgroup == after.cgroup
        and before.cgroup_oom_kills is not None
        and after.cgroup_oom_kills is not None
    ):
        delta = after.cgroup_oom_kills - before.cgroup_oom_kills
        if delta > 0:
            return OomVerdict(True, f"oom_kill of cgroup {before.cgroup} rose by {delta}")
        return OomVerdict(False, f"oom_kill of cgroup {before.cgroup} did not change")
    if before.system_oom_kills is not None and after.system_oom_kills is not None:
        delta = after.system_oom_kills - before.system_oom_kills
        if delta > 0:
            return OomVerdict(
                True,
                f"machine-wide oom_kill (/proc/vmstat) rose by {delta}; "
                "likely this worker (no cgroup count to confirm)",
            )
        return OomVerdict(False, "machine-wide oom_kill (/proc/vmstat) did not change")
    return OomVerdict(None, "no kernel OOM count readable (cgroup memory.events, /proc/vmstat)")


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
