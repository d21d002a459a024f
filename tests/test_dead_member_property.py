"""Property: no run waits for a member known dead longer than its lease.

Real :class:`DynamicRendezvousHandler` s on the simulated store, each driven as the agent
drives it (``next_rendezvous_async``, then the ranks: from the round's result when the
node gave its member info, else the agent's own rank exchange,
:func:`elastic.agent.ranks.exchange_ranks_in_round`; then ``watch_async``).  Hypothesis
kills some nodes at arbitrary moments around the formation of a round — before joining,
while the round fills, after it is decided but while addresses and ranks are exchanged,
or after it runs.  A dead node's lease (``TTL``) outlives it, so a round may be decided
with it; the property is that the survivors never wait for it longer than that: once the
last death is known (``TTL`` after it), the survivors form a round of exactly themselves
within one last call.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from elastic.agent.ranks import AgentAssignment, exchange_ranks_in_round
from elastic.clock import Task
from elastic.rendezvous.dynamic import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from sim.clock import SimClock
from sim.store import SimStoreClient, SimStoreHost

TTL = 10.0
LAST_CALL = 20.0
JOIN = 600.0
SLACK = 1.0  # store round trips: 1 ms each, a few dozen at most


class _Node:
    def __init__(
        self, clock: SimClock, host: SimStoreHost, i: int, lo: int, hi: int, member_info: bool
    ) -> None:
        self.id = f"node{i:02d}"
        self.store: SimStoreClient = host.client(self.id)
        rs = RendezvousSettings("job", lo, hi, RendezvousTimeout(JOIN, LAST_CALL, 30.0))
        self.handler = DynamicRendezvousHandler(
            self.id, self.id, rs, "c10d", self.store, clock, lease_ttl=TTL
        )
        if member_info:
            self.handler.set_member_info("trainer", 1)
        self.clock = clock
        # (time, round, world size) of every round whose ranks this node exchanged
        self.rounds: list[tuple[float, int, int]] = []
        self.task: Task[Any] | None = None

    async def run(self) -> None:
        h, clock = self.handler, self.clock
        while True:
            info = await h.next_rendezvous_async()
            got = info.assignment or await exchange_ranks_in_round(
                clock, h, info, "trainer", 1, timeout=JOIN
            )
            if isinstance(got, AgentAssignment):
                assert got.world_size == info.world_size
                self.rounds.append((clock.now(), info.round, info.world_size))
                await h.watch_async()

    def crash(self) -> None:
        self.store.crash()
        if self.task is not None:
            self.task.cancel()


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(3, 6),
    member_info=st.booleans(),
    data=st.data(),
)
def test_survivors_never_wait_for_a_dead_member_beyond_its_lease(
    n: int, member_info: bool, data: Any
) -> None:
    dead = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1), label="dead")
    survivors = n - len(dead)
    lo = data.draw(st.integers(1, survivors), label="min_nodes")
    hi = data.draw(st.integers(n, n + 1), label="max_nodes")
    # deaths in the first 60 s: before, while and after the first round forms
    deaths = {
        i: data.draw(st.integers(0, 60_000), label=f"death of node {i} (ms)") / 1000.0
        for i in sorted(dead)
    }
    starts = [data.draw(st.integers(0, 5_000), label="start (ms)") / 1000.0 for _ in range(n)]
    clock = SimClock()
    host = SimStoreHost(clock, latency=0.001)
    nodes = [_Node(clock, host, i, lo, hi, member_info) for i in range(n)]

    async def start(node: _Node, at: float) -> None:
        await clock.sleep(at)
        node.task = clock.spawn(node.run(), name=node.id)

    async def kill(node: _Node, at: float) -> None:
        await clock.sleep(at)
        node.crash()

    for node, at in zip(nodes, starts, strict=True):
        clock.spawn(start(node, at))
    for i, at in deaths.items():
        clock.spawn(kill(nodes[i], max(at, starts[i])))
    # the last death is known TTL after it; then one last call (or none, at max_nodes)
    known = max(max(deaths[i], starts[i]) for i in dead) + TTL
    bound = max(known, max(starts)) + LAST_CALL + SLACK
    clock.env.run(until=bound)
    alive = [nodes[i] for i in range(n) if i not in dead]
    for node in alive:
        assert node.task is not None and not node.task.done(), (node.id, node.task)
        assert node.rounds, f"{node.id} never completed a round by t={bound:g}"
        size = node.rounds[-1][2]
        assert size == survivors, (node.id, node.rounds, f"bound {bound:g}")
    assert len({node.rounds[-1][1] for node in alive}) == 1
    assert clock.unobserved == []
