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
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from typing import Any

from simpy.events import Event

from elastic.clock import OneShot
from elastic.events import AgentEvent, EventSink
from elastic.workers import ExitCause, GroupLaunch, WorkerExit, WorkerLaunch
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
    """One simulated worker process."""

    __slots__ = ("global_rank", "group", "local_rank", "node", "pid", "state", "world")

    def __init__(self, group: SimGroup, local_rank: int, global_rank: int, pid: int) -> None:
        # the group while the worker runs; None once it exited, so that a finished group
        # and its workers hold no reference cycle and are freed when the agent drops the
        # group, not at the collector's next full pass (with the collector tuned for
        # speed, dead groups piled up: +15 % peak memory at 2,048 nodes)
        self.group: SimGroup | None = group
        self.node = group.node
        self.local_rank = local_rank
        self.global_rank = global_rank
        self.pid = pid
        self.state = _STARTING
        self.world: World | None = None

    @property
    def alive(self) -> bool:
        return self.state is not _EXITED


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

_by_global_rank = attrgetter("global_rank")
_by_local_rank = attrgetter("local_rank")


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
    """The collective formed by the workers of one rendezvous round."""

    def __init__(self, training: Training, round_: int, size: int) -> None:
        self.training = training
        self.round = round_
        self.size = size
        self.members: dict[int, SimWorker] = {}
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
    def join(self, w: SimWorker) -> None:
        if self.state is not WorldState.FORMING:
            # a worker arriving at a broken/finished world: it will time out like a
            # process whose peers never come
            w.world = self
            self._arm_timeout_for([w])
            return
        self.members[w.global_rank] = w
        w.world = self

    def join_all(self, workers: Iterable[SimWorker]) -> None:
        """:meth:`join` each of ``workers``, in order (a node's group, in one call)."""
        if self.state is not WorldState.FORMING:
            for w in workers:
                self.join(w)
            return
        members = self.members
        for w in workers:
            members[w.global_rank] = w
            w.world = self

    def member_ready(self, w: SimWorker) -> None:
        if w.world is not self or self.state is not WorldState.FORMING:
            return
        w.state = WState.READY
        self.ready += 1
        if not self._formation_armed:
            self._formation_armed = True
            self._arm_timeout_for(None)
        if self.ready == self.size and len(self.members) == self.size:
            self._begin()

    def members_ready(self, workers: Iterable[SimWorker]) -> None:
        """:meth:`member_ready` for each of ``workers`` still starting, in order, in its
        own world (a node's group after its start-up: eight workers per node per job
        restart, this world's inline)."""
        for w in workers:
            if w.state is not _STARTING:
                continue
            if w.world is not self:
                if w.world is not None:
                    w.world.member_ready(w)
                continue
            if self.state is not _FORMING:
                continue
            w.state = _READY
            self.ready += 1
            if not self._formation_armed:
                self._formation_armed = True
                self._arm_timeout_for(None)
            if self.ready == self.size and len(self.members) == self.size:
                self._begin()

    def _arm_timeout_for(self, workers: list[SimWorker] | None) -> None:
        clock = self.training.clock
        gen = self._gen
        ev = clock.env.timeout(self.training.model.collective_timeout)

        def fire(_: Event) -> None:
            if workers is None:
                if self._gen != gen or self.state is not WorldState.FORMING:
                    return
                self.state = WorldState.BROKEN
                self._fail_members(self._retire(), "collective_init_timeout")
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
        for m in sorted(self._retire(), key=_by_global_rank):
            if m.group is not None:  # alive
                m.group._exit(m, 0, ExitCause.EXITED)

    def _settle_progress(self) -> None:
        t = self.training
        self._advance()
        steps, ckpt = t.model.progress(self.s0, self.work)
        t.best_step = max(t.best_step, steps)
        t.ckpt_step = max(t.ckpt_step, ckpt)
        t.emit("sim.progress", round=self.round, steps=steps, ckpt_step=t.ckpt_step)

    def break_(self, cause: str, culprit: SimWorker | None = None) -> None:
        """A member died, hung or was stopped: the collective stops making progress."""
        beat = self.last_beat()
        if self.state is WorldState.RUNNING:
            self._settle_progress()
        if self.state in (WorldState.RUNNING, WorldState.FORMING):
            self.state = WorldState.BROKEN
            self._gen += 1
            self.stalled.set(beat)
            self.training.emit("sim.world_broken", round=self.round, cause=cause)
            survivors = [
                m
                for m in self._retire()
                if m.state is not _EXITED and m is not culprit and m.state is not _HUNG
            ]
            self._arm_timeout_for(survivors)

    def _retire(self) -> list[SimWorker]:
        """The members of a world that stopped (broken or done), forgotten by it.

        Nothing reads a stopped world's members again (a late joiner only arms its own
        timeout), and they hold their groups and every exit: kept, every past round's
        workers stayed in memory (25 MB a round at 2,048 nodes)."""
        members = list(self.members.values())
        self.members = {}
        return members

    def _fail_members(self, workers: list[SimWorker], why: str) -> None:
        # Performance: only the live ones are sorted (when a broken world's survivors
        # time out, their agents have stopped nearly all of them: at 2,048 nodes the
        # sort of 16,384 workers, most dead, was most of this call)
        alive = [m for m in workers if m.group is not None]
        for m in sorted(alive, key=_by_global_rank):
            if m.group is not None:  # still alive (an exit before it can end it)
                m.group._exit(m, SIGABRT_EXIT, ExitCause.SIGNALED, reason=why)


