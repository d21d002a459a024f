"""The simulated clock: the Clock port on a simpy ``Environment``.

Theory of operation
-------------------
A coroutine awaits a simpy event of the clock's own (an awaitable whose ``__await__``
yields the event, :class:`_Awaitable`): it is suspended until that event fires, and
``await`` chains pass the yield through to the outermost coroutine.  Each spawned task
(:class:`_Task`) is itself the simpy event that fires when it has finished, and drives
its coroutine as simpy's ``Process`` drives a generator: resumed by the event it waits
on, in the same queue entries (an urgent start entry when spawned, its own event when it
ends).  It records the outcome, so a failing or cancelled task never crashes the
simulation; a failure nobody retrieved is kept in :attr:`SimClock.unobserved` for the
runner to report.  (On a plain simpy ``Environment``, which tests use for comparisons, a
task is a simpy ``Process`` running ``_SimTask._drive`` and every wait goes through
``_Yield``: the same order, checked by tests/test_sim_clock_wake.py.)

Cancellation is an urgent entry, as simpy's ``Process.interrupt``, that throws
:data:`elastic.clock.Cancelled` (``asyncio.CancelledError``) into the coroutine where it
waits, so agent code sees the same exception type in both worlds and no simpy
``Interrupt`` (on a plain simpy environment ``_Yield`` turns the interrupt into it).
``first()`` and ``timeout()`` wait on an :class:`_AnyOf`, simpy's ``AnyOf`` without its
value.  A timeout is a race between the guarded task and a deadline; the loser is
cancelled and awaited, so its ``finally`` has run before :class:`TimeoutError` is raised
— as ``asyncio.timeout`` does.  A timeout on a one-shot's ``wait()`` (the store's waits
with a deadline) makes the same queue entries with one object, :class:`_TimedWait`,
standing for the task and the any-of.

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
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from heapq import heappop, heappush
from itertools import count
from typing import Any, Generic, TypeVar, cast

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, URGENT, AnyOf, Event, EventPriority, Process, Timeout
from simpy.exceptions import Interrupt

from elastic.clock import Cancelled, OneShot, Task, Waitable, note_unobserved

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


class _Awaitable:
    """An event of the clock's own environment that a coroutine awaits directly: no
    ``_Yield`` per wait, since there a cancellation is thrown into the coroutine as
    :data:`Cancelled` already (:class:`_Task`); on a plain simpy environment every wait
    goes through ``_Yield``."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self)


class _OwnEvent(_Awaitable):
    """A OneShot's event on the clock's own environment: no simpy event (:class:`_Env`
    and the clock's own waits read only ``callbacks``, ``ok``, ``value`` and
    ``defused``, plain attributes here, where a simpy event has properties), so its
    construction, ``succeed`` and every read of its outcome are cheaper (about 55 per
    node per simulated day at 2,048 nodes: the store's waits, the agents' wake-ups).
    It never fails: a one-shot is set with a value, not failed."""

    __slots__ = ("_env", "callbacks", "triggered", "value")
    ok = True
    defused = False

    def __init__(self, env: _Env) -> None:
        self._env = env
        self.callbacks: list[Callable[[Any], None]] | None = []
        self.triggered = False
        self.value: Any = None

    def succeed(self, value: Any = None) -> None:
        """Fire: scheduled now (NORMAL), as simpy's ``Event.succeed``."""
        self.triggered = True
        self.value = value
        self._env.schedule(self)


@types.coroutine
def _waiting_for(ev: _OwnEvent) -> Generator[_OwnEvent, Any, Any]:
    """A coroutine that waits for ``ev`` (one generator: no coroutine frame of its own
    around the wait); on the clock's own environment only, as :class:`_Awaitable`."""
    return (yield ev)


#: the code of a one-shot's wait (what timeout() recognises, see _TimedWait)
_WAITING_FOR = _waiting_for.__code__


class _Outcome(enum.Enum):
    RUNNING = 0
    RETURNED = 1
    FAILED = 2
    CANCELLED = 3


#: the outcomes as module constants: an Enum member read from its class is a descriptor
#: call in Python 3.11 (~50 ns; these are read at every task's end and every first())
_O_RUNNING = _Outcome.RUNNING
_O_RETURNED = _Outcome.RETURNED
_O_FAILED = _Outcome.FAILED
_O_CANCELLED = _Outcome.CANCELLED


class _Outcomes(Generic[T]):
    """How a task ended, as both task classes keep it (``done``/``result``)."""

    __slots__ = ()
    _clock: SimClock
    _exc: BaseException | None
    _outcome: _Outcome
    _result: T | None
    name: str

    def done(self) -> bool:
        return self._outcome is not _O_RUNNING

    def result(self) -> T:
        if self._outcome is _O_RETURNED:
            return self._result  # type: ignore[return-value]
        if self._outcome is _O_CANCELLED:
            raise Cancelled()
        if self._outcome is _O_FAILED:
            assert self._exc is not None
            self._clock._observed(self._exc)
            raise self._exc
        raise RuntimeError(f"task {self.name!r} has not finished")


