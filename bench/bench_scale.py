"""The simulator at scale: wall and CPU time, peak memory and simulated events per node per
job restart, for N nodes x 8 workers at the Llama 3 405B failure rates (the llama3-405b
preset) over D simulated days.  Each configuration runs in a fresh process (peak RSS is the
process's own).  Run:

    python bench/bench_scale.py --nodes 512 2048 --days 1 [--no-gc-tuning] [--min-fraction 0.5]

``--min-fraction F`` makes the rendezvous an elastic range, ``min_nodes`` = F x N (every
arrival past it learns how many live joiners came before it: the cost that ``arrive``
keeps O(1)); by default ``min_nodes`` = ``max_nodes`` = N.

Writes bench/results/scale.md (appends the rows it measured).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def scenario(nodes: int, days: float, min_nodes: int | None = None) -> str:
    return f"""name: bench llama3 rates, {nodes} x 8, {days} d
seed: 1
until: {days}d
cluster: {{nodes: {nodes}, nproc_per_node: 8, spare_nodes: {max(4, nodes // 128)}}}
job: {{steps: 100000000, step_time: 6s, startup_time: 5m,
      checkpoint_every: 300, checkpoint_time: 1m}}
rendezvous: {{min_nodes: {min_nodes or nodes}, max_nodes: {nodes}, join_timeout: 1h}}
agent: {{max_restarts: 100000}}
failures: llama3-405b
"""


def _one(nodes: int, days: float, gc_tuning: bool, lo: int | None) -> dict[str, object]:
    import sim.gcpause
    from sim.run import simulate
    from sim.scenario import load_scenario_text

    sim.gcpause.ENABLED = gc_tuning
    sc = load_scenario_text(scenario(nodes, days, lo), "bench")
    # resident memory now (not the peak) at each quarter of the simulated time: flat when
    # the run keeps nothing per round (issue 16)
    quarters: list[int] = []

    def sample(now: float, until: float) -> None:
        if now >= until * (len(quarters) + 1) / 4 - 1e-6:
            quarters.append(_rss_mib())

    wall0, cpu0 = time.perf_counter(), time.process_time()
    report = simulate(sc, progress=sample).report
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    rounds = int(report["rendezvous_rounds"])  # type: ignore[call-overload]
    sim_events = int(report["sim_events"])  # type: ignore[call-overload]
    restarts = max(rounds - 1, 1)
    return {
        "nodes": nodes,
        "min_nodes": lo or nodes,
        "days": days,
        "gc_tuning": gc_tuning,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_by_quarter_mib": "/".join(str(q) for q in quarters),
        "faults": sum(report["faults"].values()),  # type: ignore[attr-defined]
        "rendezvous_rounds": rounds,
        "sim_events": sim_events,
        "events_per_node_per_restart": round(sim_events / restarts / nodes, 1),
        "logged_events": report["events"],
        "state": report["state"],
        "ettr": report["ettr"],
    }


def _rss_mib() -> int:
    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * resource.getpagesize() / 2**20)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--days", type=float, nargs="+", default=[1.0])
    ap.add_argument("--no-gc-tuning", action="store_true")
    ap.add_argument("--min-fraction", type=float, default=1.0)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        lo = max(1, round(args.nodes[0] * args.min_fraction))
        print(json.dumps(_one(args.nodes[0], args.days[0], not args.no_gc_tuning, lo)))
        return
    rows = []
    for nodes in args.nodes:
        for days in args.days:
            cmd = [sys.executable, __file__, "--one", "--nodes", str(nodes), "--days", str(days)]
            if args.no_gc_tuning:
                cmd.append("--no-gc-tuning")
            cmd += ["--min-fraction", str(args.min_fraction)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
            row = json.loads(out.stdout)
            print(json.dumps(row), flush=True)
            rows.append(row)
    keys = list(rows[0])
    lines = [
        f"<!-- python bench/bench_scale.py {' '.join(sys.argv[1:])} on {platform.machine()}, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')} -->",
        "| " + " | ".join(keys) + " |",
        "|" + "---|" * len(keys),
        *("| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows),
        "",
    ]
    path = ROOT / "bench" / "results" / "scale.md"
    if not path.exists():
        path.write_text("# The simulator at scale (bench/bench_scale.py)\n\n")
    with path.open("a") as handle:
        handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
