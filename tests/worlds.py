"""Run one async test body in either world: asyncio (real) or simpy (sim)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from elastic.clock import Clock
from elastic.real.clock import AsyncioClock
from sim.clock import SimClock

T = TypeVar("T")
WORLDS = ("real", "sim")


def run_in(world: str, body: Callable[[Clock], Awaitable[T]], until: float | None = None) -> T:
    """Run ``body(clock)`` to completion in ``world`` and return its result."""
    if world == "real":

        async def main() -> T:
            return await body(AsyncioClock())

        return asyncio.run(main())
    clock = SimClock()
    box: list[Any] = []

    async def main_sim() -> None:
        box.append(await body(clock))

    task = clock.spawn(main_sim(), name="test-main")
    clock.env.run(until=until)
    if clock.unobserved:
        raise clock.unobserved[0][1]
    if not task.done():
        raise AssertionError(
            f"the simulation ended at t={clock.now()} with the test body still waiting"
        )
    task_result = task.result  # re-raise a failure of the body
    task_result()
    return box[0]  # type: ignore[no-any-return]