class _SimTask(_Outcomes[T], Task[T]):
    __slots__ = ("_clock", "_exc", "_outcome", "_proc", "_result", "name")

    def __init__(self, clock: SimClock, coro: Coroutine[Any, Any, T], name: str) -> None:
        self._clock = clock
        self.name = name
        self._outcome = _O_RUNNING
        self._result: T | None = None
        self._exc: BaseException | None = None
        self._proc = Process(clock.senv, self._drive(coro))  # type: ignore[arg-type]

    async def _drive(self, coro: Coroutine[Any, Any, T]) -> None:
        try:
            self._result = await coro
            self._outcome = _O_RETURNED
        except Cancelled:
            self._outcome = _O_CANCELLED
        except Exception as e:
            self._exc = e
            self._outcome = _O_FAILED
            note_unobserved(self._clock, self.name, e)

    def cancel(self) -> None:
        if not self._proc.is_alive:
            return
        if self._proc is self._clock.env.active_process:
            raise RuntimeError(f"task {self.name!r} cannot cancel itself in the simulator")
        self._proc.interrupt(_CANCEL)

    async def join(self) -> T:
        if not self.done():
            await _Yield(self._proc)
        return self.result()


class _Kick:
    """A queue entry of the clock's own environment that runs one call, as the simpy
    event it stands for would run its one callback: a task's start (simpy's
    ``Initialize``) and its cancellation (simpy's ``Interruption``), both urgent.  It is
    no simpy event: :class:`_Env` reads only the names below, which simpy's events have
    too (a successful event, nobody's to defuse)."""

    __slots__ = ("callbacks",)
    ok = True
    defused = False
    value = None

    def __init__(self, call: Callable[[Any], None]) -> None:
        self.callbacks: list[Callable[[Any], None]] | None = [call]


class _Task(_Awaitable, _Outcomes[T], Task[T]):
    """A task on the clock's own environment: the event that fires when the task has
    finished, driving the coroutine itself.

    It does what a simpy ``Process`` running ``_SimTask._drive`` did, step for step and
    in the same queue entries (a start entry, urgent, when it is spawned; its own event,
    scheduled when the coroutine ends; an urgent entry per cancellation), so the run's
    order is the same (tests/test_sim_clock_wake.py runs random programs on both).  What
    it saves per task: the ``Process``, its ``Initialize`` event and the ``_drive``
    coroutine, a frame that every resume of the task passed through; per cancellation,
    simpy's ``Interrupt`` and its conversion into :data:`Cancelled`, which is thrown
    into the coroutine directly.  It is no simpy event either (none of simpy's code sees
    it: :class:`_Env` and the clock's own waits read what is below), which saves a
    simpy event's construction, ``succeed`` and ``ok`` property per task."""

    # as an event: successful unless the coroutine raised a BaseException (the run
    # crashes then, as with a Process); its value is None (the result is the task's)
    ok = True
    value: Any = None
    defused = False

    def __init__(self, clock: SimClock, coro: Coroutine[Any, Any, T], name: str) -> None:
        self.callbacks: list[Callable[[Any], None]] | None = []
        self._clock = clock
        self.name = name
        self._coro: Coroutine[Any, Any, T] | None = coro
        self._outcome = _O_RUNNING
        self._result: T | None = None
        self._exc: BaseException | None = None
        # the callback that resumes the task, one bound method for all its waits (so
        # removing it from a cancelled wait is an identity test); dropped at the end
        self._resume_cb: Callable[[Any], None] | None = self._advance
        # the event the task waits on
        self._waiting: Any = _Kick(self._resume_cb)
        clock.env.schedule(self._waiting, URGENT)  # type: ignore[arg-type]

    def _advance(self, event: Any) -> None:
        """Resume the coroutine with ``event``'s outcome and run it to its next wait (as
        simpy's ``Process`` does), or record how it ended."""
        coro = self._coro
        assert coro is not None
        while True:
            try:
                if type(event) is _Wake:
                    # Performance: most resumes are a sleep's (a store round trip's
                    # latency); a wake-up never fails and carries no value
                    event = coro.send(None)
                elif event.ok:
                    event = coro.send(event.value)
                elif type(event) is _Cancelling:
                    event = coro.throw(Cancelled())
                else:
                    # as a Process: the failure is the task's now, and it gets a copy
                    event.defused = True
                    failure = event.value
                    exc = type(failure)(*failure.args)
                    exc.__cause__ = failure
                    event = coro.throw(exc)
            except StopIteration as stop:
                self._result = stop.value
                self._outcome = _O_RETURNED
            except Cancelled:
                self._outcome = _O_CANCELLED
            except Exception as e:
                self._exc = e
                self._outcome = _O_FAILED
                note_unobserved(self._clock, self.name, e)
            except BaseException as e:
                self._coro = self._resume_cb = None
                # the task's event fails: that crashes the run, as a Process's
                self.ok = False
                self.value = e
                self._clock.env.schedule(self)  # type: ignore[arg-type]
                return
            else:
                callbacks = event.callbacks
                if callbacks is None:
                    continue  # already processed: its outcome goes straight back in
                callbacks.append(self._resume_cb)
                self._waiting = event
                return
            self._coro = self._resume_cb = self._waiting = None
            self._clock.env.schedule(self)  # type: ignore[arg-type]  # the task's event
            return

    def _interrupted(self, _kick: Any) -> None:
        if self._coro is None:
            return  # it ended before the cancellation came up (as an Interruption)
        self._waiting.callbacks.remove(self._resume_cb)
        self._advance(_CANCELLING)

    def cancel(self) -> None:
        coro: Any = self._coro
        if coro is None:
            return
        # the task's coroutine is running (a coroutine awaiting another that runs is
        # running too): the task itself asks
        if coro.cr_running if type(coro) is types.CoroutineType else coro.gi_running:
            raise RuntimeError(f"task {self.name!r} cannot cancel itself in the simulator")
        self._clock.env.schedule(_Kick(self._interrupted), URGENT)  # type: ignore[arg-type]

    async def join(self) -> T:
        if self._outcome is _O_RUNNING:
            await self
        return self.result()


