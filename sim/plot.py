"""The timeline plot of a run, drawn from its event log alone (DESIGN §4).

Top, for a cluster small enough that one lane per node can be read
(:data:`MAX_LANES` nodes or fewer): one lane per node, a bar while that node's worker
group runs, coloured by the rendezvous round the group belongs to (the same colour on
every node of one world), and a mark at each fault on its target node, shaped by the
fault's kind.  For a larger cluster, lanes would be moiré stripes, so the top is a
cluster-level band instead: how many nodes run a group, are between groups (stopping,
in rendezvous, starting) or are down/excluded, over time, with each fault marked by
kind above it.  With few restarts the band is exact, each restart widened to at least a
pixel; past :data:`BAND_BINS` / 10 of them those widened restarts would cover most of the
band, so it shows each state's time-weighted mean node count per bin (its areas are
node-time).  Bottom: training progress — the step reached over time, with the dips
to the last checkpoint after each failure (simulated runs; a real run's log has no
steps).  Every colour and mark has a legend entry.

Cost: one pass over the events keeping only the kinds drawn, a few thousand artists at
most (one ``broken_barh`` per lane, one step polygon per band), so a 512-node, 55-hour
log of half a million events draws in a few seconds.  matplotlib is imported only here,
only when a plot is asked for (optional extra ``plot``).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from elastic.events import AgentEvent, PartsTaker, WorkerEvents, kinds
from sim.losses import LostTime

__all__ = ["MAX_LANES", "Timeline", "plot_timeline"]

#: The most nodes drawn as one lane each; above it the top panel is the cluster band.
MAX_LANES = 64

_DOWN_FAULTS = frozenset({"node_crash", "node_leave", "preemption"})
_FAULT_MARKS = {
    "worker_crash": "x",
    "worker_hang": "s",
    "node_crash": "X",
    "node_join": "^",
    "node_leave": "v",
    "preemption": "P",
    "store_outage": "D",
    "network_partition": "|",
    "slow_node": ">",
    "gpu_error": "*",
}
_RUNNING, _BETWEEN, _DOWN = 0, 1, 2
_STATE_NAMES = (
    "running a worker group",
    "between groups (stop, rendezvous, start)",
    "down or excluded",
)
_STATE_COLOURS = ("#2ca02c", "#ff7f0e", "#7f7f7f")
# the bands of lost time shaded behind the progress line (sim/losses.py's parts)
_LOST_COLOURS = {
    "detection": "#d62728",
    "stopping": "#ff9896",
    "waiting_for_nodes": "#7f7f7f",
    "rendezvous": "#ff7f0e",
    "startup": "#bcbd22",
    "rework": "#9467bd",
}


class Timeline(PartsTaker):
    """What the plot needs, gathered in one pass over the events: an event sink (the
    simulator streams its log through it, ``elastic sim --plot``) or built from an
    iterable of events.  It keeps the lanes, faults, node state changes and progress
    points it draws, not the events.

    Cost, for a long run at scale (Llama 3's 2,048 nodes x 54 days: 2 million node state
    changes): it takes events as their parts (:func:`elastic.events.parts_sink`), so a
    simulated run with ``--plot`` makes no event objects, and a group of workers' events
    is read once (only the lost-time accounting looks at them, and only at the first);
    each state change is 17 bytes in three arrays, not a tuple of objects; the lanes are
    kept only while the cluster can be drawn as lanes (:data:`MAX_LANES` nodes)."""

    def __init__(self, events: Iterable[AgentEvent] = ()) -> None:
        self.lanes: dict[Any, list[tuple[float, float, int]]] = {}  # node -> (t0, t1, round)
        self.faults: list[tuple[float, Any, str]] = []  # (t, target, kind)
        # the node state changes, as columns: time, node (its index in _ids), state
        self._ct = array("d")
        self._cn = array("l")
        self._cs = array("b")
        self._in_order = True  # times never went back (a simulated log's are in order)
        self._index: dict[Any, int] = {}
        self._ids: list[Any] = []
        self.progress_t: list[float] = [0.0]
        self.progress_step: list[float] = [0.0]
        self.end = 0.0
        self.has_progress = False
        self.losses = LostTime(keep_spans=True)  # the lost-time bands (sim/losses.py)
        self._round_of: dict[Any, int] = {}
        self._open: dict[Any, tuple[float, int]] = {}
        self._closed = False
        self.nodes: list[Any] = []  # every node drawn, in order (set by close)
        for e in events:
            self.emit(e)

    @property
    def changes(self) -> list[tuple[float, Any, int]]:
        """The node state changes as ``(t, node, state)``, in the order seen."""
        ids = self._ids
        return [(t, ids[n], int(st)) for t, n, st in zip(self._ct, self._cn, self._cs, strict=True)]

    def _change(self, t: float, node: Any, state: int) -> None:
        i = self._index.get(node)
        if i is None:
            i = self._index[node] = len(self._ids)
            self._ids.append(node)
            if i == MAX_LANES:  # one node too many to draw lanes: stop keeping them
                self.lanes = {}
        if self._ct and t < self._ct[-1]:
            self._in_order = False
        self._ct.append(t)
        self._cn.append(i)
        self._cs.append(state)

    def _lanes_kept(self) -> bool:
        return len(self._ids) <= MAX_LANES

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
        self.losses.see_parts(t, node, kind, rank, fields)
        if t > self.end:
            self.end = t
        k, f = kind, fields
        open_ = self._open
        if k == kinds.RENDEZVOUS:
            self._round_of[node] = int(f.get("round", 0))
        elif k == kinds.AGENT_START:
            self._change(t, node, _BETWEEN)
        elif k == kinds.AGENT_GROUP_STARTED:
            open_[node] = (t, self._round_of.get(node, int(f.get("attempt", 0))))
            self._change(t, node, _RUNNING)
        elif k in (kinds.AGENT_GROUP_STOPPED, kinds.AGENT_FINISH, kinds.AGENT_REFUSED_START):
            self._close(open_, node, t)
            out = k != kinds.AGENT_GROUP_STOPPED
            self._change(t, node, _DOWN if out else _BETWEEN)
        elif k == "sim.fault" and f.get("applied", True):
            # a fault that found nothing to hit (its node already down) is not drawn
            target = f.get("target")
            fault = str(f.get("fault", "fault"))
            self.faults.append((t, target, fault))
            if fault in _DOWN_FAULTS and target is not None:
                self._close(open_, target, t)
                self._change(t, target, _DOWN)
        elif k == "sim.world_running":
            self.has_progress = True
            self.progress_t.append(t)
            self.progress_step.append(float(f.get("from_step", 0)))
        elif k == "sim.progress":
            self.has_progress = True
            # reached this step, then falls back to the last checkpoint
            self.progress_t += [t, t]
            self.progress_step += [float(f.get("steps", 0)), float(f.get("ckpt_step", 0))]

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
        """:meth:`emit_group` of the record with these parts, without it: the plot draws
        no worker's event; the lost-time accounting reads the first of a group's (one
        time, node and kind) where that is all it reads, else each."""
        if not ranks:
            return
        if t > self.end:
            self.end = t
        if kind not in LostTime.KINDS:
            return
        if kind in LostTime.FIRST_AT_AN_INSTANT:
            first = WorkerEvents.unchecked(t, node, kind, role, ranks[:1], keys, fields, columns)
            for e in first.events():
                self.losses.see_parts(e.t, e.node, e.kind, e.rank, e.fields)
            return
        group = WorkerEvents.unchecked(t, node, kind, role, ranks, keys, fields, columns)
        for e in group.events():
            self.emit_parts(e.t, e.node, e.kind, e.role, e.rank, e.fields)

    def close(self) -> None:
        """The log ended: lanes still open run to its last event."""
        if self._closed:
            return
        self._closed = True
        if self._lanes_kept():
            for node, (t0, rnd) in self._open.items():
                self.lanes.setdefault(node, []).append((t0, self.end, rnd))
        self._open = {}
        self.nodes = sorted(self._ids, key=lambda n: (str(type(n)), n))

    def _close(self, open_: dict[Any, tuple[float, int]], node: Any, t: float) -> None:
        if node in open_:
            t0, rnd = open_.pop(node)
            if self._lanes_kept():
                self.lanes.setdefault(node, []).append((t0, t, rnd))

    def _in_time_order(self) -> Iterable[tuple[float, Any, int]]:
        """The changes by time (stable: the order seen within one instant)."""
        ids = self._ids
        rows: Iterable[tuple[float, int, int]] = zip(self._ct, self._cn, self._cs, strict=True)
        if not self._in_order:
            rows = sorted(rows, key=lambda c: c[0])
        return ((t, ids[n], st) for t, n, st in rows)

    def down_spans(self) -> dict[Any, list[tuple[float, float]]]:
        """node -> [(t0, t1)] while it was down or excluded."""
        spans: dict[Any, list[tuple[float, float]]] = {}
        since: dict[Any, float] = {}
        for t, node, s in self._in_time_order():
            if s == _DOWN:
                since.setdefault(node, t)
            elif node in since:
                spans.setdefault(node, []).append((since.pop(node), t))
        for node, t0 in since.items():
            if t0 < self.end:
                spans.setdefault(node, []).append((t0, self.end))
        return spans

    def band(self) -> tuple[list[float], list[list[int]]]:
        """Times and, per state, how many nodes were in it from that time on."""
        state: dict[Any, int] = {}
        counts = [0, 0, 0]
        times: list[float] = []
        series: list[list[int]] = [[], [], []]
        for t, node, s in self._in_time_order():
            old = state.get(node)
            if old is not None:
                counts[old] -= 1
            counts[s] += 1
            state[node] = s
            if times and times[-1] == t:
                for i in range(3):
                    series[i][-1] = counts[i]
            else:
                times.append(t)
                for i in range(3):
                    series[i].append(counts[i])
        return times, series

    def band_means(
        self, bins: int, band: tuple[list[float], list[list[int]]] | None = None
    ) -> tuple[list[float], list[list[float]]]:
        """``bins`` + 1 equal bin edges over [0, end] and, per state, the mean number of
        nodes in it over each bin, weighted by time: the area each state covers in a
        bin is its node-time there, however many changes the bin holds.  ``band``:
        :meth:`band`'s result, if already computed."""
        end = self.end
        edges = [end * i / bins for i in range(bins + 1)]
        means: list[list[float]] = [[0.0] * bins for _ in range(3)]
        times, series = band if band is not None else self.band()
        if end <= 0 or not times:
            return edges, means
        width = end / bins
        for j, t0 in enumerate(times):
            t1 = times[j + 1] if j + 1 < len(times) else end
            if t1 <= t0:
                continue
            counts = [series[0][j], series[1][j], series[2][j]]
            b = min(int(t0 / width), bins - 1)
            while t0 < t1 and b < bins:
                upto = t1 if b + 1 >= bins else min(t1, max(t0, edges[b + 1]))
                share = (upto - t0) / width
                for s in range(3):
                    if counts[s]:
                        means[s][b] += counts[s] * share
                t0 = upto
                b += 1
        return edges, means

    def between_rises(self, band: tuple[list[float], list[list[int]]] | None = None) -> int:
        """How many times more nodes went between groups: at least once per restart (a
        spare waiting in rendezvous all along keeps the count above zero, so the count's
        rises are counted, not its returns to zero)."""
        _, series = band if band is not None else self.band()
        rises, before = 0, 0
        for c in series[_BETWEEN]:
            if c > before:
                rises += 1
            before = c
        return rises


