"""Hang detection in the simulator, through the same code paths as real mode.

Two paths, chosen by the scenario's ``job:`` settings:

* ``timer: <after>`` — every training step runs inside ``expires(after=<after>)``.  Each
  node's agent runs the real timer server core (:class:`elastic.timer.driver.TimerDriver`)
  on the simulated clock.  Steps that finish release their timer, so only the step that
  hangs matters: when a worker hangs, its client acquires ``"train_step"`` expiring
  ``after`` seconds after the start of the step (or checkpoint) it hangs in — where a
  real worker acquired it, as ``elastic real`` measured: counting from the hang itself
  was up to a step late.  The acquire/release of every completed step is not simulated,
  which would cost events and change nothing.  At expiry the server reaps the worker
  (SIGKILL); the agent sees a failed worker and applies its restart policy.
* ``hang_timeout: <t>`` — workers beat once per step; a beat is computed from time, not
  simulated.  When the world stops making progress (a hang, a crash, a partition), every
  member stops beating; if the group is still running ``t`` after the last beat (the end
  of the last completed step, not the moment of the hang: the real watch counts from the
  beat it last saw), the agent's health watch declares it UNHEALTHY, naming the ranks
  that stopped.  A world that never completed a step has no beat and is never declared
  hung this way (the real watch arms a rank at its first beat).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from elastic.agent.server import WorkerGroup
from elastic.events import AgentEvent, EventSink, kinds
from elastic.timer.driver import ClockTimerClient, TimerDriver
from sim.clock import SimClock
from sim.scenario.model import Scenario
from sim.workers import SIGKILL_EXIT, SimWorker, Training, WState
from sim.world import SimNode

__all__ = ["health_watches_factory"]

# the signal of the kill: expires()'s default, as a real request carries it (an int)
_SIGKILL = int(signal.SIGKILL)


class SimHangWatch:
    """The agent's progress watch: UNHEALTHY after ``hang_timeout`` without progress."""

    def __init__(self, node: SimNode, clock: SimClock, hang_timeout: float) -> None:
        self.node = node
        self.clock = clock
        self.hang_timeout = hang_timeout

    async def wait_unhealthy(self, group: WorkerGroup) -> str:
        workers = self.node.workers
        sim_group = workers.group if workers is not None else None
        if sim_group is None:
            await self.clock.event().wait()  # nothing to watch: never fires
        assert sim_group is not None
        world = sim_group.world
        stalled_at = await world.stalled.wait()
        if stalled_at is None:
            # no step completed in this world: no beat was seen, nothing is armed (as
            # the real ProgressWatcher watches a rank from its first beat)
            await self.clock.event().wait()
        await self.clock.sleep(stalled_at + self.hang_timeout - self.clock.now())
        ranks = sorted(w.global_rank for w in sim_group.workers.values() if w.alive)
        hung = sorted(w.global_rank for w in sim_group.workers.values() if w.state is WState.HUNG)
        return (
            f"no progress for {self.hang_timeout:g}s since t={stalled_at:g} "
            f"from ranks {ranks}" + (f" (hung: {hung})" if hung else "")
        )


def health_watches_factory(
    sc: Scenario, training: Training, clock: SimClock, events: EventSink
) -> Callable[[SimNode], list[Any]]:
    """The per-node health watches and timer servers the scenario asks for."""
    timer_after = sc.job.timer
    hang_timeout = sc.job.hang_timeout
    drivers: dict[Any, tuple[TimerDriver, SimNode]] = {}

    if timer_after is not None:

        def on_hang(w: SimWorker, acquired_at: float) -> None:
            entry = drivers.get(w.node)
            if entry is None:
                return
            driver, _node = entry
            ClockTimerClient(driver, w.pid, clock).acquire("train_step", acquired_at + timer_after)

        training.on_hang.append(on_hang)

    def make(node: SimNode) -> list[Any]:
        if timer_after is not None:

            async def reap(worker_id: Any, scope_id: str, expired_at: float) -> bool:
                group = node.workers.group if node.workers is not None else None
                if group is None:
                    return True
                for w in group.workers.values():
                    if w.pid == worker_id and w.alive:
                        # what real mode's timer server reports (FileTimerServer's
                        # log_event, as LocalElasticAgent emits it): the expired timer,
                        # then the kill, as agent.watchdog events of the node's role
                        role = node.agent.get_worker_group().spec.role if node.agent else ""
                        for name in ("timer expired", "kill worker process"):
                            events.emit(
                                AgentEvent(
                                    clock.now(),
                                    node.id,
                                    kinds.AGENT_WATCHDOG,
                                    role,
                                    None,
                                    {
                                        "watchdog_event": name,
                                        "worker_pid": worker_id,
                                        "scope_id": scope_id,
                                        "expiration_time": expired_at,
                                        "signal": _SIGKILL,
                                    },
                                )
                            )
                        group.kill_hung(w, SIGKILL_EXIT)
                return True

            driver = TimerDriver(clock, reap)
            drivers[node.id] = (driver, node)
            clock.spawn(driver.run(), name=f"timer-server-{node.id}")
        if hang_timeout is not None:
            return [SimHangWatch(node, clock, hang_timeout)]
        return []

    return make
