"""Where the time goes: a simulated run's wall time split into training and lost time, and ETTR.

Computed from the event log alone, one event at a time (:meth:`LostTime.see`), holding only
the recovery in progress, so :func:`sim.report.build_report` stays a single pass over a log
of any length.

Theory of operation.  The job alternates between *running* intervals (``sim.world_running``
to ``sim.world_broken``, ``sim.world_done`` or the end) and *gaps* (the rest).  A running
interval that started at step ``s0`` and ended with ``C`` as its last completed checkpoint
(``sim.progress``) spent ``(C - s0) * step_time`` on steps kept (*productive*), one
``checkpoint_time`` per completed checkpoint (*checkpoint*), and the rest on work thrown
away (*rework*: steps after the checkpoint, the step or checkpoint in progress, and any
slow-down of those intervals).  The interval that finishes the job keeps all its steps, so
its remainder beyond steps and checkpoints is only slow-down (*other*).  A gap is cut at the
first moment each of these happened, in this order (each boundary is at least the previous
one, so the parts add up to the gap):

1. *detection* — from the break to the first agent reaction (a worker FAILED or
   TERMINATED, a membership change, an unhealthy verdict, a restart, a group stopped);
2. *stopping* — to the last ``agent.group_stopped`` before the new round completed;
3. *waiting_for_nodes* — to the last agent (re)start (``agent.start``) before the round
   completed: the round was waiting for that node;
4. *rendezvous* — to the first ``RENDEZVOUS`` event of the round that runs next;
5. *startup* — to ``sim.world_running`` (rank assignment, worker start-up, collective init).

The first gap (the job's start) has no fault and counts as *rendezvous* and *startup*; the
time after the job finished (exit barrier) is *other*.  A gap is charged to the fault that
broke the world (the last applied ``sim.fault`` at or before the break, or one at the same
instant), and to its category (``failures:``) or, without one, its kind.

ETTR (effective training time ratio, Kokolis et al. 2024) = productive time / wall time.
Goodput (:mod:`sim.report`) counts the steps kept at the end instead; the two differ by the
steps since the last checkpoint of an unfinished run and by slow-down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic.events import AgentEvent, kinds

__all__ = ["BUCKETS", "GAP_BUCKETS", "LostTime", "summary_rows"]

#: The parts of a recovery gap, in the order they happen.
GAP_BUCKETS = ("detection", "stopping", "waiting_for_nodes", "rendezvous", "startup")
#: Every part of lost time in the report.
BUCKETS = (*GAP_BUCKETS, "rework", "checkpoint", "other")

_REACTIONS = frozenset(
    {
        kinds.WORKER_FAILED,
        kinds.WORKER_TERMINATED,
        kinds.AGENT_MEMBERSHIP_CHANGE,
        kinds.AGENT_UNHEALTHY,
        kinds.AGENT_RESTART,
        kinds.AGENT_GROUP_STOPPED,
        # a timer server's report; in a simulated run only a timer's expiry and its kill
        kinds.AGENT_WATCHDOG,
    }
)


@dataclass(slots=True)
class _Gap:
    """A recovery in progress: what the boundaries need, nothing of past recoveries."""

    start: float
    fault: dict[str, Any] | None = None
    rejoin: bool = False  # no fault of its own (yet): a fault at the same instant replaces it
    reaction: float | None = None
    stopped: list[float] = field(default_factory=list)
    node_starts: list[float] = field(default_factory=list)
    rounds: dict[int, float] = field(default_factory=dict)  # round -> first RENDEZVOUS


class LostTime:
    """Feed events in order with :meth:`see`; :meth:`result` gives the breakdown."""

    #: the only kinds :meth:`see` reacts to (a sink may skip the others: sim.report)
    KINDS = frozenset(
        {
            "sim.start",
            "sim.fault",
            kinds.AGENT_START,
            "sim.progress",
            "sim.world_broken",
            "sim.world_done",
            "sim.world_running",
            kinds.AGENT_GROUP_STOPPED,
            kinds.RENDEZVOUS,
            *_REACTIONS,
        }
    )

    #: kinds of which, in a run of events of one kind at one instant, only the first
    #: changes the state (it marks the gap's reaction; the others find it marked): a sink
    #: given a group of workers' events of such a kind may feed only its first event
    #: (sim.report; tests/test_report_fastpath.py checks it)
    FIRST_AT_AN_INSTANT = _REACTIONS - {kinds.AGENT_GROUP_STOPPED}

    def __init__(self, keep_spans: bool = False) -> None:
        # (t0, t1, part) of every lost span, for the timeline plot; off for the report,
        # which keeps only sums (its memory must not grow with the run)
        self.spans: list[tuple[float, float, str]] | None = [] if keep_spans else None
        self.step_time = 0.0
        self.ckpt_every = 0
        self.ckpt_time = 0.0
        self.t0: float | None = None
        self.totals = dict.fromkeys(BUCKETS, 0.0)
        self.productive = 0.0
        self.by_category: dict[str, dict[str, float]] = {}
        self.by_fault: list[dict[str, Any]] = []
        self.gap: _Gap | None = None
        self.first_gap = True
        self.run_start: float | None = None
        self.run_s0 = 0
        self.last_ckpt = 0
        self.last_fault: dict[str, Any] | None = None
        self.done_at: float | None = None
        self._pending_rework = 0.0  # the broken run's rework, charged to the gap's fault
        # the last fault that hit each node, and the node whose agent started last: a world
        # broken to admit a repaired node is charged to the fault that took the node out
        self.fault_of_node: dict[Any, dict[str, Any]] = {}
        self.last_joiner: Any = None

    def see(self, e: AgentEvent) -> None:
        self.see_parts(e.t, e.node, e.kind, e.rank, e.fields)

    def see_parts(
        self, t: float, node: Any, k: str, rank: int | None, f: Mapping[str, Any]
    ) -> None:
        """:meth:`see` of the event with these parts (its role and rank are not read)."""
        if k == "sim.start":
            self.t0 = t
            self.step_time = float(f.get("step_time", 0.0))
            self.ckpt_every = int(f.get("checkpoint_every", 0) or 0)
            self.ckpt_time = float(f.get("checkpoint_time", 0.0) or 0.0)
            self.gap = _Gap(start=t)
            return
        if self.t0 is None:
            return  # not a simulated run's log
        gap = self.gap
        if k == "sim.fault" and f.get("applied", True):
            fault = {
                "t": t,
                "fault": str(f.get("fault", "fault")),
                "category": str(f.get("category") or f.get("fault", "fault")),
                "node": f.get("target"),
            }
            if fault["node"] is not None:
                self.fault_of_node[fault["node"]] = fault
            if gap is not None and not self.first_gap and gap.start == t and gap.rejoin:
                gap.fault, gap.rejoin = fault, False
            else:
                self.last_fault = fault
        elif k == kinds.AGENT_START:
            self.last_joiner = node
            if gap is not None:
                gap.node_starts.append(t)
        elif k == "sim.progress":
            self.last_ckpt = int(f.get("ckpt_step", self.last_ckpt))
        elif k == "sim.world_broken":
            if gap is None and self.run_start is not None:
                self._close_run(t, finished=False)
                charged: dict[str, Any] | None = self.last_fault
                rejoin = False
                if charged is None:
                    # no fault since the last recovery: a node's (re)start broke the world
                    # to let it in; charge the fault that took that node out, if any
                    earlier = self.fault_of_node.get(self.last_joiner)
                    if earlier is not None:
                        charged = {
                            **earlier,
                            "t": t,
                            "fault": f"rejoin after {earlier['fault']}",
                        }
                    rejoin = True
                self.gap = _Gap(start=t, fault=charged, rejoin=rejoin)
                self.last_fault = None
        elif k == "sim.world_done":
            if self.run_start is not None:
                self._close_run(t, finished=True)
                self.done_at = t
        elif k == "sim.world_running":
            if gap is not None:
                self._close_gap(gap, int(f.get("round", -1)), t)
                self.gap = None
            self.run_start = t
            self.run_s0 = int(f.get("from_step", 0))
        elif gap is not None:
            if k in _REACTIONS and gap.reaction is None:
                gap.reaction = t
            if k == kinds.AGENT_GROUP_STOPPED:
                gap.stopped.append(t)
            elif k == kinds.RENDEZVOUS:
                gap.rounds.setdefault(int(f.get("round", -1)), t)

    def _close_run(self, end: float, finished: bool, timed_out: bool = False) -> None:
        assert self.run_start is not None
        span = end - self.run_start
        k = self.ckpt_every
        if finished:
            kept = max(0, self.last_ckpt - self.run_s0)
            n_ckpt = (-(-kept // k) - 1) if k > 0 and kept > 0 else 0
        elif timed_out:
            kept, n_ckpt = self._progress(span)
        else:
            kept = max(0, self.last_ckpt - self.run_s0)
            n_ckpt = kept // k if k > 0 else 0
        productive = min(span, kept * self.step_time)
        checkpoint = min(span - productive, n_ckpt * self.ckpt_time)
        rest = max(0.0, span - productive - checkpoint)
        self.productive += productive
        self.totals["checkpoint"] += checkpoint
        self.totals["other" if finished or timed_out else "rework"] += rest
        self.run_start = None
        if self.spans is not None and rest > 0 and not finished and not timed_out:
            self.spans.append((end - rest, end, "rework"))
        if not finished and not timed_out:
            self._pending_rework = rest
        else:
            self._pending_rework = 0.0

    def _progress(self, span: float) -> tuple[int, int]:
        """Steps kept and checkpoints written in ``span`` s of a run cut short by ``until``."""
        st, k, w = self.step_time, self.ckpt_every, self.ckpt_time
        if st <= 0:
            return 0, 0
        if k <= 0:
            return int(span / st + 1e-9), 0
        seg = k * st + w
        n_full = int(span / seg + 1e-9)
        in_seg = min(k, int((span - n_full * seg) / st + 1e-9))
        return n_full * k + in_seg, n_full

    def _close_gap(self, gap: _Gap, round_: int, end: float) -> None:
        rdzv = gap.rounds.get(round_, end)
        bounds = [gap.start]

        def cut(t: float | None) -> None:
            last = bounds[-1]
            bounds.append(min(end, max(last, last if t is None else t)))

        if self.first_gap:
            parts = {"rendezvous": rdzv - gap.start, "startup": end - rdzv}
            parts = {b: max(0.0, v) for b, v in parts.items()}
        else:
            cut(gap.reaction)
            cut(max((t for t in gap.stopped if t <= rdzv), default=None))
            cut(max((t for t in gap.node_starts if t <= rdzv), default=None))
            cut(rdzv)
            bounds.append(end)
            parts = {b: bounds[i + 1] - bounds[i] for i, b in enumerate(GAP_BUCKETS)}
        for bucket, value in parts.items():
            self.totals[bucket] += value
        if self.spans is not None:
            at = gap.start
            for bucket, value in parts.items():
                if value > 0:
                    self.spans.append((at, at + value, bucket))
                at += value
        if not self.first_gap:
            self._charge(gap.fault, {**parts, "rework": self._pending_rework}, gap.start)
        self.first_gap = False

    def _charge(self, fault: dict[str, Any] | None, parts: dict[str, float], t: float) -> None:
        info = fault or {"t": t, "fault": "unknown", "category": "unknown", "node": None}
        row: dict[str, Any] = {
            "t": round(info["t"], 3),
            "fault": info["fault"],
            "category": info["category"],
            "node": info["node"],
        }
        row.update((b, round(v, 3)) for b, v in parts.items())
        row["total"] = round(sum(parts.values()), 3)
        self.by_fault.append(row)
        cat = self.by_category.setdefault(info["category"], {"count": 0.0, "rejoins": 0.0})
        # a rejoin (the repaired node let back in) is a cost of the fault, not another fault
        cat["rejoins" if info["fault"].startswith("rejoin after") else "count"] += 1
        for b, v in parts.items():
            cat[b] = cat.get(b, 0.0) + v
        cat["total"] = cat.get("total", 0.0) + sum(parts.values())

    def result(self, end_t: float) -> dict[str, Any]:
        """The breakdown at the run's end (``end_t``: sim.end's time); {} for a real log."""
        if self.t0 is None:
            return {}
        if self.run_start is not None:
            self._close_run(end_t, finished=False, timed_out=True)
        if self.gap is not None:
            # cut short by until during a recovery: charge what has happened so far
            self._close_gap(self.gap, -1, end_t)
            self.gap = None
        if self.done_at is not None:
            self.totals["other"] += max(0.0, end_t - self.done_at)
        wall = end_t - self.t0
        lost = {b: round(v, 3) for b, v in self.totals.items()}
        lost["total"] = round(sum(self.totals.values()), 3)
        categories = {
            name: {
                k: (int(v) if k in ("count", "rejoins") else round(v, 3)) for k, v in cat.items()
            }
            for name, cat in sorted(self.by_category.items())
        }
        return {
            "ettr": round(self.productive / wall, 6) if wall > 0 else 0.0,
            "productive_s": round(self.productive, 3),
            "lost_s": lost,
            "lost_by_category": categories,
            "lost_by_fault": self.by_fault,
        }


def summary_rows(report: dict[str, Any], categories: int = 6) -> list[tuple[str, str]]:
    """Rows for ``elastic sim``'s table: ETTR, lost time by part and by category (top few)."""
    lost = report.get("lost_s")
    if not lost:
        return []
    wall = float(report.get("sim_time_s") or 0.0) or 1.0
    parts = sorted(((lost[b], b) for b in BUCKETS if lost.get(b)), reverse=True)
    rows = [
        ("ETTR", f"{report['ettr']:.4f} (productive {report['productive_s']:.0f} s)"),
        (
            "lost time",
            f"{lost['total']:.0f} s ({lost['total'] / wall:.1%}): "
            + (", ".join(f"{b.replace('_', ' ')} {v:.0f} s" for v, b in parts) or "none"),
        ),
    ]
    ranked = sorted(
        report.get("lost_by_category", {}).items(), key=lambda kv: (-kv[1]["total"], kv[0])
    )
    for name, cat in ranked[:categories]:
        rows.append(
            (
                f"  {name}",
                f"{cat['count']} x {cat['total'] / max(cat['count'], 1):.0f} s = "
                f"{cat['total']:.0f} s (rework {cat.get('rework', 0.0):.0f} s"
                + (f", {cat['rejoins']} rejoins)" if cat.get("rejoins") else ")"),
            )
        )
    if len(ranked) > categories:
        rest = sum(c["total"] for _, c in ranked[categories:])
        rows.append((f"  {len(ranked) - categories} more", f"{rest:.0f} s"))
    return rows
