"""The simulator against the first-order models of checkpointing.

Kokolis et al. (Meta, "Revisiting Reliability in Large-Scale ML Research Clusters", 2024):
with Poisson failures at rate r per node on N nodes, checkpoint interval Δt, checkpoint write
time w and restart overhead u,

    E[ETTR] ≈ (1 - N·r·(u + Δt/2)) / (1 + w/Δt)        where N·r·Δt ≪ 1,

and Young (1974): the interval that maximizes it is near √(2·w·MTBF), MTBF = 1/(N·r).
Here the failures are worker crashes (seen at once, restarted in place: u is the start-up
time, as rendezvous and stopping take milliseconds in the model) drawn by ``failures:`` with
an ``mtbf`` per node.
"""

from __future__ import annotations

import math

import pytest

from sim.run import simulate
from sim.scenario import load_scenario_text

NODES = 8
MTBF_NODE_H = 80.0  # one node; the job fails every 10 h
STARTUP = 60.0  # u
WRITE = 30.0  # w
STEP = 1.0

TEMPLATE = """
seed: {seed}
until: {until}
cluster: {{nodes: {nodes}, nproc_per_node: 1}}
job:
  steps: {steps}
  step_time: 1s
  startup_time: {startup}s
  checkpoint_every: {every}
  checkpoint_time: {write}s
agent: {{max_restarts: 100000}}
failures:
  unexpected:
    mtbf: {mtbf}h
    per: node
    categories: [{{name: crash, kind: worker_crash}}]
"""


def _ettr(every: int, hours: float, seed: int) -> float:
    text = TEMPLATE.format(
        seed=seed,
        until=f"{math.ceil(hours * 1.3)}h",
        nodes=NODES,
        steps=int(hours * 3600 / STEP),
        startup=STARTUP,
        every=every,
        write=WRITE,
        mtbf=MTBF_NODE_H,
    )
    report = simulate(load_scenario_text(text)).report
    assert report["state"] == "SUCCEEDED", report["why"]
    ettr: float = report["ettr"]
    return ettr


def _kokolis(interval: float) -> float:
    rate = NODES / (MTBF_NODE_H * 3600.0)
    return (1 - rate * (STARTUP + interval / 2)) / (1 + WRITE / interval)


@pytest.mark.timeout(120)
def test_simulated_ettr_agrees_with_the_kokolis_first_order_model() -> None:
    interval = 600  # N·r·Δt = 8/(80 h) x 600 s ≈ 0.017 ≪ 1
    simulated = sum(_ettr(interval, 300.0, seed) for seed in range(3)) / 3
    expected = _kokolis(interval)  # ≈ 0.943
    assert simulated == pytest.approx(expected, abs=0.01)


@pytest.mark.timeout(120)
def test_the_best_swept_interval_is_youngs() -> None:
    young = math.sqrt(2 * WRITE * MTBF_NODE_H * 3600.0 / NODES)  # ≈ 1,470 s
    candidates = [round(young * f / STEP) for f in (0.25, 0.5, 1.0, 2.0, 4.0)]
    # one long run each, the same seed: the same failure times for every interval
    ettrs = {every: _ettr(every, 2000.0, seed=5) for every in candidates}
    best = max(ettrs, key=lambda every: ettrs[every])
    assert best == candidates[2], ettrs
    # and the model's curve has its maximum there too
    assert max(candidates, key=_kokolis) == candidates[2]
