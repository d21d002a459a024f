"""``elastic sweep``: one scenario across seeds and settings, as distributions.

``elastic sweep FILE --seeds N [--set job.checkpoint_every=100,200,400 ...]`` runs every
combination of the ``--set`` values (their product) with N seeds each (the scenario's seed,
then the next N - 1), and prints, per setting, the report's figures as distributions: mean,
p5, p50 and p95 (linear interpolation between order statistics).  ``--json`` prints the
same as JSON (every run's figures too); ``--plot FILE`` draws goodput and ETTR against the
swept setting with their p5-p95 spread.

Guarantees:

- a run is a pure function of (scenario, settings, seed), so the results do not depend on
  ``--jobs`` or on which worker ran what; they are sorted by (setting, seed);
- a ``--set`` value is applied to the scenario's own dict and the result goes through the
  loader, so a bad key or value is refused in one line naming the flag, before any run;
- parallel over the machine's cores with worker *processes* that speak JSON lines on their
  stdin and stdout (``python -m sim.sweep --serve``): multiprocessing's pipes would pickle
  (DESIGN §3: no pickle anywhere).  Workers are killed and reaped on any exit;
- or, with ``--cluster ADDRESS``, on the workers of a Dask scheduler (sim/cluster.py), with
  the same results: every path runs :func:`run_cell` (JSON text in, JSON text out) and reads
  its answer with :func:`take_result`, which refuses a result of other code.

Exit codes: 0 — done; 1 — a run crashed or a worker was lost (one line); 2 — bad input
(one line naming the flag or file).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import itertools
import json
import math
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from elastic.errors import ConfigError, ElasticError, one_line
from sim.calibration import apply_calibration, scenario_calibration
from sim.cliparse import OneLineParser
from sim.expect import check
from sim.losses import BUCKETS
from sim.run import simulate
from sim.scenario.model import Scenario
from sim.scenario.reader import load_scenario, load_scenario_text

__all__ = [
    "FIGURES",
    "Setting",
    "SweepError",
    "code_fingerprint",
    "job_text",
    "main",
    "parse_set",
    "percentile",
    "run_cell",
    "run_sweep",
    "summarize",
    "take_result",
]

#: The report's figures a sweep collects per run (lost_s.* are the lost-time parts).
FIGURES = (
    "goodput",
    "ettr",
    "sim_time_s",
    "steps_done",
    "restarts",
    "membership_restarts",
    "rendezvous_rounds",
    "recovery_s_max",
    *(f"lost_s.{b}" for b in BUCKETS),
)
_MAX_RUNS = 100_000
_MAX_ANSWER = 1 << 20  # bytes of one worker's answer (JSON text)


@dataclass(frozen=True, slots=True)
class Setting:
    """One combination of ``--set`` values: ((dotted key, value text), ...)."""

    values: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values) or "(as written)"


def parse_set(text: str) -> tuple[str, list[str]]:
    """``job.checkpoint_every=100,200`` → ("job.checkpoint_every", ["100", "200"])."""
    key, sep, values = text.partition("=")
    parts = [v.strip() for v in values.split(",")]
    if not sep or not key.strip() or not all(parts):
        raise ConfigError(
            "--set",
            f"got {text!r}; expected KEY=V1,V2,... such as job.checkpoint_every=100,200,400",
        )
    return key.strip(), parts


def _apply(sc: Scenario, setting: Setting) -> Scenario:
    """``sc`` with the setting's values, read back through the loader (which checks them)."""
    if not setting.values:
        return sc
    data = sc.to_dict()
    for key, value in setting.values:
        node: Any = data
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node, dict) or not isinstance(node.get(part), dict):
                raise ConfigError(
                    "--set", f"{key}: no section {part!r}; expected a key like job.checkpoint_every"
                )
            node = node[part]
        try:
            node[parts[-1]] = yaml.safe_load(value)
        except yaml.YAMLError:
            node[parts[-1]] = value
    try:
        out = load_scenario_text(yaml.safe_dump(data, sort_keys=False), name=sc.source)
    except ConfigError as error:
        raise ConfigError("--set", f"{setting.label}: {error.message}") from None
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation, as numpy's default."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"state": report["state"]}
    for name in FIGURES:
        if name.startswith("lost_s."):
            out[name] = float(report.get("lost_s", {}).get(name.split(".", 1)[1], 0.0))
        else:
            out[name] = report.get(name, 0)
    return out


def run_one(text: str, source: str, seed: int) -> dict[str, Any]:
    """One run: the scenario's YAML (settings applied), its seed → figures and expectations."""
    sc = load_scenario_text(text, name=source).with_seed(seed)
    calibration = scenario_calibration(sc)
    if calibration is not None:
        sc = apply_calibration(sc, calibration)
    report = simulate(sc, calibration=calibration).report
    figures = _figures(report)
    figures["expect_failures"] = check(sc.expect, report)
    return figures


