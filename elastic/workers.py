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
from typing import Any, Protocol

from elastic._records import Frozen, slot_setters

__all__ = ["ExitCause", "RunningGroup", "WorkerExit", "WorkerLaunch", "WorkersPort"]


class WorkerLaunch(Frozen):
    """What to start for one local rank."""

    __slots__ = ("args", "attempt", "entrypoint", "env", "global_rank", "local_rank", "round")
    local_rank: int
    global_rank: int
    env: Mapping[str, str]
    entrypoint: str | Callable[..., Any]
    args: Sequence[Any]
    attempt: int
    round: int  # the rendezvous round whose world this worker joins

    def __init__(
        self,
        local_rank: int,
        global_rank: int,
        env: Mapping[str, str],
        entrypoint: str | Callable[..., Any],
        args: Sequence[Any] = (),
        attempt: int = 0,
        round: int = 0,
    ) -> None:
        _l_local_rank(self, local_rank)
        _l_global_rank(self, global_rank)
        _l_env(self, env)
        _l_entrypoint(self, entrypoint)
        _l_args(self, args)
        _l_attempt(self, attempt)
        _l_round(self, round)


# one launch per worker per start: the slots' setters directly (elastic._records.slot_setters)
_l_local_rank, _l_global_rank, _l_env, _l_entrypoint, _l_args, _l_attempt, _l_round = slot_setters(
    WorkerLaunch, "local_rank", "global_rank", "env", "entrypoint", "args", "attempt", "round"
)


class ExitCause(enum.Enum):
    """Why a worker process ended, from the launcher's point of view."""

    EXITED = "exited"  # returned an exit code on its own
    SIGNALED = "signaled"  # killed by a signal the agent did not send
    STOPPED_BY_AGENT = "stopped_by_agent"  # the agent's stop() ended it
    OOM_KILLED = "oom_killed"  # the kernel's OOM killer (SIGKILL recorded as OOM)
    LOST = "lost"  # the node under it vanished (sim: node crash)


class WorkerExit(Frozen):
    """One worker's end: exit code (negative = killed by signal -code), when, and why."""

    __slots__ = (
        "cause",
        "error_file",
        "exit_code",
        "extra",
        "local_rank",
        "pid",
        "return_value",
        "time",
    )
    local_rank: int
    exit_code: int
    time: float
    cause: ExitCause
    pid: int | None
    return_value: Any
    error_file: str | None
    extra: Mapping[str, Any]

    def __init__(
        self,
        local_rank: int,
        exit_code: int,
        time: float,
        cause: ExitCause = ExitCause.EXITED,
        pid: int | None = None,
        return_value: Any = None,
        error_file: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        _x_local_rank(self, local_rank)
        _x_exit_code(self, exit_code)
        _x_time(self, time)
        _x_cause(self, cause)
        _x_pid(self, pid)
        _x_return_value(self, return_value)
        _x_error_file(self, error_file)
        _x_extra(self, {} if extra is None else extra)

    @property
    def failed(self) -> bool:
        return self.exit_code != 0


# one exit per worker per stop: the slots' setters directly (elastic._records.slot_setters)
(
    _x_local_rank,
    _x_exit_code,
    _x_time,
    _x_cause,
    _x_pid,
    _x_return_value,
    _x_error_file,
    _x_extra,
) = slot_setters(
    WorkerExit,
    "local_rank",
    "exit_code",
    "time",
    "cause",
    "pid",
    "return_value",
    "error_file",
    "extra",
)


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
        """Graceful signal, ``grace`` seconds, then kill; return once all are gone.

        Returns the exits the stop caused; they are queued for ``next_exit`` too, so
        after a stop ``next_exit`` returns at once for every exit not yet taken.
        """
        ...


class WorkersPort(Protocol):
    """Starts groups of workers on this node."""

    async def start(self, launches: Sequence[WorkerLaunch]) -> RunningGroup:
        """Start one worker per launch; return when all are started."""
        ...
