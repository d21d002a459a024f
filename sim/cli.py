"""``elastic sim``: run a YAML failure scenario in the simulator.

Exit codes: 0 — the run met every expectation; 1 — some expectation failed (each is
listed with the value seen) or ``--check-determinism`` found two different logs;
2 — bad input (one line: file:line, key, value, what was expected); 3 — an internal
error of the simulation (with the command that replays it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from elastic.errors import ConfigError
from sim.expect import check
from sim.run import simulate
from sim.scenario import Scenario, load_scenario

__all__ = ["main", "report_main"]


def _sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elastic sim",
        description="Run a YAML failure scenario in the simulator, with the real agent code.",
    )
    p.add_argument("scenario", help="the scenario file (YAML)")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--events", metavar="FILE", help="write the event log (JSON lines) here")
    p.add_argument(
        "--check-determinism",
        action="store_true",
        help="run twice and fail unless both event logs are byte-identical",
    )
    p.add_argument(
        "--plot", metavar="FILE", help="draw the timeline (PNG/SVG/PDF; needs matplotlib)"
    )
    p.add_argument(
        "--write-faults",
        metavar="FILE",
        help="write the scenario back with every fault explicit (rate faults drawn)",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="measured defaults (JSON), e.g. bench/results/warm.json for job.preload_saves",
    )
    return p


def _log_bytes(events: Sequence[Any]) -> bytes:
    return "".join(e.to_json() + "\n" for e in events).encode()


def _human(report: dict[str, Any], failures: list[str]) -> str:
    rows = [
        ("scenario", report.get("name", "")),
        ("seed", report["seed"]),
        ("state", report["state"]),
        ("run time", f"{report['sim_time_s']:.3f} s ({report['sim_time_s'] / 3600:.2f} h)"),
        ("steps done", report["steps_done"]),
        ("goodput", f"{report['goodput']:.4f}"),
        ("world size", report["world_size"]),
        ("restarts (budget)", report["restarts"]),
        ("membership restarts", report["membership_restarts"]),
        ("rendezvous rounds", report["rendezvous_rounds"]),
        ("hangs detected", report["hangs_detected"]),
        (
            "recovery",
            f"{report['recovery_count']} recoveries, max {report['recovery_s_max']:.1f} s"
            + (
                " ("
                + ", ".join(f"{r:.1f}" for r in report["recovery_s"][:8])
                + (", …" if len(report["recovery_s"]) > 8 else "")
                + " s)"
                if report["recovery_s"]
                else ""
            ),
        ),
        ("final nodes", report["final_nodes"]),
        ("events", f"{report['events']} logged, {report['sim_events']} simulated"),
        ("wall time", f"{report['wall_s']:.3f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"  {k:<{width}}  {v}" for k, v in rows]
    if failures:
        lines.append("expectations FAILED:")
        lines += [f"  - {f}" for f in failures]
    elif report.get("_expected"):
        lines.append("expectations met")
    return "\n".join(lines)


def _plot(events: Sequence[Any], path: str, title: str) -> int:
    try:
        from sim.plot import plot_timeline

        plot_timeline(events, path, title)
    except ImportError:
        print("elastic: --plot needs matplotlib: pip install 'elastic[plot]'", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"elastic: --plot {path}: cannot write it: {e.strerror}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str]) -> int:
    args = _sim_parser().parse_args(list(argv))
    try:
        scenario = load_scenario(args.scenario)
        if args.seed is not None:
            scenario = scenario.with_seed(args.seed)
        if args.calibration is not None:
            from sim.calibration import apply_calibration, load_calibration

            scenario = apply_calibration(scenario, load_calibration(args.calibration))
    except ConfigError as e:
        print(f"elastic sim: {e}", file=sys.stderr)
        return 2
    result = simulate(scenario)
    report = dict(result.report)
    unobserved: list[str] = next(
        (list(e.fields["unobserved_errors"]) for e in result.events if e.kind == "sim.end"), []
    )
    if unobserved:
        print(
            f"elastic sim: internal error in the simulation: {unobserved[0]} — replay with: "
            f"elastic sim {args.scenario} --seed {scenario.seed}",
            file=sys.stderr,
        )
        return 3
    if args.check_determinism:
        again = simulate(scenario)
        a, b = _log_bytes(result.events), _log_bytes(again.events)
        report["event_log_sha256"] = hashlib.sha256(a).hexdigest()
        if a != b:
            print(
                f"elastic sim: NOT deterministic: two runs of {args.scenario} with seed "
                f"{scenario.seed} gave different event logs",
                file=sys.stderr,
            )
            return 1
    if args.events:
        with open(args.events, "wb") as f:
            f.write(_log_bytes(result.events))
    if args.plot:
        code = _plot(result.events, args.plot, scenario.name)
        if code:
            return code
    if args.write_faults:
        explicit: Scenario = scenario.with_faults(result.faults)
        with open(args.write_faults, "w") as f:
            f.write(explicit.to_yaml())
    failures = check(scenario.expect, report)
    report["expect_failures"] = failures
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        report["_expected"] = bool(list(scenario.expect.items()))
        print(_human(report, failures))
        if failures:
            print(f"replay: elastic sim {args.scenario} --seed {scenario.seed}")
    return 1 if failures else 0


def report_main(argv: Sequence[str]) -> int:
    """``elastic report EVENTS.jsonl [--json]``: the report of any run, real or simulated."""
    p = argparse.ArgumentParser(
        prog="elastic report",
        description="Build the run report from a JSON-lines event log "
        "(elastic run --event-log, or elastic sim --events).",
    )
    p.add_argument("events", help="the event log")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument(
        "--plot", metavar="FILE", help="draw the timeline (PNG/SVG/PDF; needs matplotlib)"
    )
    args = p.parse_args(list(argv))
    from elastic.events import read_events
    from sim.report import build_report

    try:
        with open(args.events, encoding="utf-8") as f:
            events = read_events(f)
    except OSError as e:
        print(f"elastic report: {args.events}: cannot read it: {e.strerror}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError) as e:
        print(f"elastic report: {args.events}: not an event log ({e})", file=sys.stderr)
        return 2
    report = build_report(events)
    if args.plot and (code := _plot(events, args.plot, args.events)):
        return code
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    report.setdefault("sim_events", 0)
    report.setdefault("wall_s", 0.0)
    print(_human(report, []))
    return 0
