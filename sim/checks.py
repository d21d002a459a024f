"""Invariants as pure functions over an event log (Jepsen-style checkers).

Each checker takes the events of one run and returns a list of violations (empty = the
invariant held).  They read only the event schema, so they judge real runs' logs too.
Each is one pass over the events: :class:`Checks` runs them all as an event sink, fed
as the run goes (``simulate(sc, sink=Checks())``), so a long run's log is never held.

* :func:`one_world_per_round` — agents that completed the same rendezvous round agree on
  its size, and their group ranks are exactly ``0..size-1``, once each;
* :func:`ranks_contiguous` — the workers started for a round have global ranks exactly
  ``0..W-1``, once each, and every start in that round reports the same ``W``;
* :func:`stop_before_start` — on each node, a group is stopped (or finished) before the
  next one starts;
* :func:`budget_kept` — no agent restarts for failures more often than ``max_restarts``;
* :func:`every_agent_ends` — every agent that started either finished or had its node
  crash or leave under it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from elastic.events import AgentEvent, kinds

__all__ = [
    "ALL_CHECKS",
    "Checks",
    "budget_kept",
    "check_all",
    "every_agent_ends",
    "one_world_per_round",
    "ranks_contiguous",
    "stop_before_start",
]


class _OneWorldPerRound:
    def __init__(self) -> None:
        self.sizes: dict[int, set[int]] = defaultdict(set)
        self.ranks: dict[int, list[int]] = defaultdict(list)

    def emit(self, e: AgentEvent) -> None:
        if e.kind == kinds.RENDEZVOUS:
            r = int(e.fields["round"])
            self.sizes[r].add(int(e.fields["group_world_size"]))
            self.ranks[r].append(int(e.fields["group_rank"]))

    def result(self) -> list[str]:
        sizes, ranks = self.sizes, self.ranks
        out = []
        for r in sorted(sizes):
            if len(sizes[r]) != 1:
                out.append(f"round {r}: agents disagree on its size: {sorted(sizes[r])}")
                continue
            (n,) = sizes[r]
            if sorted(ranks[r]) != list(range(n)) and len(ranks[r]) >= n:
                out.append(f"round {r}: group ranks {sorted(ranks[r])} are not 0..{n - 1}")
            if len(set(ranks[r])) != len(ranks[r]):
                out.append(f"round {r}: a group rank was handed out twice: {sorted(ranks[r])}")
        return out


class _RanksContiguous:
    def __init__(self) -> None:
        self.by_round: dict[int, list[int]] = defaultdict(list)
        self.worlds: dict[int, set[int]] = defaultdict(set)
        self.round_of: dict[object, int] = {}
        self.complete: set[int] = set()

    def emit(self, e: AgentEvent) -> None:
        if e.kind == kinds.RENDEZVOUS:
            self.round_of[e.node] = int(e.fields["round"])
        elif e.kind == kinds.AGENT_GROUP_STARTED:
            r = self.round_of.get(e.node, -1)
            self.by_round[r].extend(int(x) for x in e.fields.get("ranks", []))
            self.worlds[r].add(int(e.fields["world_size"]))
        elif e.kind == "sim.world_running":
            self.complete.add(int(e.fields["round"]))

    def result(self) -> list[str]:
        by_round, worlds = self.by_round, self.worlds
        out = []
        for r in sorted(by_round):
            if len(worlds[r]) != 1:
                out.append(
                    f"round {r}: groups started with different world sizes {sorted(worlds[r])}"
                )
                continue
            (w,) = worlds[r]
            got = sorted(by_round[r])
            if len(set(got)) != len(got):
                out.append(f"round {r}: a global rank was started twice")
            if r in self.complete and got != list(range(w)):
                out.append(f"round {r}: global ranks {got[:10]}… are not 0..{w - 1}")
            if any(x < 0 or x >= w for x in got):
                out.append(f"round {r}: global rank outside 0..{w - 1}")
        return out


class _StopBeforeStart:
    def __init__(self) -> None:
        self.running: dict[object, bool] = {}
        self.out: list[str] = []

    def emit(self, e: AgentEvent) -> None:
        running = self.running
        if e.kind == kinds.AGENT_START or e.kind == "sim.node_restart":
            running[e.node] = False
        elif e.kind == kinds.AGENT_GROUP_STARTED:
            if running.get(e.node):
                self.out.append(
                    f"t={e.t:g} node {e.node}: a group started while the previous one ran"
                )
            running[e.node] = True
        elif e.kind in (kinds.AGENT_GROUP_STOPPED, kinds.WORKER_SUCCEEDED):
            running[e.node] = False
        elif e.kind == "sim.fault" and e.fields.get("fault") == "node_crash":
            running[e.fields.get("target")] = False

    def result(self) -> list[str]:
        return list(self.out)


class _BudgetKept:
    def __init__(self) -> None:
        self.budget: dict[object, int] = {}
        self.spent: dict[object, int] = {}
        self.out: list[str] = []

    def emit(self, e: AgentEvent) -> None:
        budget, spent = self.budget, self.spent
        if e.kind == kinds.AGENT_START:
            budget[e.node] = int(e.fields.get("max_restarts", 0))
            spent[e.node] = 0
        elif e.kind == kinds.AGENT_RESTART and e.fields.get("reason") in (
            kinds.RESTART_FAILURE,
            kinds.RESTART_UNHEALTHY,
        ):
            spent[e.node] = spent.get(e.node, 0) + 1
            if spent[e.node] > budget.get(e.node, 0):
                self.out.append(
                    f"t={e.t:g} node {e.node}: restart {spent[e.node]} exceeds max_restarts "
                    f"{budget.get(e.node, 0)}"
                )

    def result(self) -> list[str]:
        return list(self.out)


class _EveryAgentEnds:
    def __init__(self) -> None:
        self.live: dict[object, float] = {}
        self.ended_by_until = False

    def emit(self, e: AgentEvent) -> None:
        if e.kind == kinds.AGENT_START:
            self.live[e.node] = e.t
        elif e.kind == kinds.AGENT_FINISH:
            self.live.pop(e.node, None)
        elif e.kind == "sim.fault" and e.fields.get("fault") in ("node_crash",):
            self.live.pop(e.fields.get("target"), None)
        elif e.kind == "sim.end" and e.fields.get("reason") == "until":
            self.ended_by_until = True

    def result(self) -> list[str]:
        if self.ended_by_until:
            return []
        return [
            f"node {n}: its agent (started t={t:g}) never finished"
            for n, t in sorted(self.live.items(), key=lambda kv: str(kv[0]))
        ]


_Checker = _OneWorldPerRound | _RanksContiguous | _StopBeforeStart | _BudgetKept | _EveryAgentEnds


def _run(checker: _Checker, events: Iterable[AgentEvent]) -> list[str]:
    for e in events:
        checker.emit(e)
    return checker.result()


def one_world_per_round(events: Iterable[AgentEvent]) -> list[str]:
    """Agents that completed one round agree on its size; its group ranks are 0..size-1."""
    return _run(_OneWorldPerRound(), events)


def ranks_contiguous(events: Iterable[AgentEvent]) -> list[str]:
    """The workers started for a round have global ranks 0..W-1, once each."""
    return _run(_RanksContiguous(), events)


def stop_before_start(events: Iterable[AgentEvent]) -> list[str]:
    """On each node, a group is stopped (or finished) before the next one starts."""
    return _run(_StopBeforeStart(), events)


def budget_kept(events: Iterable[AgentEvent]) -> list[str]:
    """No agent restarts for failures more often than ``max_restarts``."""
    return _run(_BudgetKept(), events)


def every_agent_ends(events: Iterable[AgentEvent]) -> list[str]:
    """Every agent that started finished, or its node crashed or left under it."""
    return _run(_EveryAgentEnds(), events)


_CLASSES: tuple[type[_Checker], ...] = (
    _OneWorldPerRound,
    _RanksContiguous,
    _StopBeforeStart,
    _BudgetKept,
    _EveryAgentEnds,
)
ALL_CHECKS: tuple[Callable[[Iterable[AgentEvent]], list[str]], ...] = (
    one_world_per_round,
    ranks_contiguous,
    stop_before_start,
    budget_kept,
    every_agent_ends,
)


class Checks:
    """Every checker at once, as an event sink: feed it a run's events as they happen."""

    def __init__(self) -> None:
        self._checkers = [cls() for cls in _CLASSES]

    def emit(self, e: AgentEvent) -> None:
        for c in self._checkers:
            c.emit(e)

    def violations(self) -> list[str]:
        """Every violation of every invariant, prefixed by the checker's name."""
        return [
            f"{f.__name__}: {v}"
            for f, c in zip(ALL_CHECKS, self._checkers, strict=True)
            for v in c.result()
        ]


def check_all(events: Iterable[AgentEvent]) -> list[str]:
    """Every violation of every invariant, prefixed by the checker's name (one pass)."""
    checks = Checks()
    for e in events:
        checks.emit(e)
    return checks.violations()
