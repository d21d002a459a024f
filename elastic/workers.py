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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, overload

from elastic._records import Frozen, slot_setters

__all__ = [
    "ExitCause",
    "ExitList",
    "GroupLaunch",
    "GroupWorkersPort",
    "ListenedGroup",
    "RunningGroup",
    "WorkerExit",
    "WorkerLaunch",
    "WorkersPort",
    "worker_env",
]


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


def worker_env(
    base: Mapping[str, str],
    local_rank: int,
    global_rank: int,
    role_rank: int,
    world_size: int,
    role_world_size: int,
    virtual_local_rank: bool = False,
) -> dict[str, str]:
    """One worker's environment: a copy of its group's shared ``base`` (torch's keys in
    torch's order, the per-worker ones holding a placeholder) with the worker's own ranks
    (``LOCAL_RANK`` stays the base's with ``virtual_local_rank``)."""
    env = dict(base)
    if not virtual_local_rank:
        env["LOCAL_RANK"] = str(local_rank)
    env["RANK"] = str(global_rank)
    env["ROLE_RANK"] = str(role_rank)
    env["WORLD_SIZE"] = str(world_size)
    env["ROLE_WORLD_SIZE"] = str(role_world_size)
    return env


class GroupLaunch(Frozen):
    """One node's workers to start, as one record (for a port that takes records:
    :class:`GroupWorkersPort`).

    Worker ``i`` is ``launches()[i]``: local rank ``local_ranks[i]``, global rank
    ``global_ranks[i]``, the environment :func:`worker_env` makes of ``env`` (the group's
    shared part) and the worker's ranks, and the group's ``entrypoint``, ``args``,
    ``attempt`` and ``round``.  Every column has one value per worker (checked when the
    record is made: :class:`ValueError`).

    Performance: the simulator starts eight workers per node per job restart and reads
    none of their environments; as one record, the per-worker dicts and launches are made
    only if a port asks for them (:meth:`launches`)."""

    __slots__ = (
        "args",
        "attempt",
        "entrypoint",
        "env",
        "global_ranks",
        "local_ranks",
        "role_ranks",
        "role_world_sizes",
        "round",
        "virtual_local_rank",
        "world_sizes",
    )
    env: Mapping[str, str]
    local_ranks: Sequence[int]
    global_ranks: Sequence[int]
    role_ranks: Sequence[int]
    world_sizes: Sequence[int]
    role_world_sizes: Sequence[int]
    virtual_local_rank: bool
    entrypoint: str | Callable[..., Any]
    args: Sequence[Any]
    attempt: int
    round: int

    def __init__(
        self,
        env: Mapping[str, str],
        local_ranks: Sequence[int],
        global_ranks: Sequence[int],
        role_ranks: Sequence[int],
        world_sizes: Sequence[int],
        role_world_sizes: Sequence[int],
        virtual_local_rank: bool,
        entrypoint: str | Callable[..., Any],
        args: Sequence[Any] = (),
        attempt: int = 0,
        round: int = 0,
    ) -> None:
        n = len(local_ranks)
        if not (
            len(global_ranks) == len(role_ranks) == len(world_sizes) == len(role_world_sizes) == n
        ):
            raise ValueError(
                f"GroupLaunch columns have {len(local_ranks)}, {len(global_ranks)}, "
                f"{len(role_ranks)}, {len(world_sizes)} and {len(role_world_sizes)} values; "
                "expected one per worker in each"
            )
        _g_env(self, env)
        _g_local_ranks(self, local_ranks)
        _g_global_ranks(self, global_ranks)
        _g_role_ranks(self, role_ranks)
        _g_world_sizes(self, world_sizes)
        _g_role_world_sizes(self, role_world_sizes)
        _g_virtual(self, virtual_local_rank)
        _g_entrypoint(self, entrypoint)
        _g_args(self, args)
        _g_attempt(self, attempt)
        _g_round(self, round)

    def __len__(self) -> int:
        return len(self.local_ranks)

    def launches(self) -> list[WorkerLaunch]:
        """One :class:`WorkerLaunch` per worker, in order: what the agent hands a port
        that takes no records."""
        base, virtual = self.env, self.virtual_local_rank
        entrypoint, args, attempt, round_ = self.entrypoint, self.args, self.attempt, self.round
        return [
            WorkerLaunch(
                lr,
                gr,
                worker_env(base, lr, gr, rr, ws, rws, virtual),
                entrypoint,
                args,
                attempt,
                round_,
            )
            for lr, gr, rr, ws, rws in zip(
                self.local_ranks,
                self.global_ranks,
                self.role_ranks,
                self.world_sizes,
                self.role_world_sizes,
                strict=True,
            )
        ]


