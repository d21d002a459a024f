"""``elastic sim`` and ``elastic report``: run a YAML failure scenario in the simulator,
and the report of any saved event log.

Exit codes: 0 — the run met every expectation; 1 — some expectation failed (each is
listed with the value seen, and the causes of the run's end) or ``--check-determinism``
found two different logs; 2 — bad input (one line: file:line, key, value, what was
expected; output paths are checked before the run); 3 — an internal error of the
simulation (with the command that replays it).  A closed output pipe ends the command
quietly (141, as a tool killed by SIGPIPE); Ctrl-C prints one line and exits 130
(:func:`elastic.cli.main` handles both for every plugin command).

Progress goes to stderr, through tqdm, only when stderr is a terminal and never with
``--json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import IO, Any

from elastic.errors import ConfigError
from elastic.events import FanOutSink
from sim.calibration import apply_calibration, load_calibration, scenario_calibration
from sim.cliparse import OneLineParser, seed
from sim.expect import check
from sim.losses import summary_rows
from sim.run import SimResult, simulate
from sim.scenario.model import Scenario
from sim.scenario.reader import load_scenario

__all__ = ["main", "report_main"]


def _sim_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="elastic sim",
        description="Run a YAML failure scenario in the simulator, with the real agent code.",
    )
    p.add_argument("scenario", help="the scenario file (YAML)")
    p.add_argument(
        "--seed", type=seed, default=None, help="override the scenario's seed (0 to 2**63-1)"
    )
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
        "--calibration",
        metavar="FILE",
        help="apply this machine's measurements (a file from elastic calibrate: latencies; "
        "bench/results/warm.json: job.preload_saves; default: the scenario's calibration: "
        "key)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="K",
        help="with a calibration: model a real run at elastic real --time-scale K "
        "(its wall latencies are K times as long in scenario time)",
    )
    p.add_argument(
        "--write-faults",
        metavar="FILE",
        help="write the scenario back with every fault explicit (rate faults drawn)",
    )
    return p


#: The formats ``--plot`` writes, by file extension.
PLOT_FORMATS = (".png", ".svg", ".pdf")


def _output_problem(flag: str, path: str) -> str | None:
    """Why ``path`` cannot be written, as the one line to print; None if it can."""
    if not path:
        return f"{flag}: an empty path; expected a file to write"
    if os.path.isdir(path):
        return f"{flag} {path}: is a directory; expected a file to write"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{flag} {path}: the directory {parent} does not exist"
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{flag} {path}: not writable"
    if flag == "--plot" and os.path.splitext(path)[1].lower() not in PLOT_FORMATS:
        ext = os.path.splitext(path)[1] or "no extension"
        return f"--plot {path}: unknown format {ext!r}; expected one of {', '.join(PLOT_FORMATS)}"
    return None


def _write(flag: str, path: str, data: bytes) -> str | None:
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        return f"{flag} {path}: cannot write it: {e.strerror}"
    return None


@contextmanager
def _progress_bar(enabled: bool, label: str) -> Iterator[Callable[[float, float], None] | None]:
    """A progress callback for :func:`sim.run.simulate` drawing a tqdm bar on stderr, or
    None when progress is off (stderr not a terminal, or ``--json``)."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    bar: Any = None
    hours = [0.0]

    def update(now: float, until: float) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(
                total=round(until / 3600, 2),
                unit="h",
                desc=f"{label} (simulated hours, at most)",
                file=sys.stderr,
                leave=False,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} h [{elapsed}]",
            )
        bar.update(round(now / 3600 - hours[0], 4))
        hours[0] = now / 3600

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


def _log_bytes(events: Sequence[Any]) -> bytes:
    return "".join(e.to_json() + "\n" for e in events).encode()


