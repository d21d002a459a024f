"""The static rendezvous: a fixed set of ``world_size`` nodes with fixed ranks, meeting
through the store port.

Theory of operation
-------------------
Rounds are numbered.  A node joining a round writes ``kv``-free arrival key
``ctl/r<R>/n<rank>`` and waits (watching, not polling) for all ``world_size`` arrival
keys; the round's store is the prefix ``kv/r<R>``.  The highest announced round is
``ctl/round``.  Which round a node joins:

* the announced round ``R`` if this node has not taken part in it and it is not yet
  complete (a fresh agent after a node restart, or a node that others are waiting for);
* otherwise ``R + 1``, announced with compare-and-set (so a restarting node pulls the
  others into a new round).

While a round runs, :meth:`watch_async` waits on one watch of the ``ctl/`` prefix and
returns ``"nodes_waiting"`` when a later round is announced (the agent restarts without
spending its budget — torch's ``num_nodes_waiting``), ``"peer_lost"`` when a member's
lease key ``ctl/alive/<rank>`` vanished (its node died: the lease expired
``heartbeat_timeout`` after its last renewal), and ``"closed"`` after ``set_closed``.
Ranks never change: ``rank`` is the node rank the user gave.

What workers are told (``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_USE_AGENT_STORE``)
is true: no agent speaks torch's TCPStore protocol, so ``use_agent_store`` is False and
the workers' rank 0 hosts their own store.  On one node that is at ``--master-port``
(nothing of the agent's listens there); on several, node 0's agent hosts the
rendezvous store at ``--master-port`` (where torch hosts its TCPStore), so node 0
gives its workers another port, free on its machine, and publishes it.
"""

from __future__ import annotations

from typing import Any

from elastic.clock import Clock
from elastic.errors import ConfigError
from elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from elastic.rendezvous.prefix_store import PrefixStore
from elastic.store import Lease, Store

__all__ = ["StaticRendezvous", "create_static_handler"]


