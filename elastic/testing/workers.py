"""The workers port's conformance suite: what every workers implementation promises.

Each check is ``async def check_…(clock, harness) -> None``, awaited inside the clock's
world; it raises :class:`AssertionError` when a :class:`~elastic.workers.WorkersPort`
breaks a promise of :mod:`elastic.workers`.  A :class:`WorkersHarness` tells the checks
how to drive the implementation under test: ``port`` starts groups, ``launches(n)``
describes ``n`` workers that run until told otherwise, ``make_exit(group, local_rank,
code)`` makes one of them end on its own with ``code`` (a real worker is asked to
``sys.exit(code)``; a simulated one exits in the model), and ``wait`` bounds how long a
check waits for something that must happen (seconds of the harness's world).

Run them all with :func:`check_workers`, or one by one from :data:`ALL_CHECKS`; each
check needs a fresh harness.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from elastic.clock import Clock
from elastic.workers import ExitCause, RunningGroup, WorkerExit, WorkerLaunch, WorkersPort

__all__ = ["ALL_CHECKS", "WorkersCheck", "WorkersHarness", "check_workers"]


class WorkersHarness(Protocol):
    """How the checks drive the workers port under test."""

    port: WorkersPort
    wait: float  # the longest a promised exit may take to be seen, in this world's seconds

    def launches(self, n: int) -> Sequence[WorkerLaunch]:
        """``n`` workers (local ranks ``0..n-1``) that run until stopped or told to exit."""
        ...

    async def make_exit(self, group: RunningGroup, local_rank: int, code: int) -> None:
        """Make the worker ``local_rank`` of ``group`` exit on its own with ``code``."""


WorkersCheck = Callable[[Clock, WorkersHarness], Awaitable[None]]


async def _next(clock: Clock, h: WorkersHarness, group: RunningGroup) -> WorkerExit:
    try:
        return await clock.timeout(h.wait, group.next_exit())
    except TimeoutError:
        raise AssertionError(f"next_exit() returned nothing within {h.wait:g}s") from None


async def check_start_gives_each_worker_an_id_and_all_run(clock: Clock, h: WorkersHarness) -> None:
    group = await h.port.start(h.launches(3))
    try:
        pids = group.pids()
        assert sorted(pids) == [0, 1, 2], f"pids() keys {sorted(pids)}, expected [0, 1, 2]"
        assert len(set(pids.values())) == 3, f"worker ids not distinct: {pids}"
        assert group.running() == frozenset({0, 1, 2}), group.running()
    finally:
        await group.stop(h.wait)


async def check_an_exit_is_returned_once_with_its_code_and_cause(
    clock: Clock, h: WorkersHarness
) -> None:
    group = await h.port.start(h.launches(2))
    try:
        await h.make_exit(group, 1, 3)
        ex = await _next(clock, h, group)
        assert (ex.local_rank, ex.exit_code, ex.cause) == (1, 3, ExitCause.EXITED), ex
        assert ex.failed
        assert ex.pid == group.pids()[1], (ex.pid, group.pids())
        assert group.running() == frozenset({0}), group.running()
    finally:
        stopped = await group.stop(h.wait)
    assert [(e.local_rank, e.cause) for e in stopped] == [(0, ExitCause.STOPPED_BY_AGENT)], stopped
    # the stop's exits are queued for next_exit too; rank 1's is not returned again
    again = await _next(clock, h, group)
    assert again.local_rank == 0 and again.cause is ExitCause.STOPPED_BY_AGENT, again


async def check_a_zero_exit_is_not_a_failure(clock: Clock, h: WorkersHarness) -> None:
    group = await h.port.start(h.launches(1))
    try:
        await h.make_exit(group, 0, 0)
        ex = await _next(clock, h, group)
        assert (ex.local_rank, ex.exit_code, ex.cause) == (0, 0, ExitCause.EXITED), ex
        assert not ex.failed
        assert group.running() == frozenset()
    finally:
        assert await group.stop(h.wait) == [], "a stop with no live worker returned exits"


async def check_exits_come_in_the_order_they_happened(clock: Clock, h: WorkersHarness) -> None:
    group = await h.port.start(h.launches(3))
    try:
        for rank, code in ((2, 4), (0, 5)):
            await h.make_exit(group, rank, code)
            ex = await _next(clock, h, group)
            assert (ex.local_rank, ex.exit_code) == (rank, code), ex
        assert group.running() == frozenset({1}), group.running()
    finally:
        await group.stop(h.wait)


async def check_stop_ends_every_live_worker_and_queues_their_exits(
    clock: Clock, h: WorkersHarness
) -> None:
    group = await h.port.start(h.launches(3))
    stopped = await group.stop(h.wait)
    assert sorted(e.local_rank for e in stopped) == [0, 1, 2], stopped
    assert all(e.cause is ExitCause.STOPPED_BY_AGENT and e.failed for e in stopped), stopped
    assert group.running() == frozenset(), group.running()
    taken = [await _next(clock, h, group) for _ in range(3)]
    assert sorted(e.local_rank for e in taken) == [0, 1, 2], taken
    # a second stop ends nothing more: it returns nothing new (the real port returns the
    # first call's list again, so that concurrent stops all see it; the model, nothing)
    again = await group.stop(h.wait)
    assert all(e in stopped for e in again), f"a second stop returned new exits: {again}"


ALL_CHECKS: tuple[WorkersCheck, ...] = (
    check_start_gives_each_worker_an_id_and_all_run,
    check_an_exit_is_returned_once_with_its_code_and_cause,
    check_a_zero_exit_is_not_a_failure,
    check_exits_come_in_the_order_they_happened,
    check_stop_ends_every_live_worker_and_queues_their_exits,
)


async def check_workers(
    clock: Clock,
    harness: Callable[[], Awaitable[WorkersHarness]],
    checks: tuple[WorkersCheck, ...] = ALL_CHECKS,
) -> None:
    """Run ``checks`` one after another, each on a fresh harness from ``harness()``."""
    for check in checks:
        await check(clock, await harness())