@functools.cache
def code_fingerprint() -> str:
    """A hash of the ``elastic`` and ``sim`` sources this process runs (12 hex digits).

    A run is a pure function of (scenario, seed) *and the code*: a cluster worker that runs
    other code would give other numbers, so every result carries this and the sweep refuses
    one that differs from its own.
    """
    import elastic

    digest = hashlib.sha256()
    for package in (elastic.__file__, __file__):
        root = Path(package).resolve().parent
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def run_cell(text: str) -> str:
    """One run, JSON text in and JSON text out: what a sweep worker (a local process or a
    Dask worker) executes.  In: ``{"id", "yaml", "source", "seed"}``; out: ``{"id",
    "figures", "code"}``, or ``{"id", "error"}`` for a scenario the loader refuses, or
    ``{"id", "crash"}`` (the exception's type and message) for a run that raised.

    Only text crosses the wire: nothing of ours is pickled, and a failure is data, so the
    caller never has to unpickle an exception.
    """
    job = json.loads(text)
    out: dict[str, Any] = {"id": job["id"]}
    try:
        out["figures"] = run_one(job["yaml"], job["source"], int(job["seed"]))
        out["code"] = code_fingerprint()
    except ConfigError as error:
        out["error"] = str(error)
    except Exception as error:  # a crash is reported as data (see the docstring)
        out["crash"] = f"{type(error).__name__}: {error}"
    return json.dumps(out)


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per figure: mean, p5, p50, p95 over the runs."""
    stats: dict[str, dict[str, float]] = {}
    for name in FIGURES:
        values = [float(r[name]) for r in runs]
        stats[name] = {
            "mean": round(sum(values) / len(values), 6),
            "p5": round(percentile(values, 5), 6),
            "p50": round(percentile(values, 50), 6),
            "p95": round(percentile(values, 95), 6),
        }
    return stats


class SweepError(ElasticError):
    """A run crashed, a worker died or gave a result of other code: not bad input (exit 1)."""


def job_text(ident: int, text: str, source: str, seed: int) -> str:
    """The JSON text :func:`run_cell` takes."""
    return json.dumps({"id": ident, "yaml": text, "source": source, "seed": seed})


def take_result(text: str, seeds: dict[int, int]) -> tuple[int, dict[str, Any]]:
    """A :func:`run_cell` answer → (id, figures); a refused scenario raises ConfigError, a
    crash or a result of other code (``code`` differs from ours) raises SweepError.
    ``seeds``: each job id's seed, to name the run that failed."""
    bad = SweepError(f"a sweep worker answered {text[:80]!r}; expected a result")
    if len(text) > _MAX_ANSWER:  # one run's figures are about 1 KB
        raise bad
    try:
        message = json.loads(text)
        ident = int(message["id"])
    except (ValueError, TypeError, KeyError):
        raise bad from None
    if "error" in message:
        raise ConfigError("elastic sweep", str(message["error"]))
    seed = seeds.get(ident)
    if "crash" in message:
        raise SweepError(
            f"the run with seed {seed} crashed: {message['crash']}; "
            f"`elastic sim FILE --seed {seed}` (with the same --set values) shows where"
        )
    figures = message.get("figures")
    if not isinstance(figures, dict):
        raise bad
    if message.get("code") != code_fingerprint():
        raise SweepError(
            f"a worker runs other elastic/sim code (fingerprint {message.get('code')!r}, "
            f"ours {code_fingerprint()!r}): its results would differ; install the same "
            "version on every worker"
        )
    return ident, figures


def _worker_command() -> list[str]:
    return [sys.executable, "-m", "sim.sweep", "--serve"]


