"""Invariants as pure functions over an event log (Jepsen-style checkers).

Each checker takes the events of one run and returns a list of violations (empty = the
invariant held).  They read only the event schema, so they judge real runs' logs too.

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
from collections.abc import Callable, Sequence

from elastic.events import AgentEvent, kinds

__all__ = [
    "ALL_CHECKS",
    "budget_kept",
    "check_all",
    "every_agent_ends",
    "one_world_per_round",
    "ranks_contiguous",
    "stop_before_start",
]


def one_world_per_round(events: Sequence[AgentEvent]) -> list[str]:
    sizes: dict[int, set[int]] = defaultdict(set)
    ranks: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if e.kind == kinds.RENDEZVOUS:
            r = int(e.fields["round"])
            sizes[r].add(int(e.fields["group_world_size"]))
            ranks[r].append(int(e.fields["group_rank"]))
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


def ranks_contiguous(events: Sequence[AgentEvent]) -> list[str]:
    by_round: dict[int, list[int]] = defaultdict(list)
    worlds: dict[int, set[int]] = defaultdict(set)
    round_of: dict[object, int] = {}
    complete: set[int] = set()
    for e in events:
        if e.kind == kinds.RENDEZVOUS:
            round_of[e.node] = int(e.fields["round"])
        elif e.kind == kinds.AGENT_GROUP_STARTED:
            r = round_of.get(e.node, -1)
            by_round[r].extend(int(x) for x in e.fields.get("ranks", []))
            worlds[r].add(int(e.fields["world_size"]))
        elif e.kind == "sim.world_running":
            complete.add(int(e.fields["round"]))
    out = []
    for r in sorted(by_round):
        if len(worlds[r]) != 1:
            out.append(f"round {r}: groups started with different world sizes {sorted(worlds[r])}")
            continue
        (w,) = worlds[r]
        got = sorted(by_round[r])
        if len(set(got)) != len(got):
            out.append(f"round {r}: a global rank was started twice")
        if r in complete and got != list(range(w)):
            out.append(f"round {r}: global ranks {got[:10]}… are not 0..{w - 1}")
        if any(x < 0 or x >= w for x in got):
            out.append(f"round {r}: global rank outside 0..{w - 1}")
    return out


def stop_before_start(events: Sequence[AgentEvent]) -> list[str]:
    running: dict[object, bool] = {}
    out = []
    for e in events:
        if e.kind == kinds.AGENT_START or e.kind == "sim.node_restart":
            running[e.node] = False
        elif e.kind == kinds.AGENT_GROUP_STARTED:
            if running.get(e.node):
                out.append(f"t={e.t:g} node {e.node}: a group started while the previous one ran")
            running[e.node] = True
        elif e.kind in (kinds.AGENT_GROUP_STOPPED, kinds.WORKER_SUCCEEDED):
            running[e.node] = False
        elif e.kind == "sim.fault" and e.fields.get("fault") == "node_crash":
            running[e.fields.get("target")] = False
    return out


def budget_kept(events: Sequence[AgentEvent]) -> list[str]:
    budget: dict[object, int] = {}
    spent: dict[object, int] = {}
    out = []
    for e in events:
        if e.kind == kinds.AGENT_START:
            budget[e.node] = int(e.fields.get("max_restarts", 0))
            spent[e.node] = 0
        elif e.kind == kinds.AGENT_RESTART and e.fields.get("reason") in (
            kinds.RESTART_FAILURE,
            kinds.RESTART_UNHEALTHY,
        ):
            spent[e.node] = spent.get(e.node, 0) + 1
            if spent[e.node] > budget.get(e.node, 0):
                out.append(
                    f"t={e.t:g} node {e.node}: restart {spent[e.node]} exceeds max_restarts "
                    f"{budget.get(e.node, 0)}"
                )
    return out


def every_agent_ends(events: Sequence[AgentEvent]) -> list[str]:
    live: dict[object, float] = {}
    for e in events:
        if e.kind == kinds.AGENT_START:
            live[e.node] = e.t
        elif e.kind == kinds.AGENT_FINISH:
            live.pop(e.node, None)
        elif e.kind == "sim.fault" and e.fields.get("fault") in ("node_crash",):
            live.pop(e.fields.get("target"), None)
    ended_by_until = any(e.kind == "sim.end" and e.fields.get("reason") == "until" for e in events)
    if ended_by_until:
        return []
    return [
        f"node {n}: its agent (started t={t:g}) never finished"
        for n, t in sorted(live.items(), key=lambda kv: str(kv[0]))
    ]


ALL_CHECKS: tuple[Callable[[Sequence[AgentEvent]], list[str]], ...] = (
    one_world_per_round,
    ranks_contiguous,
    stop_before_start,
    budget_kept,
    every_agent_ends,
)


def check_all(events: Sequence[AgentEvent]) -> list[str]:
    """Every violation of every invariant, prefixed by the checker's name."""
    return [f"{c.__name__}: {v}" for c in ALL_CHECKS for v in c(events)]