class _LogSink:
    """The event log as it happens, never held: its SHA-256 and, given a path, the file.

    The file is written to a temporary file beside ``path`` and put in place by
    :meth:`commit` once the run is judged (a run with an internal error, or one that
    is not deterministic, writes nothing, as when the log was written after the run).
    A write error is kept and reported after the run: an event sink must not raise
    into the agents.
    """

    def __init__(self, path: str | None = None) -> None:
        self.sha256 = hashlib.sha256()
        self.path = path
        self._tmp: str | None = None
        self._file: IO[bytes] | None = None
        self.error: OSError | None = None
        if path is not None:
            try:
                if os.path.exists(path) and not os.path.isfile(path):
                    # a pipe or a terminal (/dev/stdout): written as it happens, in place
                    self._file = open(path, "wb")  # noqa: SIM115  # closed by commit/discard
                else:
                    fd, self._tmp = tempfile.mkstemp(
                        prefix=".events-",
                        suffix=".partial",
                        dir=os.path.dirname(os.path.abspath(path)),
                    )
                    self._file = os.fdopen(fd, "wb")
            except OSError as e:
                self.error = e

    def emit_group(self, group: Any) -> None:
        """A group of workers' events, one line each (the log is the same either way)."""
        for e in group.events():
            self.emit(e)

    def emit(self, event: Any) -> None:
        line = (event.to_json() + "\n").encode()
        self.sha256.update(line)
        if self._file is not None:
            try:
                self._file.write(line)
            except OSError as e:
                self.error = e
                self.discard()

    def commit(self, flag: str) -> str | None:
        """Put the file in place; the one line to print if it cannot be."""
        if self.path is None:
            return None
        try:
            if self.error is not None:
                raise self.error
            assert self._file is not None
            self._file.close()
            self._file = None
            if self._tmp is None:
                return None  # written in place
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self._tmp, 0o666 & ~umask)  # as open() would have made it
            os.replace(self._tmp, self.path)
            self._tmp = None
        except OSError as e:
            self.discard()
            return f"{flag} {self.path}: cannot write it: {e.strerror}"
        return None

    def discard(self) -> None:
        if self._file is not None:
            with suppress(OSError):
                self._file.close()
            self._file = None
        if self._tmp is not None:
            with suppress(OSError):
                os.unlink(self._tmp)
            self._tmp = None


def _human(report: dict[str, Any], failures: list[str]) -> str:
    if "sim_time_s" not in report:
        return _human_real(report, failures)
    rows = [
        ("scenario", report.get("name", "")),
        ("seed", report["seed"]),
        ("state", report["state"]),
        ("run time", f"{report['sim_time_s']:.3f} s ({report['sim_time_s'] / 3600:.2f} h)"),
        ("steps done", report["steps_done"]),
        ("goodput", f"{report['goodput']:.4f}"),
        *summary_rows(report),
        ("world size", report["world_size"]),
        ("restarts (budget)", report["restarts"]),
        ("membership restarts", report["membership_restarts"]),
        ("rendezvous rounds", report["rendezvous_rounds"]),
        ("hangs detected", report["hangs_detected"]),
        ("faults", ", ".join(f"{n} {k}" for k, n in report.get("faults", {}).items()) or "none"),
        ("recovery", _recovery(report)),
        ("final nodes", report["final_nodes"]),
    ]
    if "sim_events" in report:
        rows.append(("events", f"{report['events']} logged, {report['sim_events']} simulated"))
    else:
        rows.append(("events", f"{report['events']} logged"))
    if "wall_s" in report:
        rows.append(("wall time", f"{report['wall_s']:.3f} s"))
    if "event_log_sha256" in report:
        rows.append(
            ("determinism", f"same event log twice (sha256 {report['event_log_sha256'][:16]}…)")
        )
    return _table(rows, report, failures)


