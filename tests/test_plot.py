"""The timeline plot: legible at any size, a legend for every colour and mark, and fast
on the README's 512-node scenario (issue 13 item 4)."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from sim.run import simulate
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("matplotlib")


def test_small_cluster_lanes_have_a_legend_entry_for_every_colour_and_fault(tmp_path: Path) -> None:
    from sim.plot import plot_timeline

    result = simulate(
        load_scenario(ROOT / "scenarios" / "node_crash_comes_back.yaml"), keep_events=True
    )
    out = tmp_path / "t.svg"
    labels = plot_timeline(result.events, str(out), "t")
    assert out.read_bytes().lstrip().startswith(b"<?xml")
    kinds = {str(e.fields["fault"]) for e in result.events if e.kind == "sim.fault"}
    for kind in kinds:
        assert f"fault: {kind}" in labels
    assert "group of rendezvous round 0" in labels
    assert "down or excluded" in labels  # the crashed node's gap is drawn and named


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_512_node_plot_is_a_band_drawn_in_10_s_and_300_mb(tmp_path: Path) -> None:
    from sim.plot import plot_timeline

    result = simulate(
        load_scenario(ROOT / "scenarios" / "large_gpu_failures_every_3h.yaml"), keep_events=True
    )
    tracemalloc.start()
    # CPU time, not wall: on a loaded machine the wall clock measures the neighbours
    t0 = time.process_time()
    labels = plot_timeline(result.events, str(tmp_path / "large.png"), "512")
    took = time.process_time() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert took <= 10.0, took
    assert peak <= 300 * 2**20, peak
    assert labels[:3] == [
        "running a worker group",
        "between groups (stop, rendezvous, start)",
        "down or excluded",
    ]
    assert "fault: gpu_error" in labels


def _restarting(nodes: int, restarts: int, hours: float, gap: float, spares: int = 0) -> list[Any]:
    """A cluster that spends ``gap`` seconds between groups at each of ``restarts``
    evenly spaced restarts over ``hours``, and ``spares`` nodes that wait in rendezvous
    all along (the count between groups never returns to zero)."""
    from elastic.events import AgentEvent, kinds

    events = [AgentEvent(0.0, n, kinds.AGENT_START) for n in range(nodes + spares)]
    period = hours * 3600 / restarts
    for r in range(restarts):
        up = r * period + gap
        events += [AgentEvent(up, n, kinds.AGENT_GROUP_STARTED) for n in range(nodes)]
        down = (r + 1) * period
        events += [AgentEvent(down, n, kinds.AGENT_GROUP_STOPPED) for n in range(nodes)]
    return events


def _colour_share(png: Path, colour: str, other: str) -> float:
    """The share of ``colour``'s pixels among ``colour``'s and ``other``'s."""
    import matplotlib.image

    img = matplotlib.image.imread(str(png))[..., :3]
    counts = []
    for c in (colour, other):
        rgb = [int(c[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        near = (abs(img - rgb) < 0.02).all(axis=-1)
        counts.append(int(near.sum()))
    return counts[0] / max(sum(counts), 1)


@pytest.mark.parametrize(
    ("restarts", "gap", "spares"), [(500, 200.0, 0), (500, 200.0, 4), (30, 600.0, 0)]
)
def test_the_band_shows_time_between_groups_in_proportion(
    tmp_path: Path, restarts: int, gap: float, spares: int
) -> None:
    """Many short restarts (Llama 3's 457 in 54 days) must not paint the band "between
    groups": each state's area is its node-time, within a few points, with spares
    waiting all along or not.  A few restarts stay drawn one by one, each visible."""
    from sim.plot import BAND_BINS, plot_timeline

    hours, nodes = 1000.0, 100
    out = tmp_path / "band.png"
    plot_timeline(_restarting(nodes, restarts, hours, gap, spares), str(out), "t")
    between = _colour_share(out, "#ff7f0e", "#2ca02c")
    span = hours * 3600
    true = (nodes * restarts * gap + spares * span) / ((nodes + spares) * span)
    if restarts > BAND_BINS // 10:
        assert abs(between - true) < 0.03, (between, true)
    else:
        # exact drawing, every restart at least a pixel wide: visible, not drowned
        assert between >= true, (between, true)
        assert between < 0.2, between


def test_band_means_keep_each_states_node_time() -> None:
    from sim.plot import Timeline

    tl = Timeline(_restarting(7, 13, 10.0, 333.0))
    tl.close()
    times, series = tl.band()
    edges, means = tl.band_means(37)
    width = edges[1] - edges[0]
    for s in range(3):
        exact = sum(
            series[s][j] * ((times[j + 1] if j + 1 < len(times) else tl.end) - times[j])
            for j in range(len(times))
        )
        assert sum(means[s]) * width == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize(
    "name", ["node_crash_comes_back.yaml", "membership_joins_leaves_crashes.yaml"]
)
def test_a_streamed_timeline_is_the_one_built_from_the_whole_log(name: str) -> None:
    """``elastic sim --plot`` streams the run into the timeline as events' parts (no event
    objects, a group of workers' events read once); what it gathers is what the whole
    log gives, event by event."""
    from sim.plot import Timeline

    sc = load_scenario(ROOT / "scenarios" / name)
    streamed = Timeline()
    simulate(sc, sink=streamed)
    whole = Timeline(simulate(sc, keep_events=True).events)
    for tl in (streamed, whole):
        tl.close()
    assert streamed.changes == whole.changes and streamed.changes
    assert streamed.lanes == whole.lanes and streamed.faults == whole.faults
    assert streamed.nodes == whole.nodes and streamed.end == whole.end
    assert (streamed.progress_t, streamed.progress_step) == (whole.progress_t, whole.progress_step)
    assert streamed.losses.result(streamed.end) == whole.losses.result(whole.end)
    assert streamed.losses.spans == whole.losses.spans


def test_a_large_cluster_keeps_no_lanes_and_its_changes_compact() -> None:
    from sim.plot import MAX_LANES, Timeline

    tl = Timeline(_restarting(MAX_LANES + 1, 3, 1.0, 60.0))
    tl.close()
    assert tl.lanes == {}  # drawn as a band: lanes would never be read
    assert len(tl.changes) == (MAX_LANES + 1) * (1 + 2 * 3)
    small = Timeline(_restarting(MAX_LANES, 3, 1.0, 60.0))
    small.close()
    assert len(small.lanes) == MAX_LANES
