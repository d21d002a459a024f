"""Types of the C extension :mod:`elastic.real._spawn` (see ``_spawn.c``)."""

from collections.abc import Sequence

def spawn(
    path: str | bytes,
    argv: Sequence[bytes],
    envp: Sequence[bytes],
    fd_map: Sequence[tuple[int, int]],
    pgid: int = 0,
    pdeathsig: int = 9,
    parent_pid: int = 0,
    setsid: bool = False,
    cgroup_fd: int = -1,
) -> int: ...
def set_child_subreaper() -> None: ...

CGROUP_FD: int
