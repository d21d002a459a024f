"""Simulator benchmark: 64 nodes x 8 workers over 24 simulated hours, a worker crash every hour.

Reports simulated (simpy) events per wall second, events per restart and wall time, and
writes bench/results/sim.md.  Run:  python bench/bench_sim.py [--repeat N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

from sim.run import simulate
from sim.scenario import load_scenario_text

HOURS = 24


def scenario(nodes: int = 64, nproc: int = 8) -> str:
    faults = "\n".join(
        f"  - {{at: {h}h, kind: worker_crash, node: {(h * 7) % nodes}, local_rank: {h % nproc}}}"
        for h in range(1, HOURS)
    )
    return f"""name: bench {nodes}x{nproc}, 24 h, a worker crash every hour
seed: 0
until: {HOURS}h
cluster: {{nodes: {nodes}, nproc_per_node: {nproc}}}
job: {{steps: 100000, step_time: 1s, startup_time: 60s,
      checkpoint_every: 600, checkpoint_time: 20s}}
agent: {{max_restarts: 100}}
faults:
{faults}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sc = load_scenario_text(scenario(), "bench")
    walls: list[float] = []
    report: dict[str, object] = {}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        report = simulate(sc).report
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    sim_events = int(report["sim_events"])  # type: ignore[arg-type]
    restarts_total = HOURS - 1  # one group restart of the job per injected crash
    rows = [
        (f"wall time (median of {args.repeat})", f"{wall:.2f} s"),
        ("simulated time", f"{float(report['sim_time_s']) / 3600:.1f} h"),  # type: ignore[arg-type]
        ("simulated events", f"{sim_events}"),
        ("events per wall second", f"{sim_events / wall:,.0f}"),
        ("logged events", f"{report['events']}"),
        ("job restarts (one per crash)", f"{restarts_total}"),
        ("simulated events per restart", f"{sim_events / restarts_total:,.0f}"),
        ("simulated events per restart per node", f"{sim_events / restarts_total / 64:,.1f}"),
        ("goodput", f"{report['goodput']}"),
        ("state", f"{report['state']}"),
    ]
    text = [
        "# Simulator benchmark",
        "",
        f"Command: `python bench/bench_sim.py --repeat {args.repeat}` on "
        f"{platform.machine()}, Python {platform.python_version()}, 2 cores.",
        "",
        "64 nodes x 8 workers, 24 simulated hours, a worker crash every hour (23 crashes),",
        "c10d rendezvous, 1 ms store latency.",
        "",
        "| figure | value |",
        "|---|---|",
    ] + [f"| {k} | {v} |" for k, v in rows]
    out = Path(__file__).parent / "results" / "sim.md"
    out.write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
