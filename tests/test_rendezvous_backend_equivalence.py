"""The backend-driven handler and the store-port handler decide the same, step by step.

A stateful hypothesis test: nodes join, die and restart their groups; after each step
(given time to settle) every live node holds the same (round, rank, world size) in the
world where the dynamic rendezvous runs over the store port (``MemoryStore``) as in the
world where it runs over torch's backend contract (``from_backend`` over a
``C10dRendezvousBackend``), both simulated.

Membership stays within ``max_nodes``: beyond it, *which* nodes a full round admits
depends on who arrives first (the first ``max_nodes`` joiners complete it at once), and
a backend's poll latency reorders arrivals as network jitter does in any real run.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from elastic.clock import Cancelled, Task
from elastic.memstore import MemoryStore
from elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from sim.clock import SimClock

NAMES = ["n0", "n1", "n2", "n3", "n4", "n5"]
MIN, MAX = 2, 4
LAST_CALL = 0.5
TTL = 1.0  # keep_alive_interval=1 * keep_alive_max_attempt=1
POLL = 0.25
SETTLE = 6.0  # > last call + ttl + ttl/3 + a few polls: every step's effects are over


class _World:
    def __init__(self, backend: bool) -> None:
        self.clock = SimClock()
        self.backend = backend
        self.round_store = MemoryStore(self.clock)
        self.state_store = MemoryStore(self.clock)
        self.handlers: dict[str, DynamicRendezvousHandler] = {}
        self.drivers: dict[str, Task[None]] = {}
        self.seen: dict[str, tuple[int, int, int]] = {}

    def handler(self, node: str) -> DynamicRendezvousHandler:
        timeout = RendezvousTimeout(join=1e6, last_call=LAST_CALL, close=10)
        if self.backend:
            return DynamicRendezvousHandler.from_backend(
                "job",
                self.round_store,
                C10dRendezvousBackend(self.state_store, "job"),
                MIN,
                MAX,
                local_addr=f"host-{node}",
                timeout=timeout,
                keep_alive_interval=1,
                keep_alive_max_attempt=1,
                clock=self.clock,
                node_id=node,
                poll_interval=POLL,
            )
        s = RendezvousSettings("job", MIN, MAX, timeout)
        return DynamicRendezvousHandler(
            node, f"host-{node}", s, "c10d", self.round_store, self.clock, lease_ttl=TTL
        )

    async def _drive(self, node: str, h: DynamicRendezvousHandler) -> None:
        while True:
            info = await h.next_rendezvous_async()
            self.seen[node] = (info.round, info.rank, info.world_size)
            await h.watch_async()

    def start(self, node: str) -> None:
        h = self.handlers.get(node) or self.handler(node)
        self.handlers[node] = h
        self.drivers[node] = self.clock.spawn(self._drive(node, h), name=node)

    def kill(self, node: str) -> None:
        self.drivers.pop(node).cancel()
        h = self.handlers.pop(node)
        self.seen.pop(node, None)
        if h.lease is not None:
            h.lease.abandon()

    def restart(self, node: str) -> None:
        self.drivers.pop(node).cancel()
        self.start(node)

    def settle(self) -> None:
        self.clock.env.run(until=self.clock.now() + SETTLE)
        for _, err in self.clock.unobserved:
            if not isinstance(err, Cancelled):
                raise err
        for node, task in self.drivers.items():
            assert not task.done(), f"{node}'s driver ended: {task!r}"


class SameDecisions(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.worlds = (_World(backend=False), _World(backend=True))
        self.up: list[str] = []

    def _all(self, op: str, node: str) -> None:
        for w in self.worlds:
            getattr(w, op)(node)
        for w in self.worlds:
            w.settle()

    @precondition(lambda self: len(self.up) < MAX)
    @rule(data=st.data())
    def join(self, data: Any) -> None:
        node = data.draw(st.sampled_from([n for n in NAMES if n not in self.up]))
        self.up.append(node)
        self._all("start", node)

    @precondition(lambda self: self.up)
    @rule(data=st.data())
    def die(self, data: Any) -> None:
        node = data.draw(st.sampled_from(self.up))
        self.up.remove(node)
        self._all("kill", node)

    @precondition(lambda self: self.up)
    @rule(data=st.data())
    def restart_group(self, data: Any) -> None:
        node = data.draw(st.sampled_from(self.up))
        self._all("restart", node)

    @invariant()
    def both_worlds_hold_the_same_rounds_ranks_and_world_sizes(self) -> None:
        port, backend = self.worlds
        assert port.seen == backend.seen
        last = max((r for r, _, _ in port.seen.values()), default=0)
        members = [v for v in port.seen.values() if v[0] == last]
        if len(self.up) >= MIN:  # a complete round: ranks 0..n-1, one world size
            assert sorted(rank for _, rank, _ in members) == list(range(len(members)))
            assert {ws for _, _, ws in members} == {len(members)}


SameDecisions.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSameDecisions = SameDecisions.TestCase
