"""The timeline plot: legible at any size, a legend for every colour and mark, and fast
on the README's 512-node scenario (issue 13 item 4)."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

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
