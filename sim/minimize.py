"""``elastic minimize FILE``: a scenario whose expectations fail, made as small as it can be.

The file a user attaches to a bug.  The scenario is run once; the expectations that fail are
its *failure* (the report keys named by :func:`sim.expect.check`'s lines).  Rate faults and
``failures:`` are first written out as the timed faults the seed draws (so the result does
not depend on draws that a smaller cluster would change), then:

1. faults are removed by delta debugging (Zeller's ddmin: halves, then quarters, …, then
   one at a time) while the same expectations still fail;
2. nodes are removed (``spare_nodes``, then ``cluster.nodes``; ``min_nodes``/``max_nodes``
   lowered with them; a fault naming a removed node moved to node mod the new count) while
   they still fail;
3. faults are tried again one at a time (fewer nodes can make more of them unnecessary).

A candidate the loader refuses is skipped.  Every run is a pure function of the candidate
and its seed, so the search is deterministic.  ``--max-runs`` bounds the simulations.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from elastic.errors import ConfigError
from sim.cliparse import OneLineParser
from sim.expect import Expectation, ExpectedState, check
from sim.run import simulate
from sim.scenario.expand import expand_faults, fault_rng
from sim.scenario.model import Fault, RateFault, Scenario
from sim.scenario.reader import load_scenario, load_scenario_text

__all__ = ["Minimizer", "main"]


def _signature(expect: Expectation, report: dict[str, Any]) -> frozenset[str]:
    """How the run fails: per failed expectation its key and the side it missed on
    (``restarts>``: too many), or the state it ended in (``state=FAILED``)."""
    failed = {line.split(":", 1)[0] for line in check(expect, report)}
    out: set[str] = set()
    for key, wanted in expect.items():
        if key not in failed:
            continue
        seen = report.get(key)
        if isinstance(wanted, ExpectedState):
            out.add(f"state={seen}")
            continue
        low = wanted.exact if wanted.exact is not None else wanted.min
        below = isinstance(seen, int | float) and low is not None and seen < low
        out.add(f"{key}{'<' if below else '>'}")
    return frozenset(out)


class Minimizer:
    """Shrinks ``scenario`` while the expectations in ``target`` still fail."""

    def __init__(self, scenario: Scenario, max_runs: int) -> None:
        self.max_runs = max_runs
        self.runs = 0
        first = self._failures(scenario)
        if first is None or not first[0]:
            raise ConfigError(
                scenario.source, "its expectations hold; expected a scenario whose expect: fails"
            )
        self.lines, self.target = first
        explicit = scenario.with_faults(expand_faults(scenario, fault_rng(scenario.seed)))
        self.best = explicit if self.fails(explicit) else scenario

    def _failures(self, sc: Scenario) -> tuple[list[str], frozenset[str]] | None:
        """The failed expectations of ``sc``'s run (lines, signature); None if refused."""
        try:
            sc = load_scenario_text(sc.to_yaml(), name=sc.source)
        except ConfigError:
            return None
        self.runs += 1
        report = simulate(sc).report
        return check(sc.expect, report), _signature(sc.expect, report)

    def fails(self, sc: Scenario) -> bool:
        """Whether ``sc`` still fails the same expectations (and the run budget is not spent)."""
        if self.runs >= self.max_runs:
            return False
        seen = self._failures(sc)
        if seen is None or not self.target <= seen[1]:
            return False
        self.lines = seen[0]
        return True

    def minimize(self) -> Scenario:
        self._ddmin()
        self._nodes()
        self._one_by_one()
        return self.best

    def _with(self, faults: Sequence[Fault | RateFault]) -> Scenario:
        return replace(self.best, faults=tuple(faults))

    def _ddmin(self) -> None:
        faults = list(self.best.faults)
        chunks = 2
        while len(faults) >= 1 and self.runs < self.max_runs:
            size = max(1, len(faults) // chunks)
            removed = False
            for start in range(0, len(faults), size):
                rest = faults[:start] + faults[start + size :]
                candidate = self._with(rest)
                if self.fails(candidate):
                    self.best, faults = candidate, rest
                    chunks = max(chunks - 1, 2)
                    removed = True
                    break
            if not removed:
                if size == 1:
                    break
                chunks = min(len(faults), chunks * 2)

    def _one_by_one(self) -> None:
        index = 0
        while index < len(self.best.faults) and self.runs < self.max_runs:
            faults = list(self.best.faults)
            candidate = self._with(faults[:index] + faults[index + 1 :])
            if self.fails(candidate):
                self.best = candidate
            else:
                index += 1

    def _resized(self, nodes: int, spares: int) -> Scenario:
        sc = self.best
        rdzv = sc.rendezvous
        cluster = replace(sc.cluster, nodes=nodes, spare_nodes=spares)
        min_nodes = min(rdzv.min_nodes, nodes)
        rendezvous = replace(
            rdzv, min_nodes=min_nodes, max_nodes=max(min_nodes, min(rdzv.max_nodes, nodes))
        )
        limit = nodes + spares
        # a fault naming a removed node moves to a remaining one (node mod the new count):
        # the run decides whether the failure survives the move
        faults = [
            replace(
                f,
                node=None if f.node is None else f.node % limit,
                nodes=None if f.nodes is None else tuple(sorted({n % limit for n in f.nodes})),
            )
            for f in sc.faults
        ]
        return replace(sc, cluster=cluster, rendezvous=rendezvous, faults=tuple(faults))

    def _nodes(self) -> None:
        for field_ in ("spare_nodes", "nodes"):
            while self.runs < self.max_runs:
                current = getattr(self.best.cluster, field_)
                floor = 1 if field_ == "nodes" else 0
                shrunk = False
                # the largest cut first: down to the floor, then halves, then one
                for value in sorted({floor, (current + floor) // 2, current - 1}):
                    if value >= current or value < floor:
                        continue
                    nodes = value if field_ == "nodes" else self.best.cluster.nodes
                    spares = value if field_ == "spare_nodes" else self.best.cluster.spare_nodes
                    candidate = self._resized(nodes, spares)
                    if self.fails(candidate):
                        self.best = candidate
                        shrunk = True
                        break
                if not shrunk:
                    break


def main(argv: Sequence[str] | None = None) -> int:
    """Shrink a scenario whose expectations fail to the smallest that still fails."""
    p = OneLineParser(
        prog="elastic minimize",
        description="Remove faults and nodes from a scenario whose expectations fail, while "
        "the same expectations still fail; write the smallest scenario found.",
    )
    p.add_argument("scenario", help="the scenario YAML file (its expect: must fail)")
    p.add_argument("-o", "--output", help="where to write it (default: FILE.min.yaml)")
    p.add_argument("--max-runs", type=int, default=500, help="at most this many simulations")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    prog = "elastic minimize"
    output = args.output or str(Path(args.scenario).with_suffix(".min.yaml"))
    try:
        if args.max_runs < 1:
            raise ConfigError("--max-runs", f"got {args.max_runs}; expected ≥ 1")
        from sim.cli import _output_problem

        if problem := _output_problem("--output", output):
            raise ConfigError("--output", problem.removeprefix("--output "))
        original = load_scenario(args.scenario)
        minimizer = Minimizer(original, args.max_runs)
        smallest = minimizer.minimize()
    except ConfigError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    text = smallest.to_yaml()
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(text)
    before = (len(expand_faults(original, fault_rng(original.seed))), original.cluster)
    print(
        f"{output}: faults {before[0]} → {len(smallest.faults)}, nodes "
        f"{before[1].nodes}+{before[1].spare_nodes} → "
        f"{smallest.cluster.nodes}+{smallest.cluster.spare_nodes} spare, "
        f"{minimizer.runs} runs; still failing:"
    )
    for line in minimizer.lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
