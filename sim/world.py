"""The simulated cluster: nodes holding real agents, the store host, and the faults.

Each :class:`SimNode` runs the real :class:`elastic.agent.server.SimpleElasticAgent`
on the simulated ports: the :class:`sim.clock.SimClock`, a per-node client of the
:class:`sim.store.SimStoreHost`, and :class:`sim.workers.SimWorkers`.  Faults are
applied by one driver coroutine (:mod:`sim.run`) that sleeps until each fault's time (one
event per fault) and calls the fault kind's handler (:mod:`sim.inject`).  A node crash
cancels its agent and loses its workers and leases; with ``restart_after`` a fresh agent
starts on it later.  A graceful leave stops the workers through the agent (its
``finally``) and revokes the node's leases at once.

The run ends when no agent is running and no node start is pending, or at ``until``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from elastic.agent.server import SimpleElasticAgent, WorkerSpec
from elastic.clock import OneShot, Task
from elastic.events import AgentEvent, EventSink
from elastic.rendezvous.api import RendezvousError, RendezvousHandler
from sim.clock import SimClock
from sim.store import SimStoreClient, SimStoreHost
from sim.workers import SimWorkers, Training

__all__ = ["SimCluster", "SimNode"]

HandlerFactory = Callable[["SimNode"], RendezvousHandler]


class SimNode:
    """One machine: an agent, its workers and its store client."""

    def __init__(self, cluster: SimCluster, node_id: int) -> None:
        self.cluster = cluster
        self.id = node_id
        self.alive = False
        self.agent: SimpleElasticAgent | None = None
        self.task: Task[Any] | None = None
        self.store: SimStoreClient | None = None
        self.workers: SimWorkers | None = None
        self.handler: RendezvousHandler | None = None
        self.incarnation = 0
        self.gpu_bad = False
        # how many network_partitions cut the machine's link to the store now (each until
        # its heal; overlapping ones heal at the last): a property of the node, not of its
        # agent, so an agent booted meanwhile starts cut
        self.cut = 0

    def start(self) -> None:
        """Boot the node: a fresh agent with fresh ports."""
        c = self.cluster
        self.alive = True
        self.incarnation += 1
        self.store = c.host.client((self.id, self.incarnation))
        if self.cut:
            self.store.partition_start()
        self.workers = SimWorkers(self.id, c.training)
        self.handler = c.handler_factory(self)
        spec = WorkerSpec(
            role="default",
            local_world_size=c.nproc_per_node,
            rdzv_handler=self.handler,
            entrypoint="train.py",
            max_restarts=c.max_restarts,
            monitor_interval=c.monitor_interval,
        )
        self.agent = SimpleElasticAgent(
            spec,
            exit_barrier_timeout=c.exit_barrier_timeout,
            shutdown_timeout=c.shutdown_timeout,
            clock=c.clock,
            workers=self.workers,
            events=c.events,
            node=self.id,
            health_watches=c.health_watches_for(self),
            pre_start_checks=[self._gpu_check],
        )
        c.running += 1
        self.task = c.clock.spawn(self._run(), name=f"agent-{self.id}")

    async def _gpu_check(self) -> str | None:
        if self.gpu_bad:
            return f"node {self.id}: GPU health check failed (simulated gpu_error)"
        return None

    async def _run(self) -> None:
        assert self.agent is not None and self.handler is not None
        c = self.cluster
        try:
            try:
                result = await self.agent.run_async()
            except RendezvousError:
                # the agent recorded the error and ended FAILED; its launcher would exit 1
                await self.handler.set_closed_async()
                return
            if self.agent.refused_start is not None:
                # an unhealthy node takes itself out: the others see it leave, the job goes on
                await self._revoke_leases()
                return
            # as torch's launcher does after a run: close the rendezvous for everyone
            if result is not None and result.is_failed():
                await self.handler.set_closed_async()
            await self.handler.shutdown_async()
        finally:
            c.running -= 1
            c.maybe_done()

    def crash(self) -> None:
        if not self.alive:
            return
        self.alive = False
        if self.workers is not None and self.workers.group is not None:
            self.workers.group.lose_all()
        if self.store is not None:
            self.store.crash()
        if self.agent is not None:
            self.agent.detach_events()  # a dead machine reports nothing
        if self.task is not None:
            self.task.cancel()

    async def leave(self) -> None:
        """Graceful: the agent stops its workers, then the node's leases are revoked."""
        if not self.alive:
            return
        self.alive = False
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):  # cancelled on purpose
                await self.task.join()
        await self._revoke_leases()

    async def _revoke_leases(self) -> None:
        if self.store is not None:
            await self.store.leave()


class SimCluster:
    """Everything a run needs: clock, store host, training model, nodes, events."""

    def __init__(
        self,
        clock: SimClock,
        host: SimStoreHost,
        training: Training,
        events: EventSink,
        *,
        nproc_per_node: int,
        max_restarts: int,
        monitor_interval: float,
        exit_barrier_timeout: float,
        shutdown_timeout: float,
        handler_factory: HandlerFactory,
        health_watches: Callable[[SimNode], list[Any]] | None = None,
    ) -> None:
        self.clock = clock
        self.host = host
        self.training = training
        self.events = events
        self.nproc_per_node = nproc_per_node
        self.max_restarts = max_restarts
        self.monitor_interval = monitor_interval
        self.exit_barrier_timeout = exit_barrier_timeout
        self.shutdown_timeout = shutdown_timeout
        self.handler_factory = handler_factory
        self._health = health_watches
        self.nodes: dict[int, SimNode] = {}
        self.running = 0
        self.pending_starts = 0
        self.finished: OneShot = clock.event()
        self.started_any = False

    def health_watches_for(self, node: SimNode) -> list[Any]:
        return self._health(node) if self._health is not None else []

    def add_node(self) -> SimNode:
        n = SimNode(self, len(self.nodes))
        self.nodes[n.id] = n
        return n

    def start_node(self, node: SimNode) -> None:
        self.started_any = True
        node.start()

    def maybe_done(self) -> None:
        if self.started_any and self.running == 0 and self.pending_starts == 0:
            self.finished.set("done")

    def emit(self, kind: str, node: int | str = "sim", **fields: Any) -> None:
        self.events.emit(AgentEvent(t=self.clock.now(), node=node, kind=kind, fields=fields))

    def restart_later(self, node: SimNode, after: float) -> None:
        """Boot ``node`` again ``after`` seconds from now (counted as pending at once, so a
        job whose last node just crashed does not end before its restart).

        The restart belongs to the node's current incarnation: if the node is booted by
        something else meanwhile (a GPU repair), it is dropped, so a node that a later
        fault took out after that boot stays out."""
        self.pending_starts += 1
        self.clock.spawn(
            self._restart_later(node, after, node.incarnation), name=f"restart-{node.id}"
        )

    async def _restart_later(self, node: SimNode, after: float, incarnation: int) -> None:
        try:
            await self.clock.sleep(after)
            if not node.alive and node.incarnation == incarnation and not self.finished.is_set():
                self.emit("sim.node_restart", node=node.id)
                self.start_node(node)
        finally:
            self.pending_starts -= 1
            self.maybe_done()