class StaticRendezvous(RendezvousHandler):
    """Fixed membership; rounds only re-synchronise the same nodes."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        run_id: str,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        timeout: float = 600,
        heartbeat_timeout: float = 15,
        worker_port: int | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} must be in [0, {world_size})")
        self._store = store
        self._clock = clock
        self._run_id = run_id
        self._rank = rank
        self._world_size = world_size
        self._master_addr = master_addr
        self._master_port = master_port
        self._worker_port = master_port if worker_port is None else worker_port
        self._timeout = timeout
        self._heartbeat_timeout = heartbeat_timeout
        self._base = f"static/{run_id}/"
        self._ctl = self._base + "ctl/"
        self._round = -1
        self._round_rev = 0
        self._lease: Lease | None = None

    def get_backend(self) -> str:
        return "static"

    @property
    def use_agent_store(self) -> bool:
        """False: the workers' rank 0 hosts their store (see the module docstring)."""
        return False

    def get_run_id(self) -> str:
        return self._run_id

    async def _announced(self) -> int:
        raw = await self._store.try_get(self._ctl + "round")
        return int(raw) if raw is not None else 0

    async def _arrivals(self, r: int) -> set[int]:
        _, items = await self._store.snapshot(f"{self._ctl}r{r}/n")
        return {int(k.rsplit("n", 1)[1]) for k in items}

    async def _announce(self, r: int) -> None:
        while True:
            cur = await self._store.try_get(self._ctl + "round")
            if cur is not None and int(cur) >= r:
                return
            if (
                await self._store.compare_set(self._ctl + "round", cur, str(r).encode())
                == str(r).encode()
            ):
                return

    async def next_rendezvous_async(self) -> RendezvousInfo:
        store = self._store
        if await store.try_get(self._ctl + "closed") is not None:
            raise RendezvousClosedError(f"the rendezvous of run {self._run_id!r} is closed")
        if self._lease is None or not self._lease.alive():
            self._lease = await store.grant_lease(self._heartbeat_timeout)
            await store.set(f"{self._ctl}alive/{self._rank}", b"1", lease=self._lease)
        announced = await self._announced()
        if (
            announced > self._round
            and self._rank not in await self._arrivals(announced)
            and len(await self._arrivals(announced)) < self._world_size
        ):
            target = announced
        else:
            target = max(announced, self._round) + 1
            await self._announce(target)
        self._round = target
        await store.set(f"{self._ctl}r{target}/n{self._rank}", b"1")
        deadline = self._clock.now() + self._timeout
        while True:
            rev, items = await store.snapshot(f"{self._ctl}r{target}/n")
            if len(items) >= self._world_size:
                break
            if await store.try_get(self._ctl + "closed") is not None:
                raise RendezvousClosedError(f"the rendezvous of run {self._run_id!r} is closed")
            remaining = deadline - self._clock.now()
            try:
                if remaining <= 0:
                    raise TimeoutError
                await store.watch(self._ctl, rev, timeout=remaining)
            except TimeoutError:
                arrived = {int(k.rsplit("n", 1)[1]) for k in items}
                missing = [str(i) for i in range(self._world_size) if i not in arrived]
                raise RendezvousTimeoutError(
                    f"static rendezvous round {target}: nodes {', '.join(missing)} did not "
                    f"arrive within {self._timeout:g}s"
                ) from None
        self._round_rev = (await store.snapshot(self._ctl))[0]
        round_store = PrefixStore(store, f"{self._base}kv/r{target}")
        info = await RendezvousStoreInfo.build_async(
            self._rank, round_store, self._master_addr, self._worker_port, self._timeout
        )
        return RendezvousInfo(round_store, self._rank, self._world_size, info, round=target)

    async def watch_async(self) -> str:
        store = self._store
        rev = self._round_rev
        while True:
            rev = await store.watch(self._ctl, rev)
            if await store.try_get(self._ctl + "closed") is not None:
                return "closed"
            if await self._announced() > self._round:
                return "nodes_waiting"
            _, alive = await store.snapshot(self._ctl + "alive/")
            if len(alive) < self._world_size:
                return "peer_lost"

    async def is_closed_async(self) -> bool:
        return await self._store.try_get(self._ctl + "closed") is not None

    async def set_closed_async(self) -> None:
        await self._store.set(self._ctl + "closed", b"1")

    async def num_nodes_waiting_async(self) -> int:
        announced = await self._announced()
        if announced <= self._round:
            return 0
        return len(await self._arrivals(announced))

    async def shutdown_async(self) -> bool:
        if self._lease is not None:
            await self._lease.revoke()
        return True


def create_static_handler(params: RendezvousParameters, ctx: Any) -> StaticRendezvous:
    """Build a static handler from torch-style parameters and a context with the ports.

    ``ctx`` carries ``store`` and ``clock`` (see :mod:`elastic.rendezvous.registry`).
    """
    rank = params.get_as_int("rank")
    if rank is None:
        raise ConfigError("--node-rank", "the static rendezvous needs this node's rank")
    endpoint = params.endpoint or ""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            "--rdzv-endpoint", f"got {endpoint!r}; the static rendezvous needs host:port"
        )
    timeout = params.get_as_int("timeout", 600) or 600
    heartbeat = params.get_as_int("heartbeat_timeout", 15) or 15
    worker_port = None
    if params.max_nodes > 1 and rank == 0:
        # node 0's agent hosts the rendezvous store at the master port
        chooser = getattr(ctx, "port_chooser", None)
        worker_port = int(chooser()) if chooser is not None else int(port) + 1
    return StaticRendezvous(
        ctx.store,
        ctx.clock,
        params.run_id,
        rank,
        params.max_nodes,
        host,
        int(port),
        timeout=float(timeout),
        heartbeat_timeout=float(heartbeat),
        worker_port=worker_port,
    )
