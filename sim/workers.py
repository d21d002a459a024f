"""Worker models: the workers port of the simulator, and the training job they run (its
arithmetic is :class:`sim.scenario.model.Job`'s).

Theory of operation
-------------------
Progress is computed from time, never simulated step by step: a 2-hour job costs a
handful of events.  The workers of one rendezvous round form a :class:`World` (a
collective).  The world starts training when all ``WORLD_SIZE`` workers have finished
their ``startup_time``; from then on it advances from the job's last completed
checkpoint at one step per ``step_time`` (times the slowest member node's slow-down
factor), spending ``checkpoint_time`` after every ``checkpoint_every`` steps.  One event
is scheduled: the moment the last step completes, when every member exits 0.

A world breaks when a member dies, hangs or is stopped: progress up to that moment is
kept only up to the last *completed* checkpoint, and the members that are still running
make no more progress and, unless their agent stops them first, fail
``collective_timeout`` later (NCCL's watchdog aborts them: exit code -6, SIGABRT).  A
world that never gathers all its members fails the same way, ``collective_timeout``
after its first member became ready.

Identity: workers get synthetic pids, unique within a run, so event logs are
deterministic.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

from simpy.events import Event

from elastic.clock import OneShot
from elastic.events import AgentEvent, EventSink
from elastic.workers import ExitCause, ExitList, GroupLaunch, WorkerExit, WorkerLaunch
from sim.clock import SimClock
from sim.scenario.model import Job

__all__ = ["SimGroup", "SimWorker", "SimWorkers", "Training", "World"]

SIGABRT_EXIT = -6
SIGKILL_EXIT = -9
SIGTERM_EXIT = -15


class WState(enum.Enum):
    """A worker's state.  A ready worker of a running world is running: its world's state
    says which (nothing reads the difference; marking each member when its world began
    was a pass over every worker of the job per round)."""

    STARTING = "starting"
    READY = "ready"
    HUNG = "hung"
    EXITED = "exited"


class SimWorker:
    """One simulated worker process, as a view of its group (:class:`SimGroup` keeps its
    workers as columns; a view is made only where a worker is handed out: a hang's
    callbacks, :attr:`SimGroup.workers`)."""

    __slots__ = ("_group", "index")

    def __init__(self, group: SimGroup, index: int) -> None:
        self._group = group
        self.index = index  # the worker's place in its group's columns

    @property
    def node(self) -> Any:
        return self._group.node

    @property
    def local_rank(self) -> int:
        return self._group.local_ranks[self.index]

    @property
    def global_rank(self) -> int:
        return self._group.global_ranks[self.index]

    @property
    def pid(self) -> int:
        return self._group.pid0 + self.index

    @property
    def state(self) -> WState:
        return self._group.states[self.index]

    @property
    def world(self) -> World:
        return self._group.world

    @property
    def alive(self) -> bool:
        return self._group.states[self.index] is not _EXITED


class WorldState(enum.Enum):
    FORMING = "forming"
    RUNNING = "running"
    BROKEN = "broken"
    DONE = "done"


_EXITED = WState.EXITED
_HUNG = WState.HUNG
_STARTING = WState.STARTING
_READY = WState.READY
#: the states in which a member's exit or stop breaks its world (after, break_ does nothing);
#: tested by identity, not in a set (an Enum's __hash__ is a Python call: ~8 per node per
#: job restart)
_FORMING, _RUNNING = WorldState.FORMING, WorldState.RUNNING

_first = itemgetter(0)


class Training:
    """The job's shared state: the last completed checkpoint, and every world."""

    def __init__(
        self,
        clock: SimClock,
        model: Job,
        events: EventSink,
        *,
        stop_time: float = 0.0,
        exit_notice: float = 0.0,
    ) -> None:
        self.clock = clock
        # the job as this run meets it (sim.run: start-up net of a preload, plus the
        # calibration's extra start-up)
        self.model = model
        self.stop_time = stop_time  # how long a worker takes to exit after SIGTERM
        # how long after a worker's exit its agent sees it (the kernel's notice, the
        # agent's loop): 0 unless a calibration says otherwise (sim.calibration)
        self.exit_notice = exit_notice
        self.events = events
        self.ckpt_step = 0
        self.best_step = 0
        self.done = False
        self.worlds: dict[int, World] = {}
        self.slow: dict[Any, float] = {}  # node -> slow-down factor
        self._pid = 1000
        # called with the hung worker and when its step's timer was acquired
        self.on_hang: list[Callable[[SimWorker, float], None]] = []

    def next_pid(self) -> int:
        self._pid += 1
        return self._pid

    def next_pids(self, n: int) -> int:
        """The first of ``n`` consecutive new pids (as ``n`` calls of :meth:`next_pid`)."""
        first = self._pid + 1
        self._pid += n
        return first

    def world_for(self, round_: int, size: int) -> World:
        w = self.worlds.get(round_)
        if w is None or w.size != size:
            w = World(self, round_, size)
            self.worlds[round_] = w
        return w

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.emit(AgentEvent(t=self.clock.now(), node="sim", kind=kind, fields=fields))

    def set_slow(self, node: Any, factor: float) -> None:
        if factor <= 1.0:
            self.slow.pop(node, None)
        else:
            self.slow[node] = factor
        for w in list(self.worlds.values()):
            if w.state is WorldState.RUNNING:
                w.reschedule()


