"""A small simulated job on two nodes with the faults a test gives: its whole event log."""

from __future__ import annotations

from typing import Any

import yaml

from sim.run import simulate
from sim.scenario import load_scenario_text


def two_node_events(faults: list[dict[str, Any]], steps: int = 400) -> list[Any]:
    """Two nodes x 2 workers, 1 s steps, min 1 / max 3 nodes, 10 restarts, 2 h."""
    text = yaml.safe_dump(
        {
            "cluster": {"nodes": 2, "nproc_per_node": 2},
            "job": {"steps": steps, "step_time": "1s", "startup_time": "1s"},
            "rendezvous": {"min_nodes": 1, "max_nodes": 3},
            "agent": {"max_restarts": 10},
            "until": "2h",
            "faults": faults,
        }
    )
    return list(simulate(load_scenario_text(text), keep_events=True).events)
