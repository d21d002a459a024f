"""One dynamic rendezvous of N simulated nodes: wall time, simulator events, store traffic.

Run:  python bench/bench_rendezvous.py [--sizes 10,100,1000,4000] [--ranks result|exchange]
      [--out FILE.md]

Each node is a DynamicRendezvousHandler on its own client of the simulated store host
(``sim.store.SimStoreHost``, 1 ms per store round trip).  Nodes arrive uniformly over
5 simulated seconds (seeded), ``min_nodes = N/2``, ``max_nodes = N``: the round
completes when the last node arrives.  Each node then learns its ranks as the agent does:
from the round's result (``--ranks result``, the default: the agent's role and local world
size given to the handler first) or, as torch does and as the agent does for a handler
whose round carries none, through the round's store (``--ranks exchange``).  Per-node
figures should stay flat as N grows
(O(N) in total) — torch's whole-state CAS protocol is O(N²) in bytes (PR #124982:
4,000 hosts took 373 s).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from elastic.agent.ranks import AgentAssignment, exchange_ranks_in_round
from elastic.rendezvous import RendezvousInfo
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from sim.clock import SimClock
from sim.store import SimStoreHost

LATENCY = 0.001
ARRIVAL_WINDOW = 5.0
SEED = 1


ROLE, LOCAL_WORLD_SIZE = "trainer", 8


def one(n: int, exchange: bool = False) -> dict[str, float]:
    clock = SimClock()
    host = SimStoreHost(clock, latency=LATENCY)
    settings = RendezvousSettings("bench", max(1, n // 2), n, RendezvousTimeout())
    rng = random.Random(SEED)
    infos: list[RendezvousInfo] = []
    done: list[float] = []

    async def node(i: int, at: float) -> None:
        await clock.sleep(at)
        h = DynamicRendezvousHandler(
            f"node{i:05d}",
            f"10.0.{i // 256}.{i % 256}",
            settings,
            "c10d",
            host.client(i),
            clock,
        )
        if not exchange:
            h.set_member_info(ROLE, LOCAL_WORLD_SIZE)
        info = await h.next_rendezvous_async()
        ranks = info.assignment
        if ranks is None:
            got = await exchange_ranks_in_round(clock, h, info, ROLE, LOCAL_WORLD_SIZE, 600.0)
            assert isinstance(got, AgentAssignment), got
            ranks = got
        assert ranks.base_global_rank == info.rank * LOCAL_WORLD_SIZE
        infos.append(info)
        done.append(clock.now())

    for i in range(n):
        clock.spawn(node(i, rng.uniform(0, ARRIVAL_WINDOW)), name=f"node{i}")
    t0 = time.perf_counter()
    clock.env.run()
    wall = time.perf_counter() - t0
    if clock.unobserved:
        raise clock.unobserved[0][1]
    assert len(infos) == n and sorted(i.rank for i in infos) == list(range(n))
    stats = host.store.stats
    events = clock.events()  # queue entries scheduled so far (sim/clock.py _Env)
    return {
        "n": n,
        "wall": wall,
        "sim_end": max(done),
        "events": events,
        "ops": stats.ops,
        "bytes": stats.bytes_written,
        "keys_read": stats.keys_read,
    }


def table(rows: list[dict[str, float]]) -> str:
    out = [
        "| N | wall s | all ranked at (sim s) | sim events | events/node | store ops | ops/node "
        "| bytes written | bytes/node | keys read/node |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        n = r["n"]
        out.append(
            f"| {n:.0f} | {r['wall']:.2f} | {r['sim_end']:.3f} | {r['events']:.0f} "
            f"| {r['events'] / n:.1f} | {r['ops']:.0f} | {r['ops'] / n:.1f} "
            f"| {r['bytes']:.0f} | {r['bytes'] / n:.1f} | {r['keys_read'] / n:.1f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,1000,4000")
    ap.add_argument(
        "--ranks",
        choices=("result", "exchange"),
        default="result",
        help="ranks from the round's result (default) or torch's store exchange",
    )
    ap.add_argument("--out", default="bench/results/rendezvous.md")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = [one(n, args.ranks == "exchange") for n in sizes]
    text = table(rows)
    print(text)
    if args.out:
        cmd = "python bench/bench_rendezvous.py " + " ".join(argv or sys.argv[1:])
        Path(args.out).write_text(
            "# One dynamic rendezvous of N simulated nodes\n\n"
            f"Command: `{cmd.strip()}`\n\n"
            f"Store: `sim.store.SimStoreHost`, {LATENCY * 1000:g} ms per round trip; arrivals "
            f"uniform over {ARRIVAL_WINDOW:g} s (seed {SEED}); min_nodes = N/2, max_nodes = N "
            "(the round completes when the last node arrives); ranks "
            + (
                "through the round's store (torch's exchange)"
                if args.ranks == "exchange"
                else "from the round's result"
            )
            + ".  `bytes written` counts key + "
            "value of every write, including each round's MASTER_ADDR/PORT; `keys read` the "
            "keys returned by reads of a prefix (snapshots, a wake's read).\n\n"
            f"{text}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
