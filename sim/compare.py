"""``elastic compare SCENARIO.yaml``: one scenario in both worlds, side by side.

Runs the scenario in the simulator (with this machine's calibration, scaled like the
real run) and for real (:mod:`sim.realrun`) with the same seed, and prints per fault the
recovery time in each world (from the moment the fault broke the training to the moment
a new world ran: the report's ``recovery_s``, attributed to the fault before it) and
their ratio, then the report's fields side by side.

A fault's recovery agrees when the simulator is within ``--tolerance`` (10 %) of the
real one, or within ``--floor`` (50 ms) where the real one is under half a second;
restart counts, world sizes and rendezvous rounds must be identical.  Exit status: 0
when everything agrees, 1 when something does not, 2 for bad input.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from elastic.errors import ConfigError
from elastic.events import AgentEvent
from sim.calibration import Calibration, load_calibration, scenario_calibration
from sim.cliparse import OneLineParser, seed
from sim.scenario.expand import expand_faults, fault_rng
from sim.scenario.model import Scenario
from sim.scenario.reader import load_scenario

__all__ = ["Comparison", "compare", "fault_recoveries", "main"]

# fields that must be equal in both worlds, and fields shown for the record
EXACT = (
    "state",
    "restarts",
    "membership_restarts",
    "rendezvous_rounds",
    "world_size",
    "hangs_detected",
)
SHOWN = (*EXACT, "steps_done", "goodput", "final_nodes", "recovery_count")


def fault_recoveries(events: Sequence[AgentEvent]) -> list[dict[str, Any]]:
    """Per injected fault: the break it caused and the recovery (None if it broke nothing).

    A fault's break is the first ``sim.world_broken`` from its time until the next
    fault's; its recovery ends at the next ``sim.world_running``.
    """
    evs = sorted(events, key=lambda e: e.t)
    faults = [e for e in evs if e.kind == "sim.fault"]
    breaks = [e.t for e in evs if e.kind == "sim.world_broken"]
    runs = [e.t for e in evs if e.kind == "sim.world_running"]
    out = []
    for i, f in enumerate(faults):
        nxt = faults[i + 1].t if i + 1 < len(faults) else float("inf")
        b = next((t for t in breaks if f.t - 1e-6 <= t < nxt), None)
        r = next((t for t in runs if b is not None and t >= b), None)
        out.append(
            {
                "index": f.fields.get("index", i),
                "fault": f.fields.get("fault", ""),
                "target": f.fields.get("target"),
                "at": round(f.t, 6),
                "broke_at": None if b is None else round(b, 6),
                "recovery_s": None if b is None or r is None else round(r - b, 6),
            }
        )
    return out


def within(sim: float, real: float, tolerance: float, floor: float) -> bool:
    if real < 0.5 and abs(sim - real) <= floor:
        return True
    return abs(sim - real) <= tolerance * real


class Comparison:
    """The two runs of one scenario and how far apart they are."""

    def __init__(
        self,
        sc: Scenario,
        sim: dict[str, Any],
        real: dict[str, Any],
        sim_faults: list[dict[str, Any]],
        real_faults: list[dict[str, Any]],
        time_scale: float,
        tolerance: float,
        floor: float,
    ) -> None:
        self.sc = sc
        self.sim = sim
        self.real = real
        self.time_scale = time_scale
        self.tolerance = tolerance
        self.floor = floor
        self.faults: list[dict[str, Any]] = []
        by_index = {f["index"]: f for f in real_faults}
        for s in sim_faults:
            r = by_index.get(s["index"], {})
            row = {
                "index": s["index"],
                "fault": s["fault"],
                "target": s["target"],
                "at": s["at"],
                "sim_s": s["recovery_s"],
                "real_s": r.get("recovery_s"),
            }
            a, b = row["sim_s"], row["real_s"]
            if a is None and b is None:
                row["ok"] = True
            elif a is None or b is None:
                row["ok"] = False
            else:
                row["ratio"] = round(a / b, 4) if b else None
                row["error"] = round(abs(a - b) / b, 4) if b else None
                row["ok"] = within(a, b, tolerance, floor)
            self.faults.append(row)
        self.mismatches = [k for k in EXACT if sim.get(k) != real.get(k)]

    @property
    def errors(self) -> list[float]:
        return [r["error"] for r in self.faults if r.get("error") is not None]

    @property
    def median_error(self) -> float:
        return statistics.median(self.errors) if self.errors else 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatches and all(r["ok"] for r in self.faults)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.sc.name,
            "source": self.sc.source,
            "seed": self.sc.seed,
            "time_scale": self.time_scale,
            "tolerance": self.tolerance,
            "faults": self.faults,
            "median_error": round(self.median_error, 4),
            "fields": {k: {"sim": self.sim.get(k), "real": self.real.get(k)} for k in SHOWN},
            "mismatches": self.mismatches,
            "ok": self.ok,
        }

    def table(self) -> str:
        lines = [
            f"{self.sc.name} (seed {self.sc.seed}, real at time scale {self.time_scale:g})",
            f"  {'fault':<22} {'at':>9} {'sim s':>9} {'real s':>9} {'ratio':>7}  ok",
        ]
        for r in self.faults:
            what = r["fault"] + (f" n{r['target']}" if r["target"] is not None else "")
            sim_s = "-" if r["sim_s"] is None else f"{r['sim_s']:.3f}"
            real_s = "-" if r["real_s"] is None else f"{r['real_s']:.3f}"
            ratio = f"{r['ratio']:.3f}" if r.get("ratio") is not None else "-"
            lines.append(
                f"  {what:<22} {r['at']:>9.2f} {sim_s:>9} {real_s:>9} {ratio:>7}  "
                + ("yes" if r["ok"] else "NO")
            )
        lines.append(f"  {'field':<22} {'sim':>14} {'real':>14}")
        for k in SHOWN:
            a, b = self.sim.get(k), self.real.get(k)
            mark = "  NO" if k in self.mismatches else ""
            lines.append(f"  {k:<22} {a!s:>14} {b!s:>14}{mark}")
        lines.append(
            f"  median error {self.median_error * 100:.2f} %; "
            + ("the worlds agree" if self.ok else "the worlds DISAGREE")
        )
        return "\n".join(lines)


def compare(
    sc: Scenario,
    time_scale: float,
    calibration: Calibration | None,
    tolerance: float = 0.10,
    floor: float = 0.05,
) -> Comparison:
    from sim.realrun import real_run
    from sim.run import simulate

    s = simulate(sc, calibration=calibration, time_scale=time_scale, keep_events=True)
    r = real_run(sc, time_scale)
    return Comparison(
        sc,
        s.report,
        r.report,
        fault_recoveries(s.events),
        fault_recoveries(r.events),
        time_scale,
        tolerance,
        floor,
    )


def main(argv: Sequence[str]) -> int:
    """Run a scenario in both worlds and print, per fault, the recovery time in each."""
    p = OneLineParser(
        prog="elastic compare",
        description="Run a scenario in the simulator and on real processes with the same "
        "seed; per fault, the recovery time in each world and their ratio.",
    )
    p.add_argument("scenario", help="the scenario file (YAML)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="K")
    p.add_argument("--seed", type=seed, default=None, help="override the scenario's seed")
    p.add_argument("--calibration", metavar="FILE", help="default: the scenario's calibration: key")
    p.add_argument("--tolerance", type=float, default=10.0, metavar="PCT")
    p.add_argument("--floor", type=float, default=0.05, metavar="S")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    args = p.parse_args(list(argv))
    from sim.realrun import refusal

    try:
        if not 0 < args.time_scale < float("inf"):
            raise ConfigError("--time-scale", f"got {args.time_scale}; expected K > 0")
        if not 0 <= args.tolerance < 1000:
            raise ConfigError("--tolerance", f"got {args.tolerance}; expected a percentage")
        sc = load_scenario(args.scenario)
        if args.seed is not None:
            sc = sc.with_seed(args.seed)
        why = refusal(sc, expand_faults(sc, fault_rng(sc.seed)))
        if why is not None:
            raise ConfigError(args.scenario, why)
        cal = load_calibration(args.calibration) if args.calibration else scenario_calibration(sc)
    except ConfigError as e:
        print(f"elastic compare: {e}", file=sys.stderr)
        return 2
    c = compare(sc, args.time_scale, cal, args.tolerance / 100, args.floor)
    if args.json:
        print(json.dumps(c.to_dict(), sort_keys=True))
    else:
        print(c.table())
    return 0 if c.ok else 1
