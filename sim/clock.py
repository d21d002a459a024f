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
the guarded task and a deadline; the loser is cancelled and awaited, so its ``finally``
has run before :class:`TimeoutError` is raised — as ``asyncio.timeout`` does.

Shared wake-ups
---------------
Every sleep (and every ``timeout``'s deadline) that ends at the same simulated time ``T``
shares one scheduled event, a :class:`_Wake`, instead of a simpy ``Timeout`` each: when
2,048 agents read the store in the same instant, their 2,048 latency sleeps cost one
event.  The order in which the sleepers resume is exactly the order of their own
timeouts, because (see :class:`_Env`):

* a sleep joins the wake-up for ``T`` only if it is the last event scheduled at ``T``
  (with a Timeout's priority): had another event been scheduled at ``T`` after it, the
  sleep would resume before that event instead of after it, so it opens a new wake-up;
* when the wake-up fires, its sleepers resume one by one, and any urgent event one of
  them scheduled (a task's start, a cancellation) is processed before the next sleeper
  resumes, as simpy would have processed it before the next sleeper's own timeout.

:class:`_Env` applies the same idea to every event: the events due at the same time and
priority share one entry of simpy's queue.

A run's event log is therefore byte-identical with and without sharing (checked over
every scenario, tests/test_sim_clock_wake.py checks random programs against one Timeout
per sleep); only simpy's queue entries and the time spent drop.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from heapq import heappop, heappush
from typing import Any, Generic, TypeVar

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, AnyOf, Event, EventPriority, Process
from simpy.exceptions import Interrupt

from elastic.clock import Cancelled, OneShot, Task, Waitable

__all__ = ["SimClock", "SimTaskError"]

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


#: the priority of observers' events (after every event of the run at their instant)
_ASIDE = EventPriority(2)


class _Wake(Event):
    """One wake-up shared by every sleep that ends at the same time (one Timeout each
    before): its callbacks are the sleepers' and are run one by one (see :class:`_Env`)."""

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
    """simpy's Environment, scheduling the events due at the same instant together.

    simpy orders its queue by (time, priority, event id): events with the same time and
    priority run in the order they were scheduled.  This environment keeps one queue
    entry per (time, priority) instead of one per event: an event scheduled while an
    entry for its (time, priority) is pending joins that entry's batch, and a batch runs
    its events in the order they joined, which is their simpy order.  Nothing else can
    come between two events of a batch except an event of a *higher* priority (lower
    number: a task's start, a cancellation) scheduled at the same time by the earlier
    one's callbacks; those run before the batch goes on, exactly where simpy would have
    run them.  An event scheduled at the batch's time and priority while the batch runs
    starts a new entry, after it, as it would have come after every event of the batch.
    The order of everything a run does — its event log — is therefore the same as with
    simpy's own queue; ``events()`` counts queue entries (simpy's event ids).

    Sleeps go one step further (module docstring, "Shared wake-ups"): a sleep to ``T``
    joins the last event of the batch for ``T`` when that is a wake-up, instead of adding
    a Timeout of its own.

    Performance: ``schedule`` and ``step`` run for every event of the run; each is one
    dict operation more than simpy's (measured in bench/results/events.md).
    """

    def __init__(self) -> None:
        super().__init__(0.0)  # a float from the start: SimClock.now returns it as it is
        # (time, priority) -> the batch of its pending queue entry, open for joining
        self._open: dict[tuple[float, int], list[Event]] = {}
        self.aside = 0  # queue entries that are not the run's own (progress ticks)
        # simpy's queue, whose entries here carry batches where simpy's carry events
        self._entries: list[tuple[float, int, int, list[Event]]] = self._queue  # type: ignore[assignment]

    def schedule(self, event: Event, priority: EventPriority = NORMAL, delay: float = 0) -> None:
        t = self._now + delay
        key = (t, priority)
        batch = self._open.get(key)
        if batch is not None:
            batch.append(event)
            return
        batch = self._open[key] = [event]
        heappush(self._entries, (t, priority, next(self._eid), batch))

    def schedule_aside(self, event: Event, delay: float) -> None:
        """Schedule ``event`` after every other event of its instant, in an entry of its own
        that ``events()`` does not count (for observers such as a progress bar)."""
        self.aside += 1
        heappush(self._entries, (self._now + delay, _ASIDE, next(self._eid), [event]))

    def events(self) -> int:
        """How many queue entries the run has scheduled (simpy's event ids, without aside)."""
        n = next(self._eid) - self.aside
        self.aside += 1  # the id this call took is no event
        return n

    def wake_after(self, delay: float) -> Event:
        """The event that fires ``delay`` from now, shared with other sleeps to that time."""
        batch = self._open.get((self._now + delay, NORMAL))
        if batch is not None:
            last = batch[-1]
            if type(last) is _Wake:
                return last
        return _Wake(self, delay)

    def _stopped(self, now: float, prio: int, eid: int, rest: list[Event]) -> None:
        if rest:
            heappush(self._entries, (now, prio, eid, rest))

    def step(self) -> None:
        queue = self._entries
        try:
            now, prio, eid, batch = heappop(queue)
        except IndexError:
            raise EmptySchedule from None
        self._now = now
        open_ = self._open
        key = (now, prio)
        if open_.get(key) is batch:
            del open_[key]
        for i, event in enumerate(batch):
            if i:
                # what the previous event's callbacks scheduled at a higher priority runs
                # first, as it would have run before this event's own queue entry
                while queue and queue[0][1] < prio and queue[0][0] == now:
                    self.step()
            if type(event) is _Wake:
                callbacks: deque[Any] = event.callbacks  # type: ignore[assignment]
                while callbacks:
                    try:
                        callbacks.popleft()(event)
                    except StopSimulation:
                        self._stopped(now, prio, eid, batch[i:] if callbacks else batch[i + 1 :])
                        raise
                    while queue and queue[0][1] < prio and queue[0][0] == now:
                        self.step()
                event.callbacks = None  # type: ignore[assignment]
            else:
                cbs, event.callbacks = event.callbacks, None  # type: ignore[assignment]
                for j, callback in enumerate(cbs):
                    try:
                        callback(event)
                    except StopSimulation:
                        # as simpy: the event's remaining callbacks run first when the
                        # simulation resumes, then the rest of the batch
                        event.callbacks = cbs[j + 1 :]
                        self.schedule(event, EventPriority(-1))
                        self._stopped(now, prio, eid, batch[i + 1 :])
                        raise
            if not event._ok and not hasattr(event, "_defused"):
                # The event failed and nobody defused it: crash the run, as simpy does.
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc


class SimClock:
    """The Clock port on a simpy Environment (simulated seconds)."""

    def __init__(self, env: simpy.Environment | None = None) -> None:
        self.env = env if env is not None else _Env()
        self.unobserved: list[tuple[str, BaseException]] = []
        wake_after = getattr(self.env, "wake_after", None)
        self._wake_after = wake_after if wake_after is not None else self.env.timeout

    def every(self, period: float, fn: Callable[[float], None]) -> None:
        """Call ``fn(now)`` every ``period`` simulated seconds, after every event of the run
        at that instant, without changing the run's order of events or ``events()``."""
        env = self.env
        if not isinstance(env, _Env):
            raise TypeError("every() needs the SimClock's own environment")

        def tick(_: Event) -> None:
            fn(self.now())
            arm()

        def arm() -> None:
            ev = Event(env)
            ev.callbacks.append(tick)
            ev._ok, ev._value = True, None  # as a Timeout is made
            env.schedule_aside(ev, period)

        arm()

    def events(self) -> int:
        """How many events the run has scheduled (queue entries; see :class:`_Env`)."""
        env = self.env
        return env.events() if isinstance(env, _Env) else next(env._eid)

    def _observed(self, exc: BaseException) -> None:
        self.unobserved = [(n, e) for (n, e) in self.unobserved if e is not exc]

    def now(self) -> float:
        env = self.env
        # Performance: called a few times per store operation of every agent; on the
        # clock's own environment the time is already a float (see _Env.__init__)
        return env._now if type(env) is _Env else float(env.now)

    async def sleep(self, seconds: float) -> None:
        await _Yield(self._wake_after(max(0.0, seconds)))

    def after(self, seconds: float) -> Awaitable[None]:
        """``await clock.after(s)`` is ``await clock.sleep(s)`` for the simulator's own hot
        paths (a store round trip): the wait is scheduled when ``after`` is called, and no
        coroutine is made per wait."""
        return _Yield(self._wake_after(max(0.0, seconds)))

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