def _human_real(report: dict[str, Any], failures: list[str]) -> str:
    sizes = report.get("world_sizes") or [report["world_size"]]
    rows = [
        ("state", report["state"]),
        ("run time", f"{report['run_time_s']:.3f} s (first to last event)"),
        ("nodes", report["nodes"]),
        ("world sizes", " → ".join(str(w) for w in sizes)),
        ("restarts (budget)", report["restarts"]),
        ("membership restarts", report["membership_restarts"]),
        ("rendezvous rounds", report["rendezvous_rounds"]),
        ("hangs detected", report["hangs_detected"]),
        ("recovery", _recovery(report)),
        ("events", f"{report['events']} logged"),
    ]
    return _table(rows, report, failures)


def _recovery(report: dict[str, Any]) -> str:
    rec: list[float] = report["recovery_s"]
    text = f"{report['recovery_count']} recoveries, max {report['recovery_s_max']:.1f} s"
    if rec:
        shown = ", ".join(f"{r:.1f}" for r in rec[:8])
        text += f" ({shown}{', …' if len(rec) > 8 else ''} s)"
    return text


def _table(rows: list[tuple[str, Any]], report: dict[str, Any], failures: list[str]) -> str:
    width = max(len(k) for k, _ in rows)
    lines = [f"  {k:<{width}}  {v}" for k, v in rows]
    why: list[str] = report.get("why") or []
    if why:
        lines.append(f"why it ended {report['state']}:")
        lines += [f"  - {w}" for w in why]
    if failures:
        lines.append("expectations FAILED:")
        lines += [f"  - {f}" for f in failures]
    elif report.get("_expected"):
        lines.append("expectations met")
    return "\n".join(lines)


def _plot(events: Any, path: str, title: str) -> str | None:
    """Draw the timeline; the one line to print if it cannot."""
    try:
        from sim.plot import plot_timeline
    except ImportError:
        return "--plot needs matplotlib: pip install 'elastic-sim-agent[plot]'"
    try:
        plot_timeline(events, path, title)
    except ImportError:
        return "--plot needs matplotlib: pip install 'elastic-sim-agent[plot]'"
    except OSError as e:
        return f"--plot {path}: cannot write it: {e.strerror}"
    return None


def _say(prog: str, line: str) -> None:
    print(f"{prog}: {line}", file=sys.stderr)


def _run_and_judge(
    args: argparse.Namespace,
    scenario: Scenario,
    calibration: Any,
    show: bool,
    log: _LogSink,
    sinks: list[Any],
    timeline: Any,
) -> SimResult | tuple[int, str]:
    """Run the scenario (twice with --check-determinism), streaming its log to ``sinks``;
    write --events and --plot.  The result, or (exit code, the one line to print)."""
    sink: Any = None if not sinks else sinks[0] if len(sinks) == 1 else FanOutSink(*sinks)
    try:
        with _progress_bar(show, "simulating") as progress:
            result = simulate(
                scenario,
                progress=progress,
                calibration=calibration,
                time_scale=args.time_scale,
                sink=sink,
            )
    except ConfigError as e:
        return 2, str(e)
    if result.unobserved_errors:
        return 3, (
            f"internal error in the simulation: {result.unobserved_errors[0]} — replay with: "
            f"elastic sim {args.scenario} --seed {scenario.seed}"
        )
    if args.check_determinism:
        again = _LogSink()
        with _progress_bar(show, "again, for --check-determinism") as progress:
            simulate(
                scenario,
                progress=progress,
                calibration=calibration,
                time_scale=args.time_scale,
                sink=again,
            )
        if log.sha256.digest() != again.sha256.digest():
            return 1, (
                f"NOT deterministic: two runs of {args.scenario} with seed "
                f"{scenario.seed} gave different event logs"
            )
    if args.events and (problem := log.commit("--events")):
        return 2, problem
    if args.plot and (problem := _plot(timeline, args.plot, scenario.name)):
        return 2, problem
    return result