(
    _g_env,
    _g_local_ranks,
    _g_global_ranks,
    _g_role_ranks,
    _g_world_sizes,
    _g_role_world_sizes,
    _g_virtual,
    _g_entrypoint,
    _g_args,
    _g_attempt,
    _g_round,
) = slot_setters(
    GroupLaunch,
    "env",
    "local_ranks",
    "global_ranks",
    "role_ranks",
    "world_sizes",
    "role_world_sizes",
    "virtual_local_rank",
    "entrypoint",
    "args",
    "attempt",
    "round",
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


class ExitList(Sequence[WorkerExit]):
    """The exits a stop caused, in order: a sequence of :class:`WorkerExit`, and the same
    exits as two columns, ``local_ranks`` and ``exit_codes`` (what the agent reports of
    a stopped group), which can be read without making the records.

    A port may build the records only when the sequence is first read (``make``: the
    simulator stops eight workers per node per job restart, and the agent reads only the
    columns of most stops); :meth:`of` wraps records already made.  Equal to any
    sequence of the same exits (a list included)."""

    __slots__ = ("_items", "_make", "exit_codes", "local_ranks")

    def __init__(
        self,
        local_ranks: list[int],
        exit_codes: list[int],
        make: Callable[[], list[WorkerExit]],
    ) -> None:
        if len(local_ranks) != len(exit_codes):
            raise ValueError(
                f"ExitList columns have {len(local_ranks)} and {len(exit_codes)} values; "
                "expected one per exit in each"
            )
        self.local_ranks = local_ranks
        self.exit_codes = exit_codes
        self._make: Callable[[], list[WorkerExit]] | None = make
        self._items: list[WorkerExit] | None = None

    @classmethod
    def of(cls, exits: Iterable[WorkerExit]) -> ExitList:
        """The exits of ``exits``, made already (a port that has the records)."""
        items = list(exits)
        out = cls([ex.local_rank for ex in items], [ex.exit_code for ex in items], list)
        out._items, out._make = items, None
        return out

    def _all(self) -> list[WorkerExit]:
        items = self._items
        if items is None:
            make, self._make = self._make, None
            assert make is not None
            items = self._items = make()
        return items

    def __len__(self) -> int:
        return len(self.local_ranks)

    @overload
    def __getitem__(self, i: int) -> WorkerExit: ...

    @overload
    def __getitem__(self, i: slice) -> list[WorkerExit]: ...

    def __getitem__(self, i: int | slice) -> WorkerExit | list[WorkerExit]:
        return self._all()[i]

    def __iter__(self) -> Iterator[WorkerExit]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ExitList):
            return self._all() == other._all()
        if isinstance(other, list | tuple):
            return self._all() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists: unhashable as they are

    def __repr__(self) -> str:
        return f"ExitList({self._all()!r})"


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

    async def stop(self, grace: float, sig: int = 15) -> Sequence[WorkerExit]:
        """Graceful signal, ``grace`` seconds, then kill; return once all are gone.

        Returns the exits the stop caused (an :class:`ExitList` from this package's
        ports, whose columns the agent reads without the records; any sequence of
        exits from others); they are queued for ``next_exit`` too, so after a stop
        ``next_exit`` returns at once for every exit not yet taken.
        """
        ...


class ListenedGroup(RunningGroup, Protocol):
    """A running group whose exits can also be taken without a task waiting for them.

    ``take_exit()`` returns at once what ``next_exit()`` would return without waiting (the
    next exit not yet returned, if the agent may see it now), else ``None``.
    ``listen(fn)`` calls ``fn()`` once, at the moment a ``next_exit()`` that started
    waiting now would resume, and returns a function that cancels the call (harmless
    after it).  The agent then takes the exits in ``fn``: one task fewer per group.
    """

    def take_exit(self) -> WorkerExit | None:
        """The next exit not yet returned, if it can be seen now; else ``None``."""
        ...

    def listen(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` when a waiting ``next_exit()`` would resume; return a canceller."""
        ...


class WorkersPort(Protocol):
    """Starts groups of workers on this node."""

    async def start(self, launches: Sequence[WorkerLaunch]) -> RunningGroup:
        """Start one worker per launch; return when all are started."""
        ...


class GroupWorkersPort(WorkersPort, Protocol):
    """A workers port that also starts a group from one :class:`GroupLaunch` record.

    ``start_group(g)`` must do exactly what ``start(g.launches())`` does.  The agent
    hands the record only when no worker's environment needs the agent's own hooks (an
    env hook, an overridden ``worker_env``) and the arguments are the same for every
    worker; otherwise it calls ``start`` with the launches, as a port without records
    always gets."""

    async def start_group(self, group: GroupLaunch) -> RunningGroup:
        """Start the workers of ``group``; return when all are started."""
        ...