class _Cancelling:
    """What a cancelled task's coroutine is resumed with: :data:`Cancelled` thrown in."""

    __slots__ = ()
    ok = False


_CANCELLING = _Cancelling()


class _SimOneShot(OneShot):
    __slots__ = ("_ev",)

    def __init__(self, env: simpy.Environment) -> None:
        own = type(env) is _Env  # type: ignore[comparison-overlap]
        # Performance: no cast() call (a function call; a one-shot per store wait)
        self._ev: _OwnEvent | Event = _OwnEvent(env) if own else Event(env)  # type: ignore[arg-type]

    def set(self, value: Any = None) -> None:
        if not self._ev.triggered:
            self._ev.succeed(value)

    def is_set(self) -> bool:
        return bool(self._ev.triggered)

    def wait(self) -> Coroutine[Any, Any, Any]:
        # Performance: the store's waits for a key or a revision run through here; on
        # the clock's own environment the wait is one generator, not a coroutine
        # awaiting one (both can be awaited, spawned and passed to timeout())
        ev = self._ev
        if isinstance(ev, _Awaitable):
            return _waiting_for(ev)
        return self._wait_yield(ev)

    @staticmethod
    async def _wait_yield(ev: Event) -> Any:
        return await _Yield(ev)


def _subscribe(waiter: Callable[[Any], None], events: tuple[Any, ...]) -> None:
    """An any-of's start: ``waiter`` is called with each event that has fired already and
    becomes a callback of the others (the object itself, so removal is an identity test)."""
    for event in events:
        if event.callbacks is None:
            waiter(event)
        else:
            event.callbacks.append(waiter)


def _unsubscribe(waiter: Callable[[Any], None], events: tuple[Any, ...]) -> None:
    """An any-of is processed: out of the callbacks of the events still pending."""
    for event in events:
        callbacks = event.callbacks
        if callbacks:
            try:  # noqa: SIM105  (one scan of the list, no context manager)
                callbacks.remove(waiter)
            except ValueError:
                pass


class _AnyOf(_Awaitable, Event):
    """simpy's ``AnyOf`` as ``first()`` and ``timeout()`` use it, cheaper: the same
    callbacks in the same places and the same one event scheduled when the first of
    ``events`` fires (so the run's order is unchanged), without a ``ConditionValue`` that
    nobody reads.  As simpy's condition: it fails if the event that fires failed, and
    once it is processed it takes itself out of the other events' callbacks (on a
    cancelled wait that happens when one of them fires)."""

    def __init__(self, env: simpy.Environment, events: tuple[Event, ...]) -> None:
        super().__init__(env)
        self.events = events
        _subscribe(self, events)
        self.callbacks.append(self._remove)

    def __call__(self, event: Event) -> None:
        if self.triggered:
            return
        if not event.ok:
            event.defused = True
            self.fail(cast(Exception, event.value))
        else:
            self.succeed()

    def _remove(self, _ev: Event) -> None:
        _unsubscribe(self, self.events)