def main(argv: Sequence[str]) -> int:
    """Run a YAML failure scenario in the simulator, with the real agent code."""
    args = _sim_parser().parse_args(list(argv))
    prog = "elastic sim"
    try:
        scenario = load_scenario(args.scenario)
        if args.seed is not None:
            scenario = scenario.with_seed(args.seed)
        if not args.time_scale > 0 or args.time_scale == float("inf"):
            raise ConfigError("--time-scale", f"got {args.time_scale}; expected K > 0")
        calibration = (
            load_calibration(args.calibration)
            if args.calibration
            else scenario_calibration(scenario)
        )
        if calibration is not None:
            scenario = apply_calibration(scenario, calibration)
    except ConfigError as e:
        _say(prog, str(e))
        return 2
    for flag, path in (
        ("--events", args.events),
        ("--plot", args.plot),
        ("--write-faults", args.write_faults),
    ):
        if path is not None and (problem := _output_problem(flag, path)):
            _say(prog, problem)
            return 2
    show = sys.stderr.isatty() and not args.json
    # the log is streamed to its sinks as the run goes, never held (a 54-day run's log
    # would not fit in memory): the --events file and its hash, the plot's timeline
    log = _LogSink(args.events)
    # serializing every event costs CPU: only for a log that is written or hashed
    sinks: list[Any] = [log] if args.events or args.check_determinism else []
    timeline: Any = None
    if args.plot:
        from sim.plot import Timeline

        timeline = Timeline()
        sinks.append(timeline)
    try:
        outcome = _run_and_judge(args, scenario, calibration, show, log, sinks, timeline)
    finally:
        log.discard()  # unless committed
    if isinstance(outcome, tuple):
        code, line = outcome
        _say(prog, line)
        return code
    result = outcome
    report = dict(result.report)
    if args.check_determinism:
        report["event_log_sha256"] = log.sha256.hexdigest()
    if args.write_faults:
        explicit: Scenario = scenario.with_faults(result.faults)
        if problem := _write("--write-faults", args.write_faults, explicit.to_yaml().encode()):
            _say(prog, problem)
            return 2
    failures = check(scenario.expect, report)
    report["expect_failures"] = failures
    if args.json:
        print(json.dumps(report, sort_keys=True, allow_nan=False))
    else:
        report["_expected"] = bool(list(scenario.expect.items()))
        print(_human(report, failures))
        if failures:
            print(f"replay: elastic sim {args.scenario} --seed {scenario.seed}")
    return 1 if failures else 0


def report_main(argv: Sequence[str]) -> int:
    """The report of a real or simulated run, from its saved event log."""
    p = OneLineParser(
        prog="elastic report",
        description="Build the run report from a JSON-lines event log "
        "(elastic run --event-log, or elastic sim --events).  Limits: see sim/eventlog.py.",
    )
    p.add_argument("events", help="the event log")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument(
        "--plot", metavar="FILE", help="draw the timeline (PNG/SVG/PDF; needs matplotlib)"
    )
    args = p.parse_args(list(argv))
    from sim.eventlog import EventLogError, iter_event_log
    from sim.report import build_report

    prog = "elastic report"
    if args.plot is not None and (problem := _output_problem("--plot", args.plot)):
        _say(prog, problem)
        return 2
    # one pass, nothing held: the report and, with --plot, the plot's timeline are fed
    # each event as it is read (the timeline sees every kind: its lost-time bands need
    # the agents' reactions and rendezvous too)
    timeline: Any = None
    if args.plot:
        from sim.plot import Timeline

        timeline = Timeline()

    def tee(events: Iterator[Any]) -> Iterator[Any]:
        for e in events:
            if timeline is not None:
                timeline.emit(e)
            yield e

    try:
        report = build_report(tee(iter_event_log(args.events)))
    except EventLogError as e:
        _say(prog, str(e))
        return 2
    if args.plot and (problem := _plot(timeline, args.plot, args.events)):
        _say(prog, problem)
        return 2
    if args.json:
        print(json.dumps(report, sort_keys=True, allow_nan=False))
        return 0
    print(_human(report, []))
    return 0
