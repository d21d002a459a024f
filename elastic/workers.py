"""The workers port: start a group of worker processes, learn of their exits, stop them.

Theory of operation
-------------------
The agent hands a :class:`WorkersPort` one :class:`WorkerLaunch` per local rank and gets
back a :class:`RunningGroup`.  It never polls: ``next_exit()`` returns the moment the
next worker exits (the real launcher learns it from the kernel, the simulator from an
event), in the order the exits happened.  ``stop(grace)`` sends the shutdown signal to
every live worker (real: its whole process tree), waits up to ``grace`` seconds, then
kills what is left, and returns only when every worker is gone.

Implementations: :class:`elastic.real.workers.ProcessWorkers` (subprocesses reaped as
process trees with psutil) and :class:`sim.workers.SimWorkers` (worker models).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["ExitCause", "RunningGroup", "WorkerExit", "WorkerLaunch", "WorkersPort"]


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """What to start for one local rank."""

    local_rank: int
    global_rank: int
    env: Mapping[str, str]
    entrypoint: str | Callable[..., Any]
    args: Sequence[Any] = ()
    attempt: int = 0
    round: int = 0  # the rendezvous round whose world this worker joins


class ExitCause(enum.Enum):
    """Why a worker process ended, from the launcher's point of view."""

    EXITED = "exited"  # returned an exit code on its own
    SIGNALED = "signaled"  # killed by a signal the agent did not send
    STOPPED_BY_AGENT = "stopped_by_agent"  # the agent's stop() ended it
    OOM_KILLED = "oom_killed"  # the kernel's OOM killer (SIGKILL recorded as OOM)
    LOST = "lost"  # the node under it vanished (sim: node crash)


@dataclass(frozen=True, slots=True)
class WorkerExit:
    """One worker's end: exit code (negative = killed by signal -code), when, and why."""

    local_rank: int
    exit_code: int
    time: float
    cause: ExitCause = ExitCause.EXITED
    pid: int | None = None
    return_value: Any = None
    error_file: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.exit_code != 0


class RunningGroup(Protocol):
    """A started group of workers."""

    def pids(self) -> dict[int, int]:
        """local rank → worker id (pid in real mode; a synthetic id in the sim)."""
        ...

    def running(self) -> frozenset[int]:
        """Local ranks still running."""
        ...

    async def next_exit(self) -> WorkerExit:
        """Wait for the next worker exit not yet returned."""
        ...

    def signal(self, sig: int, local_rank: int | None = None) -> None:
        """Send ``sig`` to one worker (or all), without waiting."""

    async def stop(self, grace: float, sig: int = 15) -> list[WorkerExit]:
        """Graceful signal, ``grace`` seconds, then kill; return once all are gone."""
        ...


class WorkersPort(Protocol):
    """Starts groups of workers on this node."""

    async def start(self, launches: Sequence[WorkerLaunch]) -> RunningGroup:
        """Start one worker per launch; return when all are started."""
        ...