class _Race(_Awaitable):
    """:class:`_AnyOf` on the clock's own environment, where an event need not be simpy's
    (:class:`_Env` reads ``callbacks``, ``ok``, ``value`` and ``defused``): the same
    callbacks in the same places and the same entry scheduled at the same moment, without
    a simpy event's construction, ``succeed`` and ``ok`` property (one ``first()`` per
    node restart, in the agent's wait for its group, a membership change or a health
    verdict)."""

    __slots__ = ("_env", "_triggered", "callbacks", "defused", "events", "ok", "value")

    def __init__(self, env: _Env, events: tuple[Any, ...]) -> None:
        self._env = env
        self.events = events
        self.ok = True
        self.value: Any = None
        self.defused = False
        self._triggered = False
        self.callbacks: list[Callable[[Any], None]] | None = []
        _subscribe(self, events)
        self.callbacks.append(self._remove)

    def __call__(self, event: Any) -> None:
        if self._triggered:
            return
        self._triggered = True
        if not event.ok:
            event.defused = True
            self.ok = False
            self.value = event.value
        self._env.schedule(self)

    def _remove(self, _ev: Any) -> None:
        _unsubscribe(self, self.events)


class _Ended:
    """The end of a :class:`_TimedWait`'s wait for its event, standing for the task that
    ``timeout()`` would spawn to wait for it: scheduled (NORMAL) when that task would
    have ended, and awaited by the waiter when the task would have been."""

    __slots__ = ("callbacks",)
    ok = True
    defused = False
    value = None

    def __init__(self, first: Callable[[Any], None]) -> None:
        self.callbacks: list[Callable[[Any], None]] | None = [first]

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self)


class _TimedWait:
    """``timeout(seconds, one_shot.wait())`` on the clock's own environment, without the
    task and the :class:`_AnyOf` it costs in general (the store's waits for a key or a
    revision with a deadline: about one per node restart).

    It makes the same queue entries at the same moments as the general path, so the
    run's order is the same (tests/test_sim_clock_wake.py): the task's urgent start
    (which puts the wait into the event's callbacks), its end (:class:`_Ended`,
    scheduled when the event fires or the wait is cancelled, through an urgent entry),
    and this object, the any-of, scheduled when the first of the end and the deadline
    comes.  What it saves: the task, its coroutine and its resumes, the any-of's simpy
    event and the condition's bookkeeping."""

    __slots__ = (
        "_deadline",
        "_end",
        "_env",
        "_ev",
        "_outcome",
        "_result",
        "_triggered",
        "callbacks",
    )
    ok = True
    defused = False
    value = None

    def __init__(self, env: _Env, ev: _OwnEvent, seconds: float) -> None:
        self._env = env
        self._ev = ev
        self._outcome = _O_RUNNING  # the stand-in task's
        self._result: Any = None
        self._triggered = False  # the any-of's
        # the task's start, then the deadline, then the any-of in both (as _AnyOf)
        env.schedule(_Kick(self._start), URGENT)
        self._end = _Ended(self)
        self._deadline = deadline = env.wake_after(seconds if seconds > 0 else 0.0)
        deadline.callbacks.append(self)
        self.callbacks: list[Callable[[Any], None]] | None = [self._fired]

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self)

    # the stand-in task
    def _start(self, _kick: Any) -> None:
        callbacks = self._ev.callbacks
        if callbacks is None:  # fired and processed already: the task ends at once
            self._finish(_O_RETURNED, self._ev.value)
        else:
            callbacks.append(self._got)

    def _got(self, ev: Event) -> None:
        self._finish(_O_RETURNED, ev.value)

    def _finish(self, outcome: _Outcome, result: Any) -> None:
        self._outcome = outcome
        self._result = result
        self._env.schedule(self._end)

    def cancel(self) -> None:
        """Cancel the stand-in task (nothing if it has ended), as _Task.cancel."""
        if self._outcome is _O_RUNNING:
            self._env.schedule(_Kick(self._interrupted), URGENT)

    def _interrupted(self, _kick: Any) -> None:
        if self._outcome is not _O_RUNNING:
            return
        callbacks = self._ev.callbacks
        assert callbacks is not None  # the stand-in task is running: the event is pending
        callbacks.remove(self._got)
        self._finish(_O_CANCELLED, None)

    # the any-of
    def __call__(self, _event: Any) -> None:
        """The end or the deadline came: the any-of fires, once (as _AnyOf)."""
        if not self._triggered:
            self._triggered = True
            self._env.schedule(self)

    def _fired(self, _self: Any) -> None:
        """The any-of is processed: out of the other's callbacks (as _AnyOf._remove)."""
        for callbacks in (self._end.callbacks, self._deadline.callbacks):
            if callbacks:
                try:  # noqa: SIM105  (one scan of the list, no context manager)
                    callbacks.remove(self)
                except ValueError:
                    pass


