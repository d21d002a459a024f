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

Cancellation is an interrupt whose exception is :data:`elastic.clock.Cancelled`
(``asyncio.CancelledError``) instead of simpy's ``Interrupt``, so agent code sees the
same exception type in both worlds.  A timeout is a race between the guarded task and
a deadline; the loser is cancelled and awaited, so its ``finally`` has run before
:class:`TimeoutError` is raised — as ``asyncio.timeout`` does.

Shared wake-ups
---------------
Every sleep (and every ``timeout``'s deadline) that ends at the same simulated time ``T``
shares one scheduled event, a :class:`_Wake`, instead of a simpy ``Timeout`` each: when
2,048 agents read the store in the same instant, their 2,048 latency sleeps cost one
event.  The order in which the sleepers resume is exactly the order of their own
timeouts, because (see :class:`_Env`):

* a sleep joins the open wake-up for ``T`` only if no other event was scheduled at ``T``
  since that wake-up was scheduled (otherwise it would resume before that event instead
  of after it); any other event scheduled at ``T`` closes it, and the next sleep to ``T``
  opens a new one;
* when the wake-up fires, its sleepers resume one by one, and any urgent event one of
  them scheduled (a task's start, a cancellation) is processed before the next sleeper
  resumes, as simpy would have processed it before the next sleeper's own timeout.

A run's event log is therefore byte-identical with and without sharing; only simpy's
event count and the time spent drop.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Coroutine, Generator
from heapq import heappop
from typing import Any, Generic, TypeVar

import simpy
from simpy.events import NORMAL, PENDING, URGENT, AnyOf, Event, EventPriority, Interruption, Process

from elastic.clock import Cancelled, OneShot, Task, Waitable

__all__ = ["SimClock", "SimTaskError"]

T = TypeVar("T")


class SimTaskError(RuntimeError):
    """A task failed in the simulation and nobody joined it."""


class _Yield:
    """Await a simpy event from a coroutine."""

    __slots__ = ("ev",)

    def __init__(self, ev: Event) -> None:
        self.ev = ev

    def __await__(self) -> Generator[Event, Any, Any]:
        return (yield self.ev)


class _Cancel(Interruption):
    """simpy's interruption, throwing the port's cancellation exception."""

    def __init__(self, process: Process) -> None:
        super().__init__(process, None)
        self._value = Cancelled()


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
        if self._proc._value is not PENDING:
            return
        if self._proc is self._clock.env.active_process:
            raise RuntimeError(f"task {self.name!r} cannot cancel itself in the simulator")
        _Cancel(self._proc)

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


class _Wake(Event):
    """One scheduled wake-up shared by every sleep that ends at the same time."""

    __slots__ = ()

    def __init__(self, env: _Env, delay: float) -> None:
        self.env = env
        # a deque: the sleepers are resumed from its front while it is still the event's
        # callbacks, so a sleeper cancelled by an earlier one is removed from it (as from
        # its own pending Timeout) and not resumed
        self.callbacks = deque()  # type: ignore[assignment]
        self._ok = True
        self._value = None
        env.schedule(self, NORMAL, delay)


class _Env(simpy.Environment):
    """simpy's Environment with shared wake-ups (module docstring, "Shared wake-ups").

    Performance: ``schedule`` runs for every event of the run; it adds one float
    comparison to simpy's own.
    """

    def __init__(self) -> None:
        super().__init__()
        self._wake: _Wake | None = None  # the open wake-up, joinable by sleeps to _wake_t
        self._wake_t = -1.0

    def schedule(self, event: Event, priority: EventPriority = NORMAL, delay: float = 0) -> None:
        t = self._now + delay
        if t == self._wake_t:
            self._wake = None  # another event at T: a later sleep must resume after it
            self._wake_t = -1.0
        super().schedule(event, priority, delay)

    def wake_after(self, delay: float) -> Event:
        """The event that fires ``delay`` from now, shared with other sleeps to that time."""
        t = self._now + delay
        wake = self._wake
        if wake is not None and t == self._wake_t:
            return wake
        wake = _Wake(self, delay)  # its own schedule closed any wake-up open at t
        self._wake, self._wake_t = wake, t
        return wake

    def step(self) -> None:
        queue = self._queue
        if not queue or type(queue[0][3]) is not _Wake:
            super().step()
            return
        now, _, _, wake = heappop(queue)
        self._now = now
        if wake is self._wake:
            self._wake = None
            self._wake_t = -1.0
        callbacks: deque[Any] = wake.callbacks  # type: ignore[assignment]
        while callbacks:
            callbacks.popleft()(wake)
            # what this sleeper scheduled urgently runs before the next sleeper resumes,
            # as it would have before the next sleeper's own timeout
            while queue and queue[0][1] == URGENT and queue[0][0] == now:
                super().step()
        wake.callbacks = None  # type: ignore[assignment]


class SimClock:
    """The Clock port on a simpy Environment (simulated seconds)."""

    def __init__(self, env: simpy.Environment | None = None) -> None:
        self.env = env if env is not None else _Env()
        self.unobserved: list[tuple[str, BaseException]] = []
        wake_after = getattr(self.env, "wake_after", None)
        self._wake_after = wake_after if wake_after is not None else self.env.timeout

    def _observed(self, exc: BaseException) -> None:
        self.unobserved = [(n, e) for (n, e) in self.unobserved if e is not exc]

    def now(self) -> float:
        return float(self.env.now)

    async def sleep(self, seconds: float) -> None:
        await _Yield(self._wake_after(max(0.0, seconds)))

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
    def _event_of(w: Waitable) -> Event:
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
        await _Yield(AnyOf(self.env, [self._event_of(w) for w in waitables]))
        for i, w in enumerate(waitables):
            if self._is_done(w):
                return i, self._value_of(w)
        raise AssertionError("AnyOf fired with nothing done")  # pragma: no cover

    async def timeout(self, seconds: float, coro: Coroutine[Any, Any, T]) -> T:
        task = _SimTask(self, coro, "timeout")
        deadline = self._wake_after(max(0.0, seconds))
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