class World:
    """The collective formed by the workers of one rendezvous round.

    Its members are the groups that joined it, by their workers' global ranks
    (``members``: global rank -> the group's :class:`_Member`; a worker is its group and
    its place in the group's columns, :meth:`SimGroup.index_of_global`)."""

    def __init__(self, training: Training, round_: int, size: int) -> None:
        self.training = training
        self.round = round_
        self.size = size
        self.members: dict[int, _Member] = {}
        # the members in the order they joined, and how many workers they brought: while
        # that is ``len(members)`` (no global rank joined twice), a stopped world reads its
        # workers group by group (break_), not rank by rank
        self._groups: list[_Member] = []
        self._joined = 0
        self.ready = 0
        self.state = WorldState.FORMING
        self.s0 = 0
        self.work = 0.0  # seconds of work done since the world began, at t_mark
        self.t_mark = 0.0
        self.factor = 1.0
        self._gen = 0  # invalidates scheduled completions
        self._formation_armed = False
        # set when progress stops, to the time of the last beat (None: no step completed,
        # so no beat was ever seen and a progress watch never arms)
        self.stalled: OneShot = training.clock.event()

    # -- formation -------------------------------------------------------------------------
    def join_group(self, g: SimGroup) -> None:
        """Each worker of ``g`` joins, in order (a node's group, in one call)."""
        if self.state is not WorldState.FORMING:
            # workers arriving at a broken/finished world: each will time out like a
            # process whose peers never come
            for i in range(len(g.states)):
                self._arm_timeout_for([(g.member, (i,))])
            return
        # Performance: in C, not a loop per worker (eight per node per job restart)
        self.members.update(zip(g.global_ranks, repeat(g.member)))
        self._groups.append(g.member)
        self._joined += len(g.global_ranks)

    def group_ready(self, g: SimGroup) -> None:
        """Each worker of ``g`` still starting is ready, in order, as one call per worker
        would make it (the world begins at the one that completes it; the others stay
        starting), in one call: a node's group after its start-up."""
        if self.state is not _FORMING:
            return
        states = g.states
        if states.count(_STARTING) == len(states):
            starting: Sequence[int] = range(len(states))
        else:
            starting = [i for i, st in enumerate(states) if st is _STARTING]
        k = len(starting)
        if not k:
            return
        if not self._formation_armed:
            self._formation_armed = True
            self._arm_timeout_for(None)
        ready, size = self.ready, self.size
        if len(self.members) == size and ready < size <= ready + k:
            # the (size - ready)-th of them completes the world: it begins there
            for i in starting[: size - ready]:
                states[i] = _READY
            self.ready = size
            self._begin()
            return
        if k == len(states):
            g.states = [_READY] * k
        else:
            for i in starting:
                states[i] = _READY
        self.ready = ready + k

    def _arm_timeout_for(self, workers: list[tuple[_Member, Sequence[int]]] | None) -> None:
        clock = self.training.clock
        gen = self._gen
        ev = clock.env.timeout(self.training.model.collective_timeout)

        def fire(_: Event) -> None:
            if workers is None:
                if self._gen != gen or self.state is not WorldState.FORMING:
                    return
                self.state = WorldState.BROKEN
                self._fail_members(_workers_of(self._retire()), "collective_init_timeout")
            else:
                self._fail_members(workers, "collective_timeout")

        ev.callbacks.append(fire)

    def _begin(self) -> None:
        t = self.training
        now = t.clock.now()
        self.state = WorldState.RUNNING
        self._gen += 1
        self.s0 = t.ckpt_step
        self.work = 0.0
        self.t_mark = now
        t.emit("sim.world_running", round=self.round, world_size=self.size, from_step=self.s0)
        self.reschedule()

    # -- progress ----------------------------------------------------------------------------
    def _node_factor(self) -> float:
        slow = self.training.slow
        if not slow:
            return 1.0
        nodes = {m.node for m in self.members.values()}
        return max([slow.get(n, 1.0) for n in nodes] + [1.0])

    def _time_of_work(self, work: float) -> float:
        """When the world had done ``work`` (``_advance`` first: work is up to now)."""
        return self.t_mark - (self.work - work) * self.factor

    def timer_start(self) -> float:
        """When the step or checkpoint in progress began (now if the world is not running)."""
        if self.state is not WorldState.RUNNING:
            return self.training.clock.now()
        self._advance()
        return self._time_of_work(self.training.model.phase_start(self.work))

    def last_beat(self) -> float | None:
        """When the last step completed (None: none yet, or the world is not running)."""
        if self.state is not WorldState.RUNNING:
            return None
        self._advance()
        w = self.training.model.last_beat(self.work)
        return None if w is None else self._time_of_work(w)

    def _advance(self) -> None:
        now = self.training.clock.now()
        self.work += (now - self.t_mark) / self.factor
        self.t_mark = now

    def reschedule(self) -> None:
        """(Re)plan the completion event after a start or a change of speed."""
        self._advance()
        self.factor = self._node_factor()
        self._gen += 1
        gen = self._gen
        model = self.training.model
        left = max(0.0, model.work_to_finish(self.s0) - self.work) * self.factor
        ev = self.training.clock.env.timeout(left)

        def done(_: Event) -> None:
            if self._gen == gen and self.state is WorldState.RUNNING:
                self._finish()

        ev.callbacks.append(done)

    def _finish(self) -> None:
        t = self.training
        self.state = WorldState.DONE
        t.ckpt_step = t.best_step = t.model.steps
        t.done = True
        t.emit("sim.progress", round=self.round, steps=t.model.steps, ckpt_step=t.model.steps)
        t.emit("sim.world_done", round=self.round)
        for gr, m in sorted(self._retire(), key=_first):
            g = m.group
            if g is not None and g.states[i := g.index_of_global(gr)] is not _EXITED:
                g._exit(i, 0, ExitCause.EXITED)

    def _settle_progress(self) -> None:
        t = self.training
        self._advance()
        steps, ckpt = t.model.progress(self.s0, self.work)
        t.best_step = max(t.best_step, steps)
        t.ckpt_step = max(t.ckpt_step, ckpt)
        t.emit("sim.progress", round=self.round, steps=steps, ckpt_step=t.ckpt_step)

    def break_(self, cause: str, culprit: tuple[_Member, int] | None = None) -> None:
        """A member died, hung or was stopped (``culprit``: that worker, as its group and
        its place in it): the collective stops making progress."""
        beat = self.last_beat()
        if self.state is WorldState.RUNNING:
            self._settle_progress()
        if self.state in (WorldState.RUNNING, WorldState.FORMING):
            self.state = WorldState.BROKEN
            self._gen += 1
            self.stalled.set(beat)
            self.training.emit("sim.world_broken", round=self.round, cause=cause)
            survivors: list[tuple[_Member, Sequence[int]]] = []
            culprit_member = culprit[0] if culprit is not None else None
            if self._joined == len(self.members):
                # Performance: no global rank joined twice, so the members' workers are
                # each group's columns in the order they joined: read group by group (at
                # 2,048 nodes, 16,384 workers per round's break, not a lookup of each)
                groups = self._groups
                self._forget()
                for m in groups:
                    g = m.group
                    if g is None:
                        continue  # every worker of it exited
                    states = g.states
                    if _EXITED in states or _HUNG in states or m is culprit_member:
                        live = [
                            i
                            for i, st in enumerate(states)
                            if st is not _EXITED and st is not _HUNG and (m, i) != culprit
                        ]
                        if live:
                            survivors.append((m, live))
                    elif states:
                        survivors.append((m, range(len(states))))
            else:
                for gr, m in self._retire():
                    g = m.group
                    if g is None:
                        continue  # every worker of it exited
                    i = g.index_of_global(gr)
                    st = g.states[i]
                    if st is not _EXITED and st is not _HUNG and (m, i) != culprit:
                        survivors.append((m, (i,)))
            self._arm_timeout_for(survivors)

    def _retire(self) -> list[tuple[int, _Member]]:
        """The members of a world that stopped (broken or done), forgotten by it: (global
        rank, group) pairs.

        Nothing reads a stopped world's members again (a late joiner only arms its own
        timeout), and they hold their groups and every exit: kept, every past round's
        workers stayed in memory (25 MB a round at 2,048 nodes)."""
        members = list(self.members.items())
        self._forget()
        return members

    def _forget(self) -> None:
        """Hold no member any more (see :meth:`_retire`)."""
        self.members = {}
        self._groups = []
        self._joined = 0

    def _fail_members(self, workers: list[tuple[_Member, Sequence[int]]], why: str) -> None:
        """Each worker of ``workers`` (a group and places in it) still alive fails, in
        global-rank order."""
        # Performance: only the live ones are sorted (when a broken world's survivors
        # time out, their agents have stopped nearly all of them: at 2,048 nodes the
        # sort of 16,384 workers, most dead, was most of this call); a group whose
        # workers all exited is skipped whole
        alive = [
            (g.global_ranks[i], g, i)
            for m, places in workers
            if (g := m.group) is not None
            for i in places
            if g.states[i] is not _EXITED
        ]
        alive.sort(key=_first)
        for _, g, i in alive:
            if g.states[i] is not _EXITED:  # still alive (an exit before it can end it)
                g._exit(i, SIGABRT_EXIT, ExitCause.SIGNALED, reason=why)