#: the priority of observers' entries (after every event of the run at their instant)
_ASIDE = EventPriority(2)


class _Wake(_Awaitable, Timeout):
    """One wake-up shared by every sleep that ends at the same time (one Timeout each
    before): a Timeout whose callbacks are the sleepers' and are run one by one (see
    :class:`_Env`)."""

    __slots__ = ()

    def __init__(self, env: _Env, delay: float) -> None:
        super().__init__(_simpy(env), delay)
        # a deque: the sleepers are resumed from its front while it is still the event's
        # callbacks, so a sleeper cancelled by an earlier one is removed from it (as from
        # its own pending Timeout) and not resumed
        self.callbacks = deque()  # type: ignore[assignment]


class _Calls(list[Callable[[], None]]):
    """A queue entry that is no event of the run: calls made when it comes up (progress
    ticks, the end of ``run(until=<time>)``)."""

    __slots__ = ()


#: what the clock's own environment queues: simpy's events and the clock's own, which
#: have what it reads of an event (``callbacks``, ``ok``, ``value``, ``defused``)
_Queued = Event | _OwnEvent | _Kick | _Ended | _TimedWait | _Race | _Task[Any]


def _stop() -> None:
    raise StopSimulation(None)


def _simpy(env: _Env) -> simpy.Environment:
    """``env`` where simpy's types want its ``Environment`` (see :class:`_Env`'s contract)."""
    return cast(simpy.Environment, env)


