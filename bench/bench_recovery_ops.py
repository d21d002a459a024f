"""One recovery's round trips on the network store: what the store host answers.

Run:  python bench/bench_recovery_ops.py [--nodes 2]

``--nodes`` DynamicRendezvousHandler instances (each with its own NetStoreClient
connection, member info given as the agent does) complete a round through a StoreServer
on loopback; every member then watches the round (the agent's ``watch_async``); node 0
asks for the next round (its group failed) and the others, woken by the round's end,
ask too.  The requests the host decodes from then until every node has its new round
and the store has been quiet for 0.3 s are counted by op (renewals and pings left
out): the round trips of one recovery.  Deterministic on an idle loop; compare two
trees with ``PYTHONPATH=<tree> python <tree>/bench/bench_recovery_ops.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
from typing import Any

from elastic.real import netstore
from elastic.real.clock import AsyncioClock
from elastic.real.netstore import NetStoreClient, StoreServer
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)

_QUIET = ("hello", "ping", "keepalive")


def _count_requests(ops: collections.Counter[str]) -> None:
    decode = netstore.decode_request

    def counting(body: bytes, max_frame: int = netstore.MAX_FRAME) -> Any:
        req = decode(body, max_frame)
        if req.op not in _QUIET:
            ops[req.op] += 1
        return req

    netstore.decode_request = counting  # type: ignore[assignment]


async def recovery(nodes: int) -> tuple[int, collections.Counter[str]]:
    ops: collections.Counter[str] = collections.Counter()
    _count_requests(ops)
    server = StoreServer("127.0.0.1", 0)
    await server.start()
    clock = AsyncioClock()
    clients = [
        await NetStoreClient.connect("127.0.0.1", server.port, clock=clock, read_timeout=10)
        for _ in range(nodes)
    ]
    settings = RendezvousSettings("job", nodes, nodes, RendezvousTimeout(30.0, 1.0, 5.0))
    hs = [
        DynamicRendezvousHandler(f"n{i}", "127.0.0.1", settings, "c10d", c, clock)
        for i, c in enumerate(clients)
    ]
    for h in hs:
        h.set_member_info("trainer", 1)
    try:
        await asyncio.gather(*(h.next_rendezvous_async() for h in hs))
        watches = [asyncio.create_task(h.watch_async()) for h in hs[1:]]
        await asyncio.sleep(0.3)
        first = sum(ops.values())
        ops.clear()
        again = [asyncio.create_task(hs[0].next_rendezvous_async())]
        for h, w in zip(hs[1:], watches, strict=True):
            assert await w == "restarted"
            again.append(asyncio.create_task(h.next_rendezvous_async()))
        await asyncio.gather(*again)
        await asyncio.sleep(0.3)  # quiet: whatever the recovery sends has been counted
        return first, collections.Counter(ops)
    finally:
        for h in hs:
            await h.leave_async()
        for c in clients:
            await c.aclose()
        await server.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    first, ops = asyncio.run(recovery(args.nodes))
    detail = ", ".join(f"{op} {n}" for op, n in sorted(ops.items()))
    total = ops.total()
    print(f"{args.nodes} nodes: first round {first} requests; one recovery {total} ({detail})")


if __name__ == "__main__":
    main()
