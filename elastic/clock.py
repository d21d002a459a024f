"""The clock port: time, concurrency and waiting, for both worlds.

Theory of operation
-------------------
Agent logic is written as ``async def`` coroutines that await only what a
:class:`Clock` (and the store and workers ports) hands them.  Two
implementations exist:

* :class:`elastic.real.clock.AsyncioClock` — an asyncio event loop, wall time;
* :class:`sim.clock.SimClock` — a simpy ``Environment``, simulated time.

Guarantees both implementations keep (pinned by ``tests/test_port_contracts.py``):

1. ``now()`` never decreases.  ``sleep(d)`` resumes at ``now() + d`` (sim: exactly;
   real: no earlier).
2. ``spawn(coro)`` starts ``coro`` concurrently and returns a :class:`Task`.  A task
   does not start running before the spawner next awaits.
3. ``task.cancel()`` raises :data:`Cancelled` inside the task at the await where it is
   suspended; its ``finally`` blocks run.  ``await task.join()`` then raises
   :data:`Cancelled`.  Cancelling a finished task does nothing.
4. ``timeout(d, coro)`` returns the coroutine's result, or cancels it (its
   ``finally`` runs) and raises the builtin :class:`TimeoutError`.
5. ``event()`` is a one-shot: ``set(value)`` once wakes every waiter with ``value``;
   later ``set`` calls are ignored; ``wait()`` after ``set`` returns at once.
6. ``first(*waitables)`` returns ``(index, value)`` of the first task or event to
   complete, the lowest index winning ties.  It does not cancel the others.  A task
   that failed makes ``first`` raise its exception.

Cancellation is signalled with one exception type in both worlds:
:data:`Cancelled`, which *is* ``asyncio.CancelledError`` (the simulator throws the
same class).  Importing the exception class does no I/O; this is the one name from
``asyncio`` that agent logic may use.
"""

from __future__ import annotations

from asyncio import CancelledError as Cancelled
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["Cancelled", "Clock", "OneShot", "Task", "Waitable"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class Task(Protocol[T_co]):
    """A coroutine running concurrently on a clock."""

    name: str

    def cancel(self) -> None:
        """Ask the task to stop: :data:`Cancelled` is raised at its current await."""

    def done(self) -> bool:
        """True once the task returned, raised or was cancelled."""

    async def join(self) -> T_co:
        """Wait for the task; return its result or raise its exception."""
        ...


@runtime_checkable
class OneShot(Protocol):
    """An event that fires once, carrying an optional value."""

    def set(self, value: Any = None) -> None:
        """Fire the event (ignored if already fired)."""

    def is_set(self) -> bool:
        """True once fired."""
        ...

    async def wait(self) -> Any:
        """Wait until fired; return the value it was fired with."""


Waitable = Task[Any] | OneShot


class Clock(Protocol):
    """Time and concurrency, as the agent sees them.

    A spawned task that fails while nobody joins it is recorded in ``unobserved`` (task
    name, error) until someone retrieves the error (``join``, ``first``): a background
    failure is never swallowed, and the runner reports what is left.  At most
    :data:`UNOBSERVED_KEPT` are kept (the first ones: a long run whose background tasks
    keep failing must not grow without bound); ``unobserved_dropped`` counts the others
    (:func:`note_unobserved`).  A task cannot cancel itself (``RuntimeError``): it
    returns instead.
    """

    unobserved: list[tuple[str, BaseException]]
    unobserved_dropped: int

    def now(self) -> float:
        """Seconds on this world's clock (monotonic; the sim starts at 0)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the caller for ``seconds`` (≥ 0)."""

    def spawn(self, coro: Coroutine[Any, Any, T], name: str = "") -> Task[T]:
        """Run ``coro`` concurrently."""
        ...

    def event(self) -> OneShot:
        """A new, unfired one-shot event."""
        ...

    async def first(self, *waitables: Waitable) -> tuple[int, Any]:
        """Wait for the first of several tasks/events; return (index, value)."""
        ...

    async def timeout(self, seconds: float, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` with a deadline; raise :class:`TimeoutError` when it passes."""
        ...


#: how many unobserved task failures a clock keeps (see :class:`Clock`)
UNOBSERVED_KEPT = 100


def note_unobserved(clock: Clock, name: str, exc: BaseException) -> None:
    """Record that task ``name`` failed with ``exc`` and nobody has retrieved it yet."""
    if len(clock.unobserved) < UNOBSERVED_KEPT:
        clock.unobserved.append((name, exc))
    else:
        clock.unobserved_dropped += 1
