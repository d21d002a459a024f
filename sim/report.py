"""The report of a run, computed from its event log alone (DESIGN §4).

The same function reads a simulated run's events or a real run's JSON-lines log.

Definitions:

* ``state`` — ``TIMEOUT`` if the run hit ``until``; else ``SUCCEEDED`` if some agent
  finished SUCCEEDED; else ``UNHEALTHY`` if an agent ended so and none FAILED; else
  ``FAILED`` (including a job whose every node crashed or left).
* ``restarts`` — restarts that spent the budget: the most any one agent spent (what its
  workers saw as ``TORCHELASTIC_RESTART_COUNT`` at the end).
* ``membership_restarts`` — restarts for membership changes (no budget spent): the most
  any one agent did.
* ``rendezvous_rounds`` — distinct rendezvous rounds that completed.
* ``world_size`` — workers in the last group started.
* ``steps_done`` — useful steps: all of them when the job finished, else the last
  completed checkpoint.  ``goodput`` = steps_done * step_time / sim_time_s.
* ``recovery_s`` — for each fault that broke the running training, the time until
  training ran again (a new world formed); ``recovery_s_max`` its maximum.
* ``hangs_detected`` — groups declared UNHEALTHY plus workers reaped by a timer.
* ``faults`` — the faults injected that hit something, by kind (simulated runs).
* ``ettr``, ``productive_s``, ``lost_s``, ``lost_by_category``, ``lost_by_fault`` — where
  the time went (detection, stopping, waiting for nodes, rendezvous, start-up, rework,
  checkpoints) and the effective training time ratio (simulated runs; :mod:`sim.losses`).
* ``why`` — for a run that did not succeed, one line per cause (see :class:`_Causes`).
* a real run's log (no ``sim.start``) has no seed, steps, goodput or simulated time:
  ``run_time_s`` (first to last event), ``world_sizes`` and ``nodes`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from elastic.events import AgentEvent, PartsTaker, WorkerEvents, kinds, record_fields
from sim.losses import LostTime

__all__ = ["REPORT_KEYS", "ReportSink", "build_report"]

REPORT_KEYS = (
    "name",
    "state",
    "restarts",
    "membership_restarts",
    "rendezvous_rounds",
    "world_size",
    "steps_done",
    "sim_time_s",
    "goodput",
    "events",
    "recovery_s",
    "recovery_s_max",
    "recovery_count",
    "hangs_detected",
    "final_nodes",
    "seed",
)


_REAL_BREAKS = frozenset(
    {kinds.WORKER_FAILED, kinds.AGENT_MEMBERSHIP_CHANGE, kinds.AGENT_UNHEALTHY}
)


class _Recoveries:
    """Fault → training again: each break opens a wait, the next resume closes them all."""

    __slots__ = ("breaks", "pending", "resumes", "times")

    def __init__(self, breaks: frozenset[str], resumes: str) -> None:
        self.breaks = breaks
        self.resumes = resumes
        self.pending: list[float] = []
        self.times: list[float] = []

    @property
    def kinds(self) -> frozenset[str]:
        """The only kinds :meth:`see` reacts to."""
        return self.breaks | {self.resumes}

    def see(self, kind: str, t: float) -> None:
        if kind in self.breaks:
            self.pending.append(t)
        elif kind == self.resumes and self.pending:
            self.times.extend(t - p for p in self.pending)
            self.pending = []


class _Causes:
    """Why a run ended as it did, one line per cause, from the events that say so.

    A node whose agent refused to start its workers (the fault that did it named, when
    the log has it), a rendezvous that failed (the agents' own one-line error), an agent
    that spent its whole restart budget (the failure that spent the last one), hangs,
    and a run cut short by ``until``.  Repeats of one cause on other nodes are counted,
    not listed.
    """

    __slots__ = ("budget", "last_failure", "last_fault", "lines", "max_restarts", "seen")

    #: the only kinds :meth:`see` reacts to (a sink may skip the others)
    KINDS = frozenset(
        {
            "sim.fault",
            kinds.AGENT_START,
            kinds.WORKER_FAILED,
            kinds.AGENT_REFUSED_START,
            kinds.AGENT_RENDEZVOUS_ERROR,
            kinds.AGENT_FINISH,
        }
    )

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.seen: dict[str, int] = {}  # cause key -> index in lines
        self.last_fault: dict[Any, tuple[str, float]] = {}
        # node -> its last failure's rank, time and fields
        self.last_failure: dict[Any, tuple[int | None, float, Mapping[str, Any]]] = {}
        self.max_restarts: dict[Any, int] = {}
        self.budget: list[int] = []  # per cause line: how many nodes share it

    def _add(self, key: str, line: str) -> None:
        if key in self.seen:
            self.budget[self.seen[key]] += 1
            return
        self.seen[key] = len(self.lines)
        self.lines.append(line)
        self.budget.append(1)

    def see(self, e: AgentEvent) -> None:
        self.see_parts(e.t, e.node, e.kind, e.rank, e.fields)

    def see_parts(
        self, t: float, node: Any, k: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        """:meth:`see` of the event with these parts (its role is not read)."""
        if k == "sim.fault" and "target" in f and f.get("applied", True):
            self.last_fault[f["target"]] = (str(f.get("fault", "fault")), t)
        elif k == kinds.AGENT_START:
            self.max_restarts[node] = _count(f.get("max_restarts"))
        elif k == kinds.WORKER_FAILED:
            self.last_failure[node] = (rank, t, f)
        elif k == kinds.AGENT_REFUSED_START:
            fault = self.last_fault.get(node)
            by = f" by {fault[0]} at {fault[1]:.1f} s" if fault else ""
            reason = str(f.get("reason", "its agent refused to start its workers"))
            reason = reason.removeprefix(f"node {node}: ")
            self._add(f"refused:{fault[0] if fault else ''}", f"node {node} excluded{by}: {reason}")
        elif k == kinds.AGENT_RENDEZVOUS_ERROR:
            error = str(f.get("error", "rendezvous failed"))
            self._add(f"rdzv:{error.split(':', 1)[0]}", f"node {node}: {error}")
        elif k == kinds.AGENT_FINISH and f.get("state") == "FAILED":
            budget = self.max_restarts.get(node)
            spent = _count(f.get("restarts"))
            failure = self.last_failure.get(node)
            if budget is not None and spent >= budget and failure is not None:
                f_rank, f_t, ff = failure
                self._add(
                    "budget",
                    f"node {node} spent its restart budget ({spent} of {budget}); the last "
                    f"failure: rank {f_rank} exit code {ff.get('exit_code')} at {f_t:.1f} s",
                )
        elif k == kinds.AGENT_FINISH and f.get("state") == "UNHEALTHY":
            self._add("unhealthy", f"node {node}: its workers hung (UNHEALTHY) past the budget")

    def result(self, state: str, end: dict[str, Any], start: dict[str, Any]) -> list[str]:
        lines = [
            line + (f" (and {n - 1} more nodes likewise)" if n > 1 else "")
            for line, n in zip(self.lines, self.budget, strict=True)
        ]
        if state == "TIMEOUT":
            lines.append(
                f"the run reached until = {float(start.get('until', 0)):.0f} s before the job "
                f"finished ({_count(end.get('steps_done'))} of {_count(start.get('steps'))} steps)"
            )
        return lines if state != "SUCCEEDED" else []


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def build_report(events: Iterable[AgentEvent]) -> dict[str, Any]:
    """The report of a run from its events, in one pass (a large log is not held).

    A simulated run's log (it has ``sim.start``) gives the keys of :data:`REPORT_KEYS`;
    a real run's log gives what a real run has — no seed, steps, goodput or simulated
    time, but ``run_time_s`` (first to last event, on the agents' clock),
    ``world_sizes`` (each new group's world size, in order) and ``nodes``.
    """
    report = ReportSink()
    for e in events:
        report.emit(e)
    return report.result()


#: a part's reaction to an event, given its parts but the role, which no part reads:
#: (t, node, kind, rank, fields)
_Handler = Callable[[float, Any, str, int | None, Mapping[str, Any]], None]


class ReportSink(PartsTaker):
    """:func:`build_report` as an event sink: fed each event as it happens (the simulator
    streams its log through it), it holds only what the report needs — counters, the
    recovery in progress, one entry per node and per round — never the events.

    Performance: each event goes only to the parts that react to its kind (each part
    says which: ``KINDS``; tests/test_report_fastpath.py checks that the others leave
    every part as it was), through a table from kind to those parts' handlers, made the
    first time a kind is seen.  Most of a large run's events (a worker's start or stop, a
    rank assignment) are only counted.  A group of workers' events given as one record
    (:meth:`emit_group`) is counted at once when no part reads its kind, or only the
    part that needs just its first event (:attr:`sim.losses.LostTime.FIRST_AT_AN_INSTANT`);
    otherwise it is expanded and each event emitted.  An event may come as its parts
    (:meth:`emit_parts`, which the simulator's agents call): then no
    :class:`~elastic.events.AgentEvent` is made for it at all, and every part reads
    the parts.
    """

    def __init__(self) -> None:
        self.simulated = False
        # a real run's log has no sim.* events: a worker failure, a membership change or an
        # unhealthy verdict breaks the group, and the next group start ends the recovery;
        # both are followed until the log says which it is
        self.sim_rec = _Recoveries(frozenset({"sim.world_broken"}), "sim.world_running")
        self.real_rec = _Recoveries(_REAL_BREAKS, kinds.AGENT_GROUP_STARTED)
        self.t0: float | None = None
        self.last_t = 0.0
        self.count = 0
        self.start: dict[str, Any] = {}
        self.end: dict[str, Any] = {}
        self.end_t = 0.0
        self.finish_states: set[str] = set()
        self.finished_nodes: set[Any] = set()
        self.nodes: set[Any] = set()
        self.restarts_by_agent: dict[tuple[Any, int], int] = {}
        self.membership_by_agent: dict[tuple[Any, int], int] = {}
        self.incarnation: dict[Any, int] = {}
        self.rounds: set[int] = set()
        self.world_size = 0
        self.world_sizes: list[int] = []
        self.hangs = 0
        self.causes = _Causes()
        self.losses = LostTime()
        self.faults: dict[str, int] = {}
        # this sink's own reaction per kind (the counters of the report)
        self._own: dict[str, _Handler] = {
            "sim.fault": self._sim_fault,
            "sim.start": self._sim_start,
            "sim.end": self._sim_end,
            kinds.AGENT_START: self._agent_start,
            kinds.AGENT_FINISH: self._agent_finish,
            kinds.AGENT_RESTART: self._agent_restart,
            kinds.RENDEZVOUS: self._rendezvous,
            kinds.AGENT_GROUP_STARTED: self._group_started,
            kinds.AGENT_UNHEALTHY: self._hang,
            kinds.AGENT_WATCHDOG: self._watchdog,
        }
        self._recovery_kinds = self.sim_rec.kinds | self.real_rec.kinds
        self._routes: dict[str, tuple[_Handler, ...]] = {}
        # kind -> whether a group of its events may be fed as its first event only
        self._first_only: dict[str, bool] = {}

    def _route(self, kind: str) -> tuple[_Handler, ...]:
        """The handlers of ``kind``'s events, in the order the parts are fed."""
        handlers: list[_Handler] = []
        if kind in _Causes.KINDS:
            handlers.append(self.causes.see_parts)
        if kind in LostTime.KINDS:
            handlers.append(self.losses.see_parts)
        own = self._own.get(kind)
        if own is not None:
            handlers.append(own)
        if kind in self._recovery_kinds:
            handlers.append(self._recovery)
        route = self._routes[kind] = tuple(handlers)
        return route

    def emit_parts(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        rank: int | None,
        fields: Mapping[str, Any],
    ) -> None:
        """:meth:`emit` of ``AgentEvent(t, node, kind, role, rank, fields)``, without it."""
        self.count += 1
        if self.t0 is None:
            self.t0 = t
        self.last_t = (t if t > self.last_t else self.last_t) if self.count > 1 else t
        self.nodes.add(node)
        route = self._routes.get(kind)
        if route is None:
            route = self._route(kind)
        for handler in route:
            handler(t, node, kind, rank, fields)

    def emit_group_parts(
        self,
        t: float,
        node: int | str,
        kind: str,
        role: str,
        ranks: Sequence[int | None],
        keys: tuple[str, ...],
        fields: Mapping[str, Any],
        columns: Mapping[str, Sequence[Any]],
    ) -> None:
        """:meth:`emit_group` of the record with these parts, without it: counted at
        once, and the parts that react to the kind fed only the first event where that
        is all they read of a run of them (their time, node and kind are the same)."""
        n = len(ranks)
        if not n:
            return
        first_only = self._first_only.get(kind)
        if first_only is None:
            first_only = self._first_only[kind] = self._group_first_only(kind)
        if not first_only:
            g = WorkerEvents.unchecked(t, node, kind, role, ranks, keys, fields, columns)
            for e in g.events():
                self.emit(e)
            return
        if self.t0 is None:
            self.t0 = t
        self.last_t = (t if t > self.last_t else self.last_t) if self.count else t
        self.count += n
        self.nodes.add(node)
        route = self._routes.get(kind)
        if route is None:
            route = self._route(kind)
        if route:
            first = record_fields(keys, fields, columns, 0)
            for handler in route:
                handler(t, node, kind, ranks[0], first)

    def _group_first_only(self, kind: str) -> bool:
        """Whether every part that reacts to ``kind`` reads only the first of a run of
        its events at one instant (so a group of them may be fed as its first event)."""
        if kind in _Causes.KINDS or kind in self._own or kind in self._recovery_kinds:
            return False
        return kind not in LostTime.KINDS or kind in LostTime.FIRST_AT_AN_INSTANT

    # -- each kind's own reaction (an event's parts, as a _Handler) ----------------------
    def _sim_fault(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        if f.get("applied", True):
            fault = str(f.get("fault", "fault"))
            self.faults[fault] = self.faults.get(fault, 0) + 1

    def _sim_start(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        self.simulated = True
        self.start = dict(f)

    def _sim_end(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        self.end = dict(f)
        self.end_t = t

    def _agent_start(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        self.incarnation[node] = self.incarnation.get(node, 0) + 1

    def _agent_finish(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        self.finish_states.add(str(f.get("state")))
        self.finished_nodes.add(node)
        key = (node, self.incarnation.get(node, 0))
        self.restarts_by_agent[key] = int(f.get("restarts", 0))

    def _agent_restart(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        if f.get("reason") == kinds.RESTART_MEMBERSHIP:
            key = (node, self.incarnation.get(node, 0))
            self.membership_by_agent[key] = self.membership_by_agent.get(key, 0) + 1

    def _rendezvous(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        self.rounds.add(int(f.get("round", 0)))

    def _group_started(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        self.world_size = int(f.get("world_size", self.world_size))
        if not self.world_sizes or self.world_sizes[-1] != self.world_size:
            self.world_sizes.append(self.world_size)

    def _hang(self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]) -> None:
        self.hangs += 1

    def _watchdog(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        # the timer server's reports (real and simulated alike): a kill is a hang detected
        if f.get("watchdog_event") == "kill worker process":
            self.hangs += 1

    def _recovery(
        self, t: float, node: Any, kind: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        # only the recoveries the report gives: a simulated run's (world broken -> running
        # again) or a real log's (a break -> the next group start); the other would keep a
        # float per node per round for nothing (memory growing with simulated time)
        if self.simulated:
            self.sim_rec.see(kind, t)
        else:
            self.real_rec.see(kind, t)

    def result(self) -> dict[str, Any]:
        """The report of the events seen so far."""
        t0 = self.t0 if self.t0 is not None else 0.0
        end_t = self.end_t or self.last_t
        end, start, finish_states = self.end, self.start, self.finish_states
        simulated = self.simulated
        if end.get("reason") == "until":
            state = "TIMEOUT"
        elif "SUCCEEDED" in finish_states:
            state = "SUCCEEDED"
        elif "UNHEALTHY" in finish_states and "FAILED" not in finish_states:
            state = "UNHEALTHY"
        elif not finish_states and not simulated:
            state = "UNFINISHED"  # a real log cut short: no agent said how it ended
        else:
            # failed, or every node crashed or left before the job finished
            state = "FAILED"
        end_t -= t0
        recovery = [round(r, 6) for r in (self.sim_rec if simulated else self.real_rec).times]
        common: dict[str, Any] = {
            "state": state,
            "restarts": max(self.restarts_by_agent.values(), default=0),
            "membership_restarts": max(self.membership_by_agent.values(), default=0),
            "rendezvous_rounds": len(self.rounds),
            "world_size": self.world_size,
            "events": self.count,
            "recovery_s": recovery,
            "recovery_s_max": max(recovery, default=0.0),
            "recovery_count": len(recovery),
            "hangs_detected": self.hangs,
            "why": self.causes.result(state, end, start),
        }
        if not simulated:
            return {
                **common,
                "world_sizes": self.world_sizes,
                "run_time_s": round(end_t, 6),
                "nodes": len(self.nodes),
            }
        step_time = float(start.get("step_time", 0.0))
        steps_done = int(end.get("steps_done", 0))
        goodput = steps_done * step_time / end_t if end_t > 0 else 0.0
        return {
            "name": start.get("name", ""),
            **common,
            "steps_done": steps_done,
            "sim_time_s": round(end_t, 6),
            "goodput": round(goodput, 6),
            "final_nodes": int(end.get("final_nodes", len(self.finished_nodes))),
            "faults": dict(sorted(self.faults.items())),
            "seed": start.get("seed", 0),
            # where the time went, and ETTR beside goodput (sim/losses.py)
            **self.losses.result(end_t + t0),
        }
