"""The simulated clock: the Clock port on a simpy ``Environment``.

Theory of operation
-------------------
simpy drives any object with ``send``/``throw``, so it drives a coroutine: an
awaitable whose ``__await__`` yields a simpy event suspends the coroutine until that
event fires, and ``await`` chains pass the yield through to the outermost coroutine,
which simpy runs as a ``Process``.  Each spawned task is one ``Process`` running a small
driver (``_SimTask._drive``) that records the outcome, so a failing or cancelled task
never crashes the simulation; a failure nobody retrieved is kept in
:attr:`SimClock.unobserved` for the runner to report.

Cancellation is simpy's public ``Process.interrupt`` with a cause of our own, which the
awaitable the coroutine is suspended in (``_Yield``) turns into
:data:`elastic.clock.Cancelled` (``asyncio.CancelledError``), so agent code sees the same
exception type in both worlds and no simpy ``Interrupt``.  A timeout is a race between
the guarded task and a simpy ``Timeout``; the loser is cancelled and awaited, so its
``finally`` has run before :class:`TimeoutError` is raised — as ``asyncio.timeout`` does.
"""

from __future__ import annotations

import enum
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

import simpy
from simpy.events import NORMAL, AnyOf, Event, EventPriority, Process
from simpy.exceptions import Interrupt

from elastic.clock import Cancelled, OneShot, Task, Waitable

__all__ = ["CountingEnvironment", "SimClock", "SimTaskError"]

T = TypeVar("T")


class SimTaskError(RuntimeError):
    """A task failed in the simulation and nobody joined it."""


# the cause of the interrupt that cancels a task (see _Yield)
_CANCEL = object()


class _Yield:
    """Await a simpy event from a coroutine; a cancelling interrupt raises Cancelled here."""

    __slots__ = ("ev",)

    def __init__(self, ev: Event) -> None:
        self.ev = ev

    def __await__(self) -> Generator[Event, Any, Any]:
        # every await of a simulated coroutine suspends here, so the interrupt is turned
        # into the port's exception before any agent code sees it (a try costs nothing
        # until something is raised)
        try:
            return (yield self.ev)
        except Interrupt as interrupt:
            if interrupt.cause is _CANCEL:
                raise Cancelled() from None
            raise


class _Outcome(enum.Enum):
    RUNNING = 0
    RETURNED = 1
    FAILED = 2
    CANCELLED = 3


class _SimTask(Task[T], Generic[T]):
    __slots__ = ("_clock", "_exc", "_outcome", "_proc", "_result", "name")

    def __init__(self, clock: SimClock, coro: Coroutine[Any, Any, T], name: str) -> None:
        self._clock = clock
        self.name = name
        self._outcome = _Outcome.RUNNING
        self._result: T | None = None
        self._exc: BaseException | None = None
        self._proc = Process(clock.env, self._drive(coro))  # type: ignore[arg-type]

    async def _drive(self, coro: Coroutine[Any, Any, T]) -> None:
        try:
            self._result = await coro
            self._outcome = _Outcome.RETURNED
        except Cancelled:
            self._outcome = _Outcome.CANCELLED
        except Exception as e:
            self._exc = e
            self._outcome = _Outcome.FAILED
            self._clock.unobserved.append((self.name, e))

    def cancel(self) -> None:
        if not self._proc.is_alive:
            return
        if self._proc is self._clock.env.active_process:
            raise RuntimeError(f"task {self.name!r} cannot cancel itself in the simulator")
        self._proc.interrupt(_CANCEL)

    def done(self) -> bool:
        return self._outcome is not _Outcome.RUNNING

    def result(self) -> T:
        if self._outcome is _Outcome.RETURNED:
            return self._result  # type: ignore[return-value]
        if self._outcome is _Outcome.CANCELLED:
            raise Cancelled()
        if self._outcome is _Outcome.FAILED:
            assert self._exc is not None
            self._clock._observed(self._exc)
            raise self._exc
        raise RuntimeError(f"task {self.name!r} has not finished")

    async def join(self) -> T:
        if not self.done():
            await _Yield(self._proc)
        return self.result()


