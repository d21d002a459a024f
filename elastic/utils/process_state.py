"""Linux process state from ``/proc`` (torch 2.13's ``utils.process_state``).

Used by the agent's uninterruptible-sleep (D-state) check: a worker stuck in the kernel
(a wedged GPU or NIC driver, a dead NFS mount) cannot be killed, and a new worker on the
same host would contend for what it holds, so the group is marked unhealthy and not
restarted (``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``).
"""

from __future__ import annotations

__all__ = ["is_uninterruptible_state", "read_proc_state"]


def read_proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``D``, ``Z``, ...) from
    ``/proc/<pid>/stat``, or ``None`` when it cannot be read (not Linux, the process is
    gone, no permission, a malformed line).  The command name may hold spaces and
    parentheses, so the state is the first field after the *last* ``)``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            data = f.read()
    except (OSError, ValueError):
        return None
    end = data.rfind(")")
    if end == -1:
        return None
    rest = data[end + 1 :].split()
    return rest[0] if rest else None


def is_uninterruptible_state(state: str | None) -> bool:
    """True for Linux's uninterruptible sleep (``D``, and any state that starts with it)."""
    return state is not None and state.startswith("D")
