"""The timeline plot of a run, drawn from its event log alone (DESIGN §4).

Top: one lane per node; a bar while that node's worker group runs (a new shade per
attempt), a red mark at each fault on its target node.  Bottom: training progress —
the step reached over time, with the dips to the last checkpoint after each failure.

matplotlib is imported only here, only when a plot is asked for (optional extra
``plot``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elastic.events import AgentEvent

__all__ = ["plot_timeline"]


def _intervals(events: Sequence[AgentEvent]) -> dict[Any, list[tuple[float, float, int]]]:
    """node -> [(start, end, attempt)] of its running groups."""
    open_: dict[Any, tuple[float, int]] = {}
    out: dict[Any, list[tuple[float, float, int]]] = {}
    end = max((e.t for e in events), default=0.0)
    for e in events:
        if e.kind == "agent.group_started":
            open_[e.node] = (e.t, int(e.fields.get("attempt", 0)))
        elif e.kind in ("agent.group_stopped", "agent.finish") or (
            e.kind == "sim.fault" and e.fields.get("fault") in ("node_crash", "node_leave")
        ):
            node = e.fields.get("target", e.node) if e.kind == "sim.fault" else e.node
            if node in open_:
                t0, attempt = open_.pop(node)
                out.setdefault(node, []).append((t0, e.t, attempt))
    for node, (t0, attempt) in open_.items():
        out.setdefault(node, []).append((t0, end, attempt))
    return out


def _progress(events: Sequence[AgentEvent]) -> tuple[list[float], list[float]]:
    ts: list[float] = [0.0]
    steps: list[float] = [0.0]
    for e in events:
        if e.kind == "sim.world_running":
            ts.append(e.t)
            steps.append(float(e.fields.get("from_step", 0)))
        elif e.kind == "sim.progress":
            ts += [e.t, e.t]  # reached this step, then falls back to the last checkpoint
            steps += [float(e.fields.get("steps", 0)), float(e.fields.get("ckpt_step", 0))]
    return ts, steps


def plot_timeline(events: Sequence[AgentEvent], path: str, title: str = "") -> None:
    """Write the timeline of ``events`` to ``path`` (PNG, SVG or PDF, by extension)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = _intervals(events)
    nodes = sorted(lanes, key=lambda n: (str(type(n)), n))
    index = {n: i for i, n in enumerate(nodes)}
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(12, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    hours = max((e.t for e in events), default=0.0) > 3 * 3600
    scale = 3600.0 if hours else 1.0
    cmap = plt.get_cmap("tab10")
    for n in nodes:
        for t0, t1, attempt in lanes[n]:
            top.broken_barh(
                [(t0 / scale, max(t1 - t0, 0.0) / scale)],
                (index[n] - 0.4, 0.8),
                facecolors=cmap(attempt % 10),
            )
    fx, fy = [], []
    for e in events:
        if e.kind == "sim.fault":
            target = e.fields.get("target")
            if target in index:
                fx.append(e.t / scale)
                fy.append(index[target])
    if fx:
        top.scatter(fx, fy, marker="x", color="red", zorder=3, label="fault")
        top.legend(loc="upper right")
    top.set_ylabel("node")
    if len(nodes) <= 40:
        top.set_yticks(range(len(nodes)), [str(n) for n in nodes])
    top.set_title(title or "worker groups by node (colour = attempt)")
    ts, steps = _progress(events)
    bottom.plot([t / scale for t in ts], steps, drawstyle="default", color="black")
    bottom.set_ylabel("step")
    bottom.set_xlabel("hours" if hours else "seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