class SimGroup:
    """A RunningGroup of simulated workers on one node.

    Performance: a node's workers start, stop and exit together at every job restart
    (eight per node, ~20 restarts a simulated day at 2,048 nodes), so :meth:`_exit_all`
    ends several in one call; each exit is still one :class:`WorkerExit`, taken one by
    one by ``next_exit``.  (A group holds nothing more per worker than its ``workers``:
    one group per node is alive, and at 2,048 nodes each extra container is a MiB.)
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
        self.workers: dict[int, SimWorker] = {}
        self._exits: list[WorkerExit] = []
        self._seen_at: list[float] = []  # when the agent may see each exit
        self._returned = 0
        self._waiter: OneShot | None = None
        world = t.world_for(round_, world_size)
        pid = t.next_pids(len(local_ranks))
        workers = self.workers
        for i, (lr, gr) in enumerate(zip(local_ranks, global_ranks, strict=True)):
            workers[lr] = SimWorker(self, lr, gr, pid + i)
        world.join_all(workers.values())
        self.world = world
        # Performance: a callback of the shared wake-up, not a Timeout per node per job
        # restart (a node's groups start together: one wake-up for them all)
        t.clock.call_after(t.model.startup_time, self._started)

    def _started(self, _: Any) -> None:
        # every worker still starting is ready, in order (each in its world)
        self.world.members_ready(self.workers.values())

    def _exit(self, w: SimWorker, code: int, cause: ExitCause, reason: str = "") -> None:
        self._exit_all(((w, code),), cause, reason)

    def _exit_all(
        self, ends: Iterable[tuple[SimWorker, int]], cause: ExitCause, reason: str = ""
    ) -> None:
        """Each live worker of ``ends`` exits with its code, in that order, now.

        Exactly as one ``_exit`` after another: the waiting ``next_exit`` is woken at the
        first exit, before the first break of the world (both schedule at this instant)."""
        t = self.training
        now = t.clock.now()
        notice = t.exit_notice
        exits, seen_at = self._exits, self._seen_at
        seen = now + notice
        # one mapping for the exits of this call (nothing writes an exit's extra)
        extra = {"reason": reason} if reason else {}
        for w, code in ends:
            was = w.state
            if was is _EXITED:
                continue
            w.state = _EXITED
            w.group = None
            exits.append(
                WorkerExit(
                    w.local_rank,
                    code,
                    now,
                    cause,
                    w.pid,
                    None,
                    None,
                    extra,
                )
            )
            seen_at.append(seen)
            if notice > 0:
                ev = t.clock.env.timeout(notice)
                ev.callbacks.append(lambda _: self._wake())
            elif self._waiter is not None:
                self._wake()
            world = w.world
            # a world already broken or done: break_ would do nothing
            if (
                code != 0
                and world is not None
                and was is not _HUNG
                and ((ws := world.state) is _FORMING or ws is _RUNNING)
            ):
                world.break_(reason or cause.value, culprit=w)

    def _wake(self) -> None:
        if self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            waiter.set()

    # -- faults on workers ------------------------------------------------------------------
    def crash(self, local_rank: int, exit_code: int) -> bool:
        w = self.workers.get(local_rank)
        if w is None or not w.alive:
            return False
        self._exit(
            w,
            exit_code,
            ExitCause.EXITED if exit_code > 0 else ExitCause.SIGNALED,
            reason="worker_crash",
        )
        return True

    def exit(self, local_rank: int, code: int) -> bool:
        """The worker ends on its own with ``code`` (as ``sys.exit(code)`` would)."""
        w = self.workers.get(local_rank)
        if w is None or not w.alive:
            return False
        self._exit(w, code, ExitCause.EXITED if code >= 0 else ExitCause.SIGNALED)
        return True

    def hang(self, local_rank: int) -> bool:
        w = self.workers.get(local_rank)
        if w is None or not w.alive or w.state is WState.HUNG:
            return False
        world = w.world
        timer_from = world.timer_start() if world is not None else self.training.clock.now()
        w.state = WState.HUNG
        if world is not None:
            world.break_("worker_hang", culprit=w)
        for cb in self.training.on_hang:
            cb(w, timer_from)
        return True

    def kill_hung(self, w: SimWorker, code: int) -> None:
        """The timer server killed a worker (it may be hung)."""
        self._exit(w, code, ExitCause.SIGNALED, reason="timer_expired")

    def lose_all(self) -> None:
        """The node died under the workers."""
        self._exit_all(
            [(w, SIGKILL_EXIT) for w in self.workers.values()], ExitCause.LOST, "node_crash"
        )

    # -- the RunningGroup port --------------------------------------------------------------------
    def pids(self) -> dict[int, int]:
        return {lr: w.pid for lr, w in self.workers.items()}

    def running(self) -> frozenset[int]:
        return frozenset(lr for lr, w in self.workers.items() if w.alive)

    async def next_exit(self) -> WorkerExit:
        clock = self.training.clock
        while self._returned >= len(self._exits) or self._seen_at[self._returned] > clock.now():
            if self._waiter is None:
                self._waiter = clock.event()
            await self._waiter.wait()
        ex = self._exits[self._returned]
        self._returned += 1
        return ex

    def take_exit(self) -> WorkerExit | None:
        """What ``next_exit`` returns without waiting, else ``None`` (ListenedGroup)."""
        i = self._returned
        if i >= len(self._exits) or self._seen_at[i] > self.training.clock.now():
            return None
        self._returned = i + 1
        return self._exits[i]

    def listen(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` where a ``next_exit`` waiting now would resume: as a callback of
        the same wake-up event, in the place its task's resumption had (ListenedGroup)."""
        clock = self.training.clock
        if self._waiter is None:
            self._waiter = clock.event()
        callbacks = clock.event_of(self._waiter).callbacks
        assert callbacks is not None  # a waiter is dropped when it fires

        def call(_: Event) -> None:
            fn()

        callbacks.append(call)

        def cancel() -> None:
            if call in callbacks:
                callbacks.remove(call)

        return cancel

    def signal(self, sig: int, local_rank: int | None = None) -> None:
        targets = (
            [self.workers[local_rank]] if local_rank is not None else list(self.workers.values())
        )
        for w in targets:
            if w.alive and sig in (9, 15):
                self._exit(w, -sig, ExitCause.STOPPED_BY_AGENT, reason="signal")

    async def stop(self, grace: float, sig: int = 15) -> list[WorkerExit]:
        live = sorted(
            [w for w in self.workers.values() if w.state is not _EXITED], key=_by_local_rank
        )
        if not live:
            return []
        training = self.training
        hung = False
        for w in live:  # Performance: no generator (one stop per node per job restart)
            if w.state is _HUNG:
                hung = True
                break
        # a hung worker ignores the graceful signal; the others exit after stop_time
        delay = grace if hung else min(grace, training.stop_time)
        if delay > 0:
            # a signalled worker stops making progress at the signal, not at its exit
            # (a real worker's SIGTERM handler stops stepping at once; elastic real
            # measured the break there), so its world breaks now
            for w in live:
                world = w.world
                if (
                    world is not None
                    and w.state is not _HUNG
                    and ((ws := world.state) is _FORMING or ws is _RUNNING)
                ):
                    world.break_("stopped_by_agent", culprit=w)
            # Performance: after(), the sleep without its coroutine (one per node per
            # job restart)
            await training.clock.after(delay)
        before = len(self._exits)
        self._exit_all(
            [(w, SIGKILL_EXIT if w.state is _HUNG else -sig) for w in live],
            ExitCause.STOPPED_BY_AGENT,
            "stopped_by_agent",
        )
        # queued for next_exit too, as the real port does (the agent takes a stopped
        # group's remaining exits for its failure report)
        return self._exits[before:]


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
