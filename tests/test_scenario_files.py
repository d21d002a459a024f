"""Every scenario shipped in scenarios/ is valid and writes back (to_yaml) to an equal scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.scenario import expand_faults, fault_rng, load_scenario, load_scenario_text

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.yaml"))


@pytest.mark.skipif(not SCENARIOS, reason="no scenarios/ directory")
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenario_loads_round_trips_and_expands(path: Path) -> None:
    scenario = load_scenario(path)
    assert load_scenario_text(scenario.to_yaml()) == scenario
    explicit = scenario.with_faults(expand_faults(scenario, fault_rng(scenario.seed)))
    assert load_scenario_text(explicit.to_yaml()) == explicit