class _Env:
    """A simpy environment of our own that schedules the events due at the same instant
    together.

    simpy's events and processes are written against an environment's *contract*, not
    its class (simpy 4.1 has no public base class for environments): an event calls
    ``env.schedule(event, priority, delay)`` when it is triggered; a ``Process`` reads
    ``env.active_process`` (an ``Interruption`` refuses a process interrupting itself),
    and around each step of its generator sets and clears the environment's
    ``_active_proc``, which ``active_process`` returns (simpy 4.1's process code).  This
    class meets that contract with its own queue, counter and time (``now``, a plain float
    attribute), and reads events only through their public API (``callbacks``, ``ok``,
    ``value``, ``defused``): it never touches simpy's private attributes
    (tests/test_no_simpy_privates.py).

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
    simpy's own queue; ``events()`` counts queue entries (event ids).

    Sleeps go one step further (module docstring, "Shared wake-ups"): a sleep to ``T``
    joins the last event of the batch for ``T`` when that is a wake-up, instead of adding
    a Timeout of its own.

    Performance: ``schedule`` and ``step`` run for every event of the run; each is one
    dict operation more than simpy's (measured in bench/results/events.md).
    """

    def __init__(self) -> None:
        # a float from the start: SimClock.now returns it as it is
        self.now = 0.0
        # simpy's contract: a Process sets it while it runs (see the class docstring)
        self._active_proc: Process | None = None
        # the queue: (time, priority, id, batch of events, or _Calls)
        self._entries: list[tuple[float, int, int, list[Any]]] = []
        self._ids = count()
        # (time, priority) -> the batch of its pending queue entry, open for joining
        self._open: dict[tuple[float, int], list[_Queued]] = {}
        # Performance: the same for NORMAL, the priority of nearly every event (no tuple
        # made and hashed per schedule and per sleep)
        self._open_normal: dict[float, list[Any]] = {}
        # The urgent entries due now (a task's start, a cancellation), in order, outside
        # the heap: they all come before any other entry (an urgent one is scheduled
        # only with no delay, so at the current instant, after every urgent entry of the
        # heap at that instant has run, see step()), and "is one pending?", asked after
        # every event and every sleeper resumed, is a truth test, not a look at the heap
        self._urgent: deque[list[Any]] = deque()
        self._urgent_open: list[Any] | None = None  # the last of them, open for joining
        self.aside = 0  # queue entries that are not the run's own (progress ticks, stops)

    @property
    def active_process(self) -> Process | None:
        """The process whose generator is running (simpy's ``Environment`` API)."""
        return self._active_proc

    # simpy's Environment API, as far as the simulator uses it

    def timeout(self, delay: float = 0, value: Any = None) -> Timeout:
        return Timeout(_simpy(self), delay, value)

    def event(self) -> Event:
        return Event(_simpy(self))

    def any_of(self, events: Iterable[Event]) -> AnyOf:
        return AnyOf(_simpy(self), events)

    def peek(self) -> float:
        """The time of the next queue entry (infinity if there is none)."""
        if self._urgent:
            return self.now
        return self._entries[0][0] if self._entries else float("inf")

    def run(self, until: float | Event | _Task[Any] | _Race | None = None) -> Any:
        """Step until ``until`` — a time: every event before it, and the urgent ones at it
        scheduled before this call, as simpy does; an event: until it has been processed,
        returning its value — or until nothing is left to do."""
        if isinstance(until, (Event, _Task, _Race)):
            if until.callbacks is None:
                return until.value
            until.callbacks.append(StopSimulation.callback)
        elif until is not None:
            at = float(until)
            if at <= self.now:
                raise ValueError(f"until ({at}) must be greater than the current simulation time")
            self._push_calls(at, URGENT, _stop)
        step = self.step
        try:
            while True:
                step()
        except StopSimulation as stop:
            return stop.args[0]
        except EmptySchedule:
            if until is not None:
                raise RuntimeError(
                    f'No scheduled events left but "until" event was not triggered: {until}'
                ) from None
        return None

    def schedule(self, event: _Queued, priority: EventPriority = NORMAL, delay: float = 0) -> None:
        if priority == NORMAL:
            t = self.now + delay
            batch = self._open_normal.get(t)
            if batch is not None:
                batch.append(event)
                return
            batch = self._open_normal[t] = [event]
            heappush(self._entries, (t, NORMAL, next(self._ids), batch))
            return
        if priority == URGENT and not delay:
            batch = self._urgent_open
            if batch is not None:
                batch.append(event)
                return
            self._urgent_open = batch = [event]
            self._urgent.append(batch)
            next(self._ids)  # an entry of the queue all the same (events())
            return
        t = self.now + delay
        key = (t, priority)
        batch = self._open.get(key)
        if batch is not None:
            batch.append(event)
            return
        batch = self._open[key] = [event]
        heappush(self._entries, (t, priority, next(self._ids), batch))

    def _push_calls(self, t: float, priority: int, fn: Callable[[], None]) -> None:
        self.aside += 1
        heappush(self._entries, (t, priority, next(self._ids), _Calls([fn])))

    def schedule_aside(self, fn: Callable[[], None], delay: float) -> None:
        """Call ``fn()`` after every other event of its instant, in an entry of its own
        that ``events()`` does not count (for observers such as a progress bar)."""
        self._push_calls(self.now + delay, _ASIDE, fn)

    def events(self) -> int:
        """How many queue entries the run has scheduled (event ids, without aside)."""
        n = next(self._ids) - self.aside
        self.aside += 1  # the id this call took is no event
        return n

    def wake_after(self, seconds: float) -> _Wake:
        """The event that fires ``seconds`` from now, shared with other sleeps to that time
        (a negative delay is none, as ``SimClock.after``)."""
        if not seconds > 0:
            seconds = 0.0
        batch = self._open_normal.get(self.now + seconds)
        if batch is not None:
            last = batch[-1]
            if type(last) is _Wake:
                return last
        return _Wake(self, seconds)

    def _stopped(self, now: float, prio: int, eid: int, rest: list[Event]) -> None:
        if rest:
            if prio == URGENT:
                self._urgent.appendleft(rest)  # still the first of the urgent entries
            else:
                heappush(self._entries, (now, prio, eid, rest))

    def step(self) -> None:
        urgent = self._urgent
        if urgent:
            # the heap holds no urgent entry for now: one scheduled with no delay is here,
            # and the heap's entries at this instant with a priority < NORMAL (the end of
            # run(until=<time>)) were ahead of anything that could have scheduled one
            batch = urgent.popleft()
            if batch is self._urgent_open:
                self._urgent_open = None
            self._run(self.now, URGENT, 0, batch)
            return
        try:
            now, prio, eid, batch = heappop(self._entries)
        except IndexError:
            raise EmptySchedule from None
        self.now = now
        if type(batch) is _Calls:
            for fn in batch:
                fn()
            return
        if prio == NORMAL:
            open_normal = self._open_normal
            if open_normal.get(now) is batch:
                del open_normal[now]
        else:
            open_ = self._open
            key = (now, prio)
            if open_.get(key) is batch:
                del open_[key]
        self._run(now, prio, eid, batch)

    def _run(self, now: float, prio: int, eid: int, batch: list[Any]) -> None:
        """Process the events of one queue entry, in order."""
        # what an event's callbacks schedule urgently runs before the next event of a
        # batch (before the next sleeper of a wake-up), as it would have run before that
        # event's own queue entry; a batch of urgent events is not interrupted (what its
        # events schedule urgently comes after the batch, as it would have in simpy's
        # order), nor one of priority < URGENT (none is made but when the run stops)
        urgent = self._urgent if prio > URGENT else ()
        for i, event in enumerate(batch):
            if i:
                while urgent:
                    self.step()
            if type(event) is _Wake:
                callbacks: deque[Any] = event.callbacks  # type: ignore[assignment]
                while callbacks:
                    try:
                        callbacks.popleft()(event)
                    except StopSimulation:
                        self._stopped(now, prio, eid, batch[i:] if callbacks else batch[i + 1 :])
                        raise
                    while urgent:
                        self.step()
                event.callbacks = None  # type: ignore[assignment]
                continue  # a wake-up never fails
            # Performance: a plain loop over an iterator (no index per callback: this runs
            # for every callback of the run); what is left of the iterator is the rest
            callbacks_left = iter(event.callbacks)
            event.callbacks = None
            try:
                for callback in callbacks_left:
                    callback(event)
            except StopSimulation:
                # as simpy: the event's remaining callbacks run first when the
                # simulation resumes (simpy schedules it again, with priority -1:
                # before anything else at this instant), then the rest of the batch
                event.callbacks = list(callbacks_left)
                self._stopped(now, prio, eid, batch[i + 1 :])
                self._urgent.appendleft([event])
                next(self._ids)
                raise
            if not event.ok and not event.defused:
                # The event failed and nobody defused it: crash the run, as simpy does.
                failure: BaseException = event.value
                exc = type(failure)(*failure.args)
                exc.__cause__ = failure
                raise exc


