"""Scenario files: the YAML that describes a simulated run (DESIGN §5), in four parts.

- :mod:`sim.scenario.model`: what a scenario holds, as frozen dataclasses, and what each
  fault kind takes (``KIND_FIELDS``);
- :mod:`sim.scenario.reader`: YAML → model, with one-line errors naming the file, line,
  key, value and what was expected (built on :mod:`sim.scenario.walker`, within
  :mod:`sim.scenario.limits`);
- :mod:`sim.scenario.writer`: model → YAML that reads back equal (``Scenario.to_yaml()``);
- :mod:`sim.scenario.expand`: rate faults and failure generators → timed faults, drawn
  from the "faults" random generator of the seed.

This module re-exports the public names so that ``from sim.scenario import ...`` keeps
working; code inside ``sim/`` imports from the part it needs.
"""

from __future__ import annotations

from sim.scenario.expand import expand_faults, fault_rng
from sim.scenario.limits import (
    MAX_EXPANDED_FAULTS,
    MAX_FAULTS,
    MAX_NODES,
    MAX_SCENARIO_BYTES,
    MAX_SECONDS,
    MAX_WORKERS,
    MAX_YAML_NODES,
)
from sim.scenario.model import (
    DEFAULT_UNTIL,
    Agent,
    Cluster,
    Fault,
    FaultKind,
    Job,
    RateFault,
    RendezvousBackendName,
    RendezvousSpec,
    Scenario,
    StoreSpec,
)
from sim.scenario.reader import load_scenario, load_scenario_text

__all__ = [
    "DEFAULT_UNTIL",
    "MAX_EXPANDED_FAULTS",
    "MAX_FAULTS",
    "MAX_NODES",
    "MAX_SCENARIO_BYTES",
    "MAX_SECONDS",
    "MAX_WORKERS",
    "MAX_YAML_NODES",
    "Agent",
    "Cluster",
    "Fault",
    "FaultKind",
    "Job",
    "RateFault",
    "RendezvousBackendName",
    "RendezvousSpec",
    "Scenario",
    "StoreSpec",
    "expand_faults",
    "fault_rng",
    "load_scenario",
    "load_scenario_text",
]