def run_sweep(
    jobs: Sequence[tuple[int, str, str, int]],
    processes: int,
    on_result: Callable[[], None] | None = None,
) -> dict[int, dict[str, Any]]:
    """Run (id, yaml text, source, seed) jobs on ``processes`` workers; results by id."""
    results: dict[int, dict[str, Any]] = {}
    seeds = {ident: seed for ident, _, _, seed in jobs}
    if processes <= 1 or len(jobs) <= 1:
        for job in jobs:
            ident, figures = take_result(run_cell(job_text(*job)), seeds)
            results[ident] = figures
            if on_result is not None:
                on_result()
        return results
    count = min(processes, len(jobs))
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    workers: list[subprocess.Popen[str]] = []
    lock = threading.Lock()
    errors: list[ElasticError] = []

    def read(proc: subprocess.Popen[str]) -> None:
        stdout: IO[str] | None = proc.stdout
        assert stdout is not None
        for line in stdout:
            try:
                ident, figures = take_result(line, seeds)
            except ElasticError as error:
                with lock:
                    errors.append(error)
                continue
            with lock:
                results[ident] = figures
            if on_result is not None:
                on_result()

    try:
        for _ in range(count):
            workers.append(
                subprocess.Popen(
                    _worker_command(),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
        readers = [threading.Thread(target=read, args=(w,), daemon=True) for w in workers]
        for thread in readers:
            thread.start()
        # round robin: runs of one setting (similar cost) spread over every worker
        for index, job in enumerate(jobs):
            stdin = workers[index % count].stdin
            assert stdin is not None
            stdin.write(job_text(*job) + "\n")
        for w in workers:
            assert w.stdin is not None
            w.stdin.close()
        for w in workers:
            w.wait()
        for thread in readers:
            thread.join()
    except BrokenPipeError:
        raise SweepError("a sweep worker process died; run with --jobs 1 to see why") from None
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.wait()
            for pipe in (w.stdin, w.stdout):
                if pipe is not None and not pipe.closed:
                    with contextlib.suppress(BrokenPipeError):
                        pipe.close()
    if errors:
        raise errors[0]
    missing = [ident for ident, *_ in jobs if ident not in results]
    if missing:
        raise SweepError(f"a sweep worker ended without {len(missing)} results")
    return results


def _serve() -> int:
    """A worker: one JSON job per stdin line, one JSON result per stdout line."""
    for line in sys.stdin:
        sys.stdout.write(run_cell(line) + "\n")
        sys.stdout.flush()
    return 0


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="elastic sweep",
        description="Run a scenario across seeds and settings; print the figures as "
        "distributions (mean, p5, p50, p95) per setting.",
    )
    p.add_argument("scenario", help="the scenario YAML file")
    p.add_argument("--seeds", type=int, default=8, help="seeds per setting (default 8)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="a dotted scenario key and the values to sweep (repeat for a product)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="worker processes (default: the machine's cores)",
    )
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run on the workers of this Dask scheduler (tcp://host:8786 or tls://host:8786) "
        "instead of local processes; the cluster must be trusted (see sim/cluster.py)",
    )
    p.add_argument("--tls-ca-file", metavar="PEM", help="with a tls:// --cluster: the CA")
    p.add_argument("--tls-cert", metavar="PEM", help="with a tls:// --cluster: our certificate")
    p.add_argument("--tls-key", metavar="PEM", help="with a tls:// --cluster: its private key")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--plot", metavar="FILE", help="draw goodput/ETTR against the setting")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a scenario across seeds and settings; figures as distributions per setting."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    prog = "elastic sweep"
    try:
        if not 1 <= args.seeds <= _MAX_RUNS:
            raise ConfigError("--seeds", f"got {args.seeds}; expected 1 to {_MAX_RUNS}")
        if args.jobs is not None and args.jobs < 1:
            raise ConfigError("--jobs", f"got {args.jobs}; expected ≥ 1")
        tls = None
        if args.cluster is not None:
            from sim.cluster import ClusterTLS, check_address

            if args.jobs is not None:
                raise ConfigError(
                    "--jobs", "the cluster's workers set the parallelism; drop --jobs or --cluster"
                )
            check_address(args.cluster)
            tls = ClusterTLS(args.tls_ca_file, args.tls_cert, args.tls_key)
        elif args.tls_ca_file or args.tls_cert or args.tls_key:
            raise ConfigError("--tls-ca-file", "TLS files are for --cluster tls://...; expected it")
        sc = load_scenario(args.scenario)
        axes = [parse_set(text) for text in args.set]
        keys = [k for k, _ in axes]
        if len(set(keys)) != len(keys):
            raise ConfigError("--set", f"got a key twice in {keys}; expected each key once")
        settings = [
            Setting(tuple(zip(keys, combo, strict=True)))
            for combo in itertools.product(*(values for _, values in axes))
        ]
        if len(settings) * args.seeds > _MAX_RUNS:
            raise ConfigError(
                "--seeds",
                f"{len(settings)} settings x {args.seeds} seeds; expected ≤ {_MAX_RUNS} runs",
            )
        scenarios = [_apply(sc, s) for s in settings]
        if args.plot is not None:
            from sim.cli import _output_problem

            if problem := _output_problem("--plot", args.plot):
                raise ConfigError("--plot", problem.removeprefix("--plot "))
    except ConfigError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    seeds = [sc.seed + i for i in range(args.seeds)]
    jobs = [
        (i * len(seeds) + j, s.to_yaml(), sc.source, seed)
        for i, s in enumerate(scenarios)
        for j, seed in enumerate(seeds)
    ]
    bar: Any = None
    if sys.stderr.isatty() and not args.json:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), unit="run", desc="sweeping", file=sys.stderr, leave=False)
    tick = None if bar is None else lambda: bar.update(1)
    try:
        if args.cluster is not None:
            from sim.cluster import run_on_cluster

            assert tls is not None
            results = run_on_cluster(args.cluster, jobs, tick, tls)
        else:
            results = run_sweep(jobs, args.jobs or os.cpu_count() or 1, tick)
    except ConfigError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    except SweepError as error:
        print(f"{prog}: {one_line(str(error))}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
    out = _result(sc, settings, seeds, results)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(_table(out), end="")
    if args.plot is not None:
        plot_sweep(out, args.plot)
    return 0


def _result(
    sc: Scenario, settings: Sequence[Setting], seeds: Sequence[int], results: dict[int, Any]
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for i, setting in enumerate(settings):
        runs = [{"seed": seed, **results[i * len(seeds) + j]} for j, seed in enumerate(seeds)]
        states: dict[str, int] = {}
        for r in runs:
            states[r["state"]] = states.get(r["state"], 0) + 1
        rows.append(
            {
                "set": dict(setting.values),
                "label": setting.label,
                "states": dict(sorted(states.items())),
                "expect_failed": sum(1 for r in runs if r["expect_failures"]),
                "stats": summarize(runs),
                "runs": runs,
            }
        )
    # the first setting wins a tie (max keeps the first of equal keys)
    best = max(rows, key=lambda r: float(r["stats"]["goodput"]["mean"]))
    return {
        "scenario": sc.name,
        "file": sc.source,
        "seeds": list(seeds),
        "settings": rows,
        "best_by_mean_goodput": best["label"],
    }


_SHOWN = ("goodput", "ettr", "sim_time_s", "restarts", "membership_restarts", "recovery_s_max")


def _table(out: dict[str, Any]) -> str:
    lines = [f"{out['scenario']}: {len(out['seeds'])} seeds ({out['seeds'][0]}…{out['seeds'][-1]})"]
    for row in out["settings"]:
        states = ", ".join(f"{n} {s}" for s, n in row["states"].items())
        failed = f", expectations failed in {row['expect_failed']}" if row["expect_failed"] else ""
        lines.append("")
        lines.append(f"{row['label']}  ({states}{failed})")
        lines.append(f"  {'figure':<24}{'mean':>12}{'p5':>12}{'p50':>12}{'p95':>12}")
        stats = row["stats"]
        names = [*_SHOWN, *(f"lost_s.{b}" for b in BUCKETS if stats[f"lost_s.{b}"]["mean"])]
        for name in names:
            s = stats[name]
            digits = 4 if name in ("goodput", "ettr") else 1
            lines.append(
                f"  {name:<24}"
                + "".join(f"{s[q]:>12.{digits}f}" for q in ("mean", "p5", "p50", "p95"))
            )
    lines.append("")
    lines.append(f"best by mean goodput: {out['best_by_mean_goodput']}")
    return "\n".join(lines) + "\n"


def plot_sweep(out: dict[str, Any], path: str) -> list[str]:
    """Goodput and ETTR against the swept setting: p50 marked, mean line, p5-p95 band.
    Returns the legend's labels (every line, band and mark drawn has one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = out["settings"]
    labels = [r["label"] for r in rows]
    keys = list(rows[0]["set"]) if rows else []
    xs: list[float] = list(range(len(rows)))
    xlabel = "setting"
    if len(keys) == 1:
        try:
            xs = [float(r["set"][keys[0]]) for r in rows]
            xlabel = keys[0]
        except ValueError:
            pass
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, colour in (("goodput", "tab:blue"), ("ettr", "tab:green")):
        stats = [r["stats"][name] for r in rows]
        ax.fill_between(
            xs,
            [s["p5"] for s in stats],
            [s["p95"] for s in stats],
            color=colour,
            alpha=0.2,
            label=f"{name} p5-p95",
        )
        ax.plot(xs, [s["mean"] for s in stats], "-o", color=colour, label=f"{name} mean")
        ax.plot(
            xs,
            [s["p50"] for s in stats],
            "_",
            color=colour,
            markersize=14,
            label=f"{name} median (p50)",
        )
    if xlabel == "setting":
        ax.set_xticks(xs, labels, rotation=20, ha="right", fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of wall time")
    ax.set_title(f"{out['scenario']} ({len(out['seeds'])} seeds per setting)", fontsize=9)
    legend = ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return [t.get_text() for t in legend.get_texts()]


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        raise SystemExit(_serve())
    raise SystemExit(main())