class _SimOneShot(OneShot):
    __slots__ = ("_ev",)

    def __init__(self, env: simpy.Environment) -> None:
        self._ev = Event(env)

    def set(self, value: Any = None) -> None:
        if not self._ev.triggered:
            self._ev.succeed(value)

    def is_set(self) -> bool:
        return bool(self._ev.triggered)

    async def wait(self) -> Any:
        return await _Yield(self._ev)


class CountingEnvironment(simpy.Environment):
    """A simpy ``Environment`` that counts the events it schedules (``scheduled``): the
    cost of a run in events (DESIGN §2), which simpy keeps only in a private counter."""

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        self.scheduled = 0

    def schedule(self, event: Event, priority: EventPriority = NORMAL, delay: float = 0) -> None:
        self.scheduled += 1
        # called once per event: the base method bound at import, not super(), which
        # measured ~5% of a run's CPU time (bench/bench_sim.py)
        _schedule(self, event, priority, delay)


_schedule = simpy.Environment.schedule


class SimClock:
    """The Clock port on a simpy Environment (simulated seconds)."""

    def __init__(self, env: simpy.Environment | None = None) -> None:
        self.env = env if env is not None else simpy.Environment()
        self.unobserved: list[tuple[str, BaseException]] = []

    def _observed(self, exc: BaseException) -> None:
        self.unobserved = [(n, e) for (n, e) in self.unobserved if e is not exc]

    def now(self) -> float:
        return float(self.env.now)

    async def sleep(self, seconds: float) -> None:
        await _Yield(self.env.timeout(max(0.0, seconds)))

    def spawn(self, coro: Coroutine[Any, Any, T], name: str = "") -> Task[T]:
        return _SimTask(self, coro, name)

    def event(self) -> OneShot:
        return _SimOneShot(self.env)

    def wrap(self, ev: Event) -> OneShot:
        """A OneShot view of a raw simpy event (for the simulator's own models)."""
        one = _SimOneShot.__new__(_SimOneShot)
        one._ev = ev
        return one

    @staticmethod
    def event_of(w: Waitable) -> Event:
        """The simpy event that fires when ``w`` (a task or event of this clock) does: for
        ``env.run(until=...)`` and the simulator's own models."""
        if isinstance(w, _SimTask):
            return w._proc
        if isinstance(w, _SimOneShot):
            return w._ev
        raise TypeError(f"first() takes tasks and events of this clock, got {w!r}")

    @staticmethod
    def _value_of(w: Waitable) -> Any:
        if isinstance(w, _SimTask):
            return w.result()
        assert isinstance(w, _SimOneShot)
        return w._ev.value

    @staticmethod
    def _is_done(w: Waitable) -> bool:
        if isinstance(w, _SimTask):
            return w.done()
        assert isinstance(w, _SimOneShot)
        return w.is_set()

    async def first(self, *waitables: Waitable) -> tuple[int, Any]:
        if not waitables:
            raise ValueError("first() needs at least one task or event")
        for i, w in enumerate(waitables):  # lowest index wins ties
            if self._is_done(w):
                return i, self._value_of(w)
        await _Yield(AnyOf(self.env, [self.event_of(w) for w in waitables]))
        for i, w in enumerate(waitables):
            if self._is_done(w):
                return i, self._value_of(w)
        raise AssertionError("AnyOf fired with nothing done")  # pragma: no cover

    async def timeout(self, seconds: float, coro: Coroutine[Any, Any, T]) -> T:
        task = _SimTask(self, coro, "timeout")
        deadline = self.env.timeout(max(0.0, seconds))
        try:
            await _Yield(AnyOf(self.env, [task._proc, deadline]))
        except Cancelled:
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        await _Yield(task._proc)
        if task._outcome is _Outcome.RETURNED:  # finished in the same instant
            return task.result()
        if task._outcome is _Outcome.FAILED:
            return task.result()
        raise TimeoutError(f"timed out after {seconds:g}s")
