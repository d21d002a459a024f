"""Where the simulator's events come from: every simpy event a run schedules, counted by
its source (the code that created it), per node per job restart: the events scheduled, and
how many of them opened a queue entry of their own (the report's ``sim_events``; events due at
the same instant share one, see sim/clock.py ``_Env``).

The scenario is bench/bench_scale.py's (the Llama 3 405B failure rates, N nodes x 8
workers).  Run:

    python bench/bench_events.py --nodes 512 --days 1 [--top 30]

Prints a markdown table, most frequent source first.  Measurement only: the hook costs time
(it reads the Python stack on every event), so its wall time is not the simulator's.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

_SIMPY = os.sep + "simpy" + os.sep
_CLOCK = str(ROOT / "sim" / "clock.py")


def _site(frame: FrameType | None) -> str:
    """The first two frames outside simpy and sim/clock.py, and the clock function used."""
    via = ""
    parts: list[str] = []
    while frame is not None and len(parts) < 2:
        name = frame.f_code.co_filename
        if _SIMPY in name:
            pass
        elif name == _CLOCK:
            if not via and frame.f_code.co_name not in ("schedule", "wake_after", "__init__"):
                via = frame.f_code.co_name
        else:
            rel = os.path.relpath(name, ROOT) if name.startswith(str(ROOT)) else name
            if rel.startswith("/") or "bench_events" in rel:
                break
            parts.append(f"{rel}:{frame.f_code.co_name}")
        frame = frame.f_back
    return (f"[{via}] " if via else "") + " <- ".join(parts)


def _task_name(task: Any) -> str:
    """What a SimClock task (sim.clock._Task, scheduled as its own event when it ends)
    was spawned as: its name, else its coroutine's qualified name."""
    return str(getattr(task, "name", "") or getattr(task, "_coro", None) or "?")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()

    import simpy.events
    from bench_scale import scenario

    import sim.clock
    from sim.run import simulate
    from sim.scenario import load_scenario_text

    counts: Counter[tuple[str, str]] = Counter()  # events scheduled, by source
    entries: Counter[tuple[str, str]] = Counter()  # of which opened a queue entry
    orig = sim.clock._Env.schedule

    def schedule(self: Any, event: Any, priority: int = 1, delay: float = 0) -> None:
        kind = type(event).__name__
        site = _site(sys._getframe(1))
        if site.endswith("sim/run.py:simulate") and "<-" not in site:
            site = ""  # fired inside simpy's loop: name it by what it is
        if isinstance(event, sim.clock._Task) and not site:
            site = "task end: " + _task_name(event)
        elif isinstance(event, simpy.events.Condition) and not site:
            site = "fired; made at " + made.get(id(event), "?")
        elif not site:
            site = "(simpy internal)"
        counts[(kind, site)] += 1
        # a new queue entry unless its (time, priority) has one open (sim/clock.py _Env)
        if priority == sim.clock.NORMAL:
            opened = self.now + delay not in self._open_normal
        elif priority == sim.clock.URGENT and not delay:
            opened = self._urgent_open is None
        else:
            opened = (self.now + delay, priority) not in self._open
        if opened:
            entries[(kind, site)] += 1
        orig(self, event, priority, delay)

    made: dict[int, str] = {}
    cond_init = simpy.events.Condition.__init__

    def condition(self: Any, *a: Any, **k: Any) -> None:
        made[id(self)] = _site(sys._getframe(1))
        cond_init(self, *a, **k)

    simpy.events.Condition.__init__ = condition  # type: ignore[method-assign]
    sim.clock._Env.schedule = schedule  # type: ignore[method-assign]
    sc = load_scenario_text(scenario(args.nodes, args.days), "bench")
    report = simulate(sc).report
    sim.clock._Env.schedule = orig  # type: ignore[method-assign]

    total = sum(counts.values())
    total_entries = sum(entries.values())
    rounds = int(report["rendezvous_rounds"])
    restarts = max(rounds - 1, 1)
    per = restarts * args.nodes
    print(
        f"<!-- python bench/bench_events.py --nodes {args.nodes} --days {args.days:g} -->\n"
        f"{args.nodes} nodes, {args.days:g} d, {rounds} rounds: {report['sim_events']} simulated "
        f"events (queue entries: {total_entries / per:.1f} per node per restart) for {total} "
        f"simpy events scheduled ({total / per:.1f} per node per restart)\n"
    )
    print("| queue entries/node/restart | simpy events/node/restart | event type | source |")
    print("|---:|---:|---|---|")
    for (kind, site), n in counts.most_common(args.top):
        print(f"| {entries[(kind, site)] / per:.2f} | {n / per:.2f} | {kind} | `{site}` |")


if __name__ == "__main__":
    main()
