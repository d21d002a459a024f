"""The kernel's OOM-kill counts, read before a group starts and after a SIGKILL exit.

See :mod:`elastic.multiprocessing.errors.report` for what is read and how a verdict is
reached.  A module of its own, importing nothing of the error-file machinery, because
the launcher reads the counters on every (re)start: the report is imported only when
there is a failure to report.
"""

from __future__ import annotations

import os

from elastic._records import Frozen, set_fields

__all__ = ["OomCounters", "OomVerdict", "oom_verdict", "read_oom_counters"]

_SMALL_FILE_BYTES = 64 * 1024  # memory.events, oom_control, vmstat and cgroup are ~1-4 kB
_SIGKILL = 9


class OomCounters(Frozen):
    """Kernel OOM-kill counts at one moment; None where not readable.

    ``cgroup`` names the cgroup read (``v2:/path`` or ``v1:/path``), so that two
    readings of different cgroups are not compared.
    """

    __slots__ = ("cgroup", "cgroup_oom_kills", "system_oom_kills")
    cgroup: str | None
    cgroup_oom_kills: int | None
    system_oom_kills: int | None

    def __init__(
        self, cgroup: str | None, cgroup_oom_kills: int | None, system_oom_kills: int | None
    ) -> None:
        set_fields(self, "cgroup", cgroup)
        set_fields(self, "cgroup_oom_kills", cgroup_oom_kills)
        set_fields(self, "system_oom_kills", system_oom_kills)


class OomVerdict(Frozen):
    """Was a worker OOM-killed?  ``oom`` is None when the kernel's view is unknown."""

    __slots__ = ("oom", "reason")
    oom: bool | None
    reason: str

    def __init__(self, oom: bool | None, reason: str) -> None:
        set_fields(self, "oom", oom)
        set_fields(self, "reason", reason)


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
    if exit_code not in (-_SIGKILL, 128 + _SIGKILL):
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