#: the top band's bins when its restarts are too many to draw each one (about one per
#: pixel column of the figure's plot area)
BAND_BINS = 800


def plot_timeline(events: Iterable[AgentEvent] | Timeline, path: str, title: str = "") -> list[str]:
    """Write the timeline of ``events`` (or of a :class:`Timeline` fed the events as they
    happened) to ``path`` (PNG, SVG or PDF, by extension).

    Returns the legends' labels (what each colour and mark means), the top panel's first,
    then the lost-time bands shaded behind the progress line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    tl = events if isinstance(events, Timeline) else Timeline(events)
    tl.close()
    hours = tl.end > 3 * 3600
    scale = 3600.0 if hours else 1.0
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(12, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    handles: list[Any] = []
    lanes = len(tl.nodes) <= MAX_LANES
    index = {n: i for i, n in enumerate(tl.nodes)}
    cmap = plt.get_cmap("tab10")
    if lanes:
        rounds: set[int] = set()
        down = tl.down_spans()
        for node, spans in down.items():
            if node in index:
                bars = [(t0 / scale, (t1 - t0) / scale) for t0, t1 in spans]
                top.broken_barh(bars, (index[node] - 0.4, 0.8), facecolors="#d9d9d9", hatch="//")
        for n in tl.nodes:
            by_colour: dict[int, list[tuple[float, float]]] = {}
            for t0, t1, rnd in tl.lanes.get(n, []):
                by_colour.setdefault(rnd % 10, []).append((t0 / scale, max(t1 - t0, 0.0) / scale))
                rounds.add(rnd)
            for colour, bars in by_colour.items():
                top.broken_barh(bars, (index[n] - 0.4, 0.8), facecolors=cmap(colour))
        shown = sorted(rounds)
        for rnd in shown[:9]:
            handles.append(Patch(color=cmap(rnd % 10), label=f"group of rendezvous round {rnd}"))
        if len(shown) > 9:
            handles.append(Patch(color="white", label="… colours repeat every 10 rounds"))
        if down:
            handles.append(Patch(facecolor="#d9d9d9", hatch="//", label=_STATE_NAMES[_DOWN]))
        top.set_ylabel("node")
        top.set_ylim(-0.8, max(len(tl.nodes), 1) - 0.2)
        if len(tl.nodes) <= 40:
            top.set_yticks(range(len(tl.nodes)), [str(n) for n in tl.nodes])
        fault_y: dict[Any, float] = {n: float(i) for n, i in index.items()}
        band_y: float | None = None
        heading = "worker groups by node (colour = rendezvous round, the same on every node)"
    else:
        # A few restarts are drawn exactly, each at least a pixel wide (a 2-minute restart
        # in 55 h would vanish otherwise).  Past one restart per ten pixel columns those
        # widened edges would paint most of the band "between groups" (457 restarts in
        # 54 days: an ETTR of 0.93 drawn as mostly orange), so the band shows each state's
        # mean node count per bin instead: its area is its node-time.
        times, series = steps = tl.band()
        binned = tl.between_rises(steps) > BAND_BINS // 10
        rows: list[list[float]]
        if binned:
            edges, rows = tl.band_means(BAND_BINS, steps)
            xs_f = [t / scale for t in edges]
        else:
            xs_f = [t / scale for t in times] + [tl.end / scale]
            rows = [[float(v) for v in series[s]] for s in range(3)]
        base = [0.0] * len(rows[0])
        for s in (_RUNNING, _BETWEEN, _DOWN):
            upper = [b + v for b, v in zip(base, rows[s], strict=True)]
            top.fill_between(
                xs_f, base + base[-1:], upper + upper[-1:], step="post",
                facecolor=_STATE_COLOURS[s], edgecolor=_STATE_COLOURS[s],
                linewidth=0 if s == _RUNNING or binned else 0.8,
            )  # fmt: skip
            handles.append(Patch(color=_STATE_COLOURS[s], label=_STATE_NAMES[s]))
            base = upper
        top.set_ylabel("nodes" + (" (mean over each bin)" if binned else ""))
        top.set_ylim(0, max([*base, 1.0]) * 1.12)
        fault_y = {}
        band_y = max([*base, 1.0]) * 1.05
        heading = f"{len(tl.nodes)} nodes by state (faults marked above, by kind)"
        if binned:
            bin_s = tl.end / BAND_BINS
            each = f"{bin_s / 3600:.2g} h" if bin_s >= 3600 else f"{bin_s:.3g} s"
            heading += f"; many restarts: each state's mean per {each}"
    kinds: dict[str, tuple[list[float], list[float]]] = {}
    for t, target, kind in tl.faults:
        y = band_y if band_y is not None else fault_y.get(target)
        if y is None:
            continue
        xs_, ys_ = kinds.setdefault(kind, ([], []))
        xs_.append(t / scale)
        ys_.append(y)
    for kind, (fx, fy) in sorted(kinds.items()):
        marker = _FAULT_MARKS.get(kind, "o")
        top.scatter(fx, fy, marker=marker, color="red", s=40, zorder=3, linewidths=1.2)
        handles.append(
            Line2D([], [], marker=marker, color="red", linestyle="", label=f"fault: {kind}")
        )
    if handles:
        top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    top.set_title(title or heading, fontsize=10)
    if title:
        top.text(0.0, 1.01, heading, transform=top.transAxes, fontsize=8, va="bottom")
        top.set_title(title, fontsize=10, pad=14)
    lost_handles: list[Any] = []
    if tl.has_progress:
        bottom.plot([t / scale for t in tl.progress_t], tl.progress_step, color="black")
        tl.losses.result(tl.end)
        lost_spans = tl.losses.spans or []
        for part, shade in _LOST_COLOURS.items():
            lost_bars = [(a / scale, (z - a) / scale) for a, z, b in lost_spans if b == part]
            if lost_bars:
                bottom.broken_barh(lost_bars, (0, 1), transform=bottom.get_xaxis_transform(),
                                   facecolors=shade, alpha=0.45, linewidth=0)  # fmt: skip
                lost_handles.append(
                    Patch(color=shade, alpha=0.45, label=f"lost: {part.replace('_', ' ')}")
                )
        bottom.legend(
            handles=[
                Line2D([], [], color="black", label="step reached (dips: back to checkpoint)"),
                *lost_handles,
            ],
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
        )
    else:
        bottom.text(0.5, 0.5, "no training-progress events in this log", ha="center",
                    va="center", transform=bottom.transAxes)  # fmt: skip
    bottom.set_ylabel("step")
    bottom.set_xlabel("hours" if hours else "seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [str(h.get_label()) for h in (*handles, *lost_handles)]