def _workers_of(members: list[tuple[int, _Member]]) -> list[tuple[_Member, Sequence[int]]]:
    """The live groups' workers of (global rank, member) pairs: (member, (place in its
    group,)); a group whose workers all exited has none."""
    return [(m, (g.index_of_global(gr),)) for gr, m in members if (g := m.group) is not None]


class _Member:
    """A group as its world knows it: its node, and the group while any of its workers
    runs (then ``None``: a world or a timer that still names it does not keep a finished
    group, and all it held, in memory until it fires)."""

    __slots__ = ("group", "node")

    def __init__(self, group: SimGroup) -> None:
        self.group: SimGroup | None = group
        self.node = group.node


class SimGroup:
    """A RunningGroup of simulated workers on one node.

    Performance: a node's workers start, stop and exit together at every job restart
    (eight per node, ~20 restarts a simulated day at 2,048 nodes), so the group keeps
    them as columns (``local_ranks``, ``global_ranks``, ``states``; pids ``pid0 + i``),
    not one object each, and a stop ends them in one pass; each exit is a tuple, made a
    :class:`WorkerExit` only when the agent takes it (``next_exit``, or a stop's
    :class:`~elastic.workers.ExitList` read as records: the agent reads its columns).
    A worker as an object (:class:`SimWorker`) is a view made where one is handed out.
    (A group holds nothing more per worker than that: one group per node is alive, and
    at 2,048 nodes each extra container is a MiB.)
    """

    def __init__(
        self,
        port: SimWorkers,
        local_ranks: Sequence[int],
        global_ranks: Sequence[int],
        world_size: int,
        round_: int,
    ) -> None:
        """The workers of ``local_ranks`` (with ``global_ranks``) joining the world of
        round ``round_`` and size ``world_size`` (:meth:`SimWorkers.start` and
        :meth:`SimWorkers.start_group` read them from the launches)."""
        # the port's training and node, not the port: the port holds the group (its
        # ``group``), and a group holding its port made a reference cycle that outlived
        # a crashed node until the collector's next full pass
        self.training = t = port.training
        self.node = port.node
        n = len(local_ranks)
        if len(global_ranks) != n:
            raise ValueError(
                f"{n} local ranks and {len(global_ranks)} global ranks: one of each per worker"
            )
        self.local_ranks = local_ranks
        self.global_ranks = global_ranks
        self.pid0 = t.next_pids(n)
        self.states: list[WState] = [_STARTING] * n
        self._alive = n
        self.member = _Member(self)
        # the places of the workers by local and global rank, made when first needed
        self._by_local: dict[int, int] | None = None
        # (the first global rank, when they are consecutive)
        self._by_global: dict[int, int] | int | None = None
        # each exit: (place, code, time, cause, extra) until taken, then its WorkerExit
        self._exits: list[tuple[int, int, float, ExitCause, Mapping[str, Any]] | WorkerExit] = []
        self._seen_at: list[float] = []  # when the agent may see each exit
        # a stop's exits not in those lists yet: (places, code, time) (see _flush)
        self._pending: tuple[Sequence[int], int, float] | None = None
        self._returned = 0
        self._waiter: OneShot | None = None
        # the callbacks of listeners while no wake-up event is made (see _new_waiter)
        self._listening: list[Callable[[Any], None]] | None = None
        world = t.world_for(round_, world_size)
        self.world = world
        world.join_group(self)
        # Performance: a callback of the shared wake-up, not a Timeout per node per job
        # restart (a node's groups start together: one wake-up for them all)
        t.clock.call_after(t.model.startup_time, self._started)

    def _started(self, _: Any) -> None:
        # every worker still starting is ready, in order (in its world)
        self.world.group_ready(self)

    def index_of_global(self, global_rank: int) -> int:
        """The place of the worker of ``global_rank`` (the last, if several have it)."""
        by = self._by_global
        if by is None:
            gs = self.global_ranks
            if gs and list(gs) == list(range(gs[0], gs[0] + len(gs))):
                by = self._by_global = gs[0]  # consecutive ranks: by arithmetic
            else:
                by = self._by_global = {gr: i for i, gr in enumerate(gs)}
        if type(by) is int:
            return global_rank - by
        assert isinstance(by, dict)
        return by[global_rank]

    def _index(self, local_rank: int) -> int | None:
        """The place of the worker of ``local_rank`` (the last, if several), or ``None``."""
        by = self._by_local
        if by is None:
            by = self._by_local = {lr: i for i, lr in enumerate(self.local_ranks)}
        return by.get(local_rank)

    def _flush(self) -> None:
        """Put the pending stop's exits in ``_exits`` and ``_seen_at`` (each as
        :meth:`_exit_all` would have made it): every reader of those lists calls this first.

        Performance: a stop for a restart (one per node per job restart) leaves its exits
        pending, and nothing reads them unless the agent takes them (a failure report)."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        live, code, now = pending
        self._exits.extend(
            zip(
                live,
                repeat(code),
                repeat(now),
                repeat(ExitCause.STOPPED_BY_AGENT),
                repeat({"reason": "stopped_by_agent"}),
            )
        )
        self._seen_at.extend(repeat(now, len(live)))

    def _record(self, j: int) -> WorkerExit:
        """Exit ``j`` as a :class:`WorkerExit`, made once."""
        if self._pending is not None:
            self._flush()
        x = self._exits[j]
        if type(x) is tuple:
            i, code, t, cause, extra = x
            x = self._exits[j] = WorkerExit(
                self.local_ranks[i], code, t, cause, self.pid0 + i, None, None, extra
            )
        assert isinstance(x, WorkerExit)
        return x

    def _records(self, start: int, stop: int) -> Callable[[], list[WorkerExit]]:
        def make() -> list[WorkerExit]:
            return [self._record(j) for j in range(start, stop)]

        return make

    def _exit(self, i: int, code: int, cause: ExitCause, reason: str = "") -> None:
        self._exit_all(((i, code),), cause, reason)

    def _exit_all(
        self, ends: Iterable[tuple[int, int]], cause: ExitCause, reason: str = ""
    ) -> None:
        """Each live worker of ``ends`` (its place, its code) exits, in that order, now.

        Exactly as one ``_exit`` after another: the waiting ``next_exit`` is woken at the
        first exit, before the first break of the world (both schedule at this instant)."""
        if self._pending is not None:
            self._flush()
        t = self.training
        now = t.clock.now()
        notice = t.exit_notice
        exits, seen_at, states = self._exits, self._seen_at, self.states
        seen = now + notice
        # one mapping for the exits of this call (nothing writes an exit's extra)
        extra = {"reason": reason} if reason else {}
        world = self.world
        for i, code in ends:
            was = states[i]
            if was is _EXITED:
                continue
            states[i] = _EXITED
            self._alive -= 1
            if not self._alive:
                self.member.group = None
            exits.append((i, code, now, cause, extra))
            seen_at.append(seen)
            if notice > 0:
                ev = t.clock.env.timeout(notice)
                ev.callbacks.append(lambda _: self._wake())
            elif self._waiter is not None or self._listening:
                self._wake()
            # a world already broken or done: break_ would do nothing
            if (
                code != 0
                and was is not _HUNG
                and ((ws := world.state) is _FORMING or ws is _RUNNING)
            ):
                world.break_(reason or cause.value, culprit=(self.member, i))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is None:
            if not self._listening:
                return  # nobody waits: no wake-up event
            waiter = self._new_waiter()
        self._waiter = None
        waiter.set()

    def _new_waiter(self) -> OneShot:
        """The wake-up event, made now; the callbacks of the listeners kept until now are
        its first callbacks, in the order they listened (the list itself: a listener's
        cancel removes its callback from it)."""
        clock = self.training.clock
        waiter = self._waiter = clock.event()
        listening = self._listening
        if listening:
            ev = clock.event_of(waiter)
            listening.extend(ev.callbacks)  # (none: the event is new)
            ev.callbacks = listening
            self._listening = None
        return waiter

    # -- faults on workers ------------------------------------------------------------------
    def _live_index(self, local_rank: int) -> int | None:
        i = self._index(local_rank)
        return None if i is None or self.states[i] is _EXITED else i

    def crash(self, local_rank: int, exit_code: int) -> bool:
        i = self._live_index(local_rank)
        if i is None:
            return False
        self._exit(
            i,
            exit_code,
            ExitCause.EXITED if exit_code > 0 else ExitCause.SIGNALED,
            reason="worker_crash",
        )
        return True

    def exit(self, local_rank: int, code: int) -> bool:
        """The worker ends on its own with ``code`` (as ``sys.exit(code)`` would)."""
        i = self._live_index(local_rank)
        if i is None:
            return False
        self._exit(i, code, ExitCause.EXITED if code >= 0 else ExitCause.SIGNALED)
        return True

    def hang(self, local_rank: int) -> bool:
        i = self._live_index(local_rank)
        if i is None or self.states[i] is WState.HUNG:
            return False
        world = self.world
        timer_from = world.timer_start()
        self.states[i] = WState.HUNG
        world.break_("worker_hang", culprit=(self.member, i))
        w = SimWorker(self, i)
        for cb in self.training.on_hang:
            cb(w, timer_from)
        return True

    def kill_hung(self, w: SimWorker, code: int) -> None:
        """The timer server killed a worker (it may be hung)."""
        self._exit(w.index, code, ExitCause.SIGNALED, reason="timer_expired")

    def lose_all(self) -> None:
        """The node died under the workers."""
        self._exit_all(
            [(i, SIGKILL_EXIT) for i in range(len(self.states))], ExitCause.LOST, "node_crash"
        )

    @property
    def workers(self) -> dict[int, SimWorker]:
        """local rank -> the worker (a view: made at each read)."""
        return {lr: SimWorker(self, i) for i, lr in enumerate(self.local_ranks)}

    # -- the RunningGroup port --------------------------------------------------------------------
    def pids(self) -> dict[int, int]:
        pid0 = self.pid0
        return dict(zip(self.local_ranks, range(pid0, pid0 + len(self.states)), strict=True))

    def running(self) -> frozenset[int]:
        states = self.states
        return frozenset(lr for i, lr in enumerate(self.local_ranks) if states[i] is not _EXITED)

    async def next_exit(self) -> WorkerExit:
        clock = self.training.clock
        while True:
            if self._pending is not None:
                self._flush()
            j = self._returned
            if j < len(self._exits) and not self._seen_at[j] > clock.now():
                break
            waiter = self._waiter
            if waiter is None:
                waiter = self._new_waiter()
            await waiter.wait()
        self._returned = j + 1
        return self._record(j)

    def take_exit(self) -> WorkerExit | None:
        """What ``next_exit`` returns without waiting, else ``None`` (ListenedGroup)."""
        if self._pending is not None:
            self._flush()
        j = self._returned
        if j >= len(self._exits) or self._seen_at[j] > self.training.clock.now():
            return None
        self._returned = j + 1
        return self._record(j)

    def listen(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` where a ``next_exit`` waiting now would resume: as a callback of
        the same wake-up event, in the place its task's resumption had (ListenedGroup).

        Performance: while no wake-up event is made, the callback is kept in a list that
        becomes the event's callbacks when one is (at an exit, or a ``next_exit`` that
        waits): the agent listens once per node per job restart and cancels (its group
        is stopped) far more often than an exit wakes it."""
        waiter = self._waiter
        if waiter is not None:
            callbacks = self.training.clock.event_of(waiter).callbacks
            assert callbacks is not None  # a waiter is dropped when it fires
        else:
            callbacks = self._listening
            if callbacks is None:
                callbacks = self._listening = []

        def call(_: Event) -> None:
            fn()

        callbacks.append(call)

        def cancel() -> None:
            if call in callbacks:
                callbacks.remove(call)

        return cancel

    def signal(self, sig: int, local_rank: int | None = None) -> None:
        if local_rank is not None:
            i = self._index(local_rank)
            if i is None:
                raise KeyError(local_rank)
            targets: Iterable[int] = (i,)
        else:
            targets = range(len(self.states))
        for i in targets:
            if self.states[i] is not _EXITED and sig in (9, 15):
                self._exit(i, -sig, ExitCause.STOPPED_BY_AGENT, reason="signal")

    async def stop(self, grace: float, sig: int = 15) -> ExitList:
        states = self.states
        n = len(states)
        lrs = self.local_ranks
        # the live workers by local rank (Performance: the usual group's local ranks
        # ascend, and sorting them is much cheaper than a sort keyed by them; one stop per
        # node per job restart)
        order: Sequence[int] = (
            range(n) if sorted(lrs) == lrs else sorted(range(n), key=lrs.__getitem__)
        )
        live = order if self._alive == n else [i for i in order if states[i] is not _EXITED]
        if not live:
            return ExitList([], [], list)
        training = self.training
        # a hung worker ignores the graceful signal; the others exit after stop_time
        hung = _HUNG in states
        delay = grace if hung else min(grace, training.stop_time)
        alive = self._alive
        if delay > 0:
            # a signalled worker stops making progress at the signal, not at its exit
            # (a real worker's SIGTERM handler stops stepping at once; elastic real
            # measured the break there), so its world breaks now (at its first live
            # worker that is not hung: the break makes the world's state final)
            world = self.world
            if (ws := world.state) is _FORMING or ws is _RUNNING:
                for i in live:
                    if states[i] is not _HUNG:
                        world.break_("stopped_by_agent", culprit=(self.member, i))
                        break
            # Performance: after(), the sleep without its coroutine (one per node per
            # job restart)
            await training.clock.after(delay)
        if self._pending is not None:
            self._flush()
        before = len(self._exits)
        code = -sig
        world = self.world
        states = self.states  # (replaced, not changed, when a group's workers all change)
        if (
            _HUNG not in states
            and self._alive == alive
            and training.exit_notice <= 0
            and (ws := world.state) is not _FORMING
            and ws is not _RUNNING
        ):
            # Performance: the usual stop (its world already broken, no worker exited
            # during the grace, none hung): each exit as _exit_all would make it, in one
            # pass (eight per node per job restart)
            k = len(live)
            if k == n:
                self.states = [_EXITED] * n
            else:
                for i in live:
                    states[i] = _EXITED
            self._alive -= k
            if not self._alive:
                self.member.group = None
            # its exits pending (_flush): made only if read
            self._pending = (live, code, training.clock.now())
            if self._waiter is not None or self._listening:
                self._wake()
            return ExitList(
                list(lrs) if live is order and type(order) is range else [lrs[i] for i in live],
                [code] * k,
                self._records(before, before + k),
            )
        self._exit_all(
            [(i, SIGKILL_EXIT if states[i] is _HUNG else code) for i in live],
            ExitCause.STOPPED_BY_AGENT,
            "stopped_by_agent",
        )
        # queued for next_exit too, as the real port does (the agent takes a stopped
        # group's remaining exits for its failure report)
        after = len(self._exits)
        made = [self._record(j) for j in range(before, after)]
        return ExitList([x.local_rank for x in made], [x.exit_code for x in made], made.copy)


class SimWorkers:
    """The workers port of one simulated node."""

    def __init__(self, node: Any, training: Training) -> None:
        self.node = node
        self.training = training
        self.group: SimGroup | None = None

    async def start(self, launches: Sequence[WorkerLaunch]) -> SimGroup:
        size = int(launches[0].env.get("WORLD_SIZE", "0")) if launches else 0
        self.group = SimGroup(
            self,
            [ln.local_rank for ln in launches],
            [ln.global_rank for ln in launches],
            size,
            launches[0].round if launches else 0,
        )
        return self.group

    async def start_group(self, group: GroupLaunch) -> SimGroup:
        """As ``start(group.launches())``, without making the launches: a worker model
        reads only its ranks, the world's size (the first worker's ``WORLD_SIZE``) and
        the round."""
        sizes = group.world_sizes
        self.group = SimGroup(
            self, group.local_ranks, group.global_ranks, sizes[0] if sizes else 0, group.round
        )
        return self.group