class SimClock:
    """The Clock port on a simpy Environment (simulated seconds)."""

    def __init__(self, env: simpy.Environment | None = None) -> None:
        # our own environment; a plain simpy one is for comparisons (tests)
        self.env: _Env | simpy.Environment = env if env is not None else _Env()
        # the same object, where simpy's constructors want an Environment
        self.senv = cast(simpy.Environment, self.env)
        self.unobserved: list[tuple[str, BaseException]] = []
        self.unobserved_dropped = 0
        # on the clock's own environment a task drives its coroutine itself; on simpy's
        # (comparisons in tests) it is a simpy Process
        self._own = type(self.env) is _Env
        self._task: type[_Task[Any]] | type[_SimTask[Any]] = _Task if self._own else _SimTask
        wake_after = getattr(self.env, "wake_after", None)
        self._wake_after = wake_after if wake_after is not None else self.env.timeout
        if self._own:
            # Performance: after() is the environment's wake_after itself, one call less
            # per store round trip (the method below is for simpy's environment)
            self.after = cast(_Env, self.env).wake_after  # type: ignore[method-assign]

    def call_after(self, seconds: float, fn: Callable[[Any], None]) -> None:
        """Call ``fn(event)`` ``seconds`` from now, where a Timeout scheduled now would run
        its callback: on the clock's own environment as a callback of the shared wake-up
        for that time (module docstring, "Shared wake-ups": the same place in the run's
        order, without a Timeout of its own), else of a simpy Timeout."""
        env = self.env
        if type(env) is _Env:
            env.wake_after(seconds).callbacks.append(fn)
        else:
            env.timeout(max(0.0, seconds)).callbacks.append(fn)

    def run_first(self, *events: Any) -> None:
        """Run until the first of ``events`` (:meth:`event_of`'s, or simpy events of this
        clock) has been processed (the simulator's end: its job finished or its deadline),
        as ``env.run(until=AnyOf(...))`` — on the clock's own environment without a simpy
        condition, so a one-shot need not be a simpy event (:class:`_OwnEvent`)."""
        env = self.env
        if type(env) is _Env:
            env.run(until=_Race(env, events))
        else:
            env.run(until=AnyOf(self.senv, events))

    def every(self, period: float, fn: Callable[[float], None]) -> None:
        """Call ``fn(now)`` every ``period`` simulated seconds, after every event of the run
        at that instant, without changing the run's order of events or ``events()``."""
        env = self.env
        if not isinstance(env, _Env):
            raise TypeError("every() needs the SimClock's own environment")

        def tick() -> None:
            fn(self.now())
            env.schedule_aside(tick, period)

        env.schedule_aside(tick, period)

    def events(self) -> int:
        """How many events the run has scheduled (queue entries; see :class:`_Env`)."""
        env = self.env
        if not isinstance(env, _Env):
            raise TypeError("events() needs the SimClock's own environment")
        return env.events()

    def _observed(self, exc: BaseException) -> None:
        self.unobserved = [(n, e) for (n, e) in self.unobserved if e is not exc]

    def now(self) -> float:
        env = self.env
        # Performance: called a few times per store operation of every agent; on the
        # clock's own environment the time is already a float (see _Env.__init__)
        return env.now if type(env) is _Env else float(env.now)

    async def sleep(self, seconds: float) -> None:
        await self.after(seconds)

    def after(self, seconds: float) -> Awaitable[None]:
        """``await clock.after(s)`` is ``await clock.sleep(s)`` for the simulator's own hot
        paths (a store round trip): the wait is scheduled when ``after`` is called, and no
        coroutine is made per wait."""
        env = self.env
        if type(env) is _Env:  # Performance: no cast() call (a store round trip each)
            return env.wake_after(seconds if seconds > 0 else 0.0)
        return _Yield(self._wake_after(max(0.0, seconds)))

    def spawn(self, coro: Coroutine[Any, Any, T], name: str = "") -> Task[T]:
        return self._task(self, coro, name)

    def event(self) -> OneShot:
        return _SimOneShot(self.senv)

    def wrap(self, ev: Event) -> OneShot:
        """A OneShot view of a raw simpy event (for the simulator's own models)."""
        one = _SimOneShot.__new__(_SimOneShot)
        one._ev = ev
        return one

    @staticmethod
    def event_of(w: Waitable) -> Any:
        """The event that fires when ``w`` (a task or event of this clock) does: for
        ``env.run(until=...)`` and the simulator's own models (a simpy event but for a
        task on the clock's own environment, which is an event of the clock's own)."""
        # Performance: exact types first (isinstance of a Protocol's subclass goes through
        # typing's slow check, and first() asks this of every waitable)
        if type(w) is _Task:
            return w
        if type(w) is _SimOneShot:
            return w._ev
        if isinstance(w, _Task):
            return w
        if isinstance(w, _SimTask):
            return w._proc
        if isinstance(w, _SimOneShot):
            return w._ev
        raise TypeError(f"first() takes tasks and events of this clock, got {w!r}")

    @staticmethod
    def _value_of(w: Waitable) -> Any:
        if type(w) is _SimOneShot:  # Performance: see event_of
            return w._ev.value
        if isinstance(w, (_Task, _SimTask)):
            return w.result()
        assert isinstance(w, _SimOneShot)
        return w._ev.value

    @staticmethod
    def _is_done(w: Waitable) -> bool:
        if type(w) is _Task:  # Performance: first() asks this of every waitable
            return w._outcome is not _O_RUNNING
        if type(w) is _SimOneShot:
            return w.is_set()
        if isinstance(w, (_Task, _SimTask)):
            return w.done()
        assert isinstance(w, _SimOneShot)
        return w.is_set()

    async def first(self, *waitables: Waitable) -> tuple[int, Any]:
        if not waitables:
            raise ValueError("first() needs at least one task or event")
        for i, w in enumerate(waitables):  # lowest index wins ties
            if self._is_done(w):
                return i, self._value_of(w)
        events = tuple(map(self.event_of, waitables))
        if self._own:
            await _Race(self.env, events)  # type: ignore[arg-type]  # no cast() call
        else:
            await _Yield(_AnyOf(self.senv, events))
        for i, w in enumerate(waitables):
            if self._is_done(w):
                return i, self._value_of(w)
        raise AssertionError("AnyOf fired with nothing done")  # pragma: no cover

    async def timeout(self, seconds: float, coro: Coroutine[Any, Any, T]) -> T:
        gen: Any = coro  # a one-shot's wait is a generator (see _SimOneShot.wait)
        if (
            self._own
            and type(gen) is types.GeneratorType
            and gen.gi_code is _WAITING_FOR
            and (frame := gen.gi_frame) is not None
            and type(one := frame.f_locals["ev"]) is _OwnEvent
        ):
            # Performance: a one-shot's wait (the store's waits with a deadline), in the
            # same queue entries as below with fewer objects (see _TimedWait)
            coro.close()
            wait = _TimedWait(self.env, one, seconds)  # type: ignore[arg-type]
            try:
                await wait
            except Cancelled:
                wait.cancel()
                raise
            if wait._outcome is _O_RETURNED:
                return wait._result  # type: ignore[no-any-return]
            wait.cancel()
            await wait._end
            # fired in the same instant (the await changed the outcome)
            if wait._outcome is _O_RETURNED:
                return wait._result  # type: ignore[no-any-return]
            raise TimeoutError(f"timed out after {seconds:g}s")
        task: _Task[T] | _SimTask[T] = self._task(self, coro, "timeout")
        ev = self.event_of(task)
        deadline = self._wake_after(max(0.0, seconds))
        try:
            if self._own:
                await _Race(self.env, (ev, deadline))  # type: ignore[arg-type]
            else:
                await _Yield(_AnyOf(self.senv, (ev, deadline)))
        except Cancelled:
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        await (ev if self._own else _Yield(ev))
        if task._outcome is _O_RETURNED:  # finished in the same instant
            return task.result()
        if task._outcome is _O_FAILED:
            return task.result()
        raise TimeoutError(f"timed out after {seconds:g}s")
