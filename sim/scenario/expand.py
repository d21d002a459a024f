"""Expansion: rate faults and failure generators → the timed faults a run injects.

:func:`expand_faults` is how a random run becomes data: the faults it draws can be written
back as an explicit scenario with
``scenario.with_faults(expand_faults(scenario, fault_rng(scenario.seed))).to_yaml()``
(``elastic sim --write-faults``), replayed and shrunk (``elastic minimize``).  The failure
generators' draws (``failures:``, :mod:`sim.failures`, with its presets) join the file's
own rate faults here.
"""

from __future__ import annotations

import random

from elastic.errors import ConfigError
from sim.scenario.limits import MAX_EXPANDED_FAULTS
from sim.scenario.model import (
    KIND_FIELDS,
    PARAM_FIELDS,
    Fault,
    FaultKind,
    Need,
    RateFault,
    Scenario,
)

__all__ = ["expand_faults", "fault_rng"]


def fault_rng(seed: int) -> random.Random:
    """The "faults" random generator for ``seed``, separate from every other concern's.

    Seeded from a string (hashed with SHA-512 by :mod:`random`), so it is the same on every
    platform and Python run, whatever ``PYTHONHASHSEED`` is.
    """
    return random.Random(f"elastic/faults/{seed}")


def expand_faults(scenario: Scenario, rng: random.Random) -> list[Fault]:
    """Turn every rate fault into timed faults; return all faults sorted by (time, file index).

    Guarantees: a pure function of the scenario's faults, cluster and ``until`` and of the
    state of ``rng`` (one 64-bit draw is taken from it).  Each rate fault draws from its own
    generators, derived from that draw and its index, one for times and one for targets, so
    adding or changing one fault leaves the others' draws unchanged.  Drawn times are rounded
    to the millisecond, so the explicit scenario reads well; targets are drawn uniformly among
    the nodes that exist by then (initial, spare, and joined before it) and the local ranks.
    """
    base = rng.getrandbits(64)
    occurrences: list[tuple[float, int, int, Fault | RateFault]] = []
    drawn = 0
    for index, spec in enumerate(scenario.faults):
        if isinstance(spec, Fault):
            occurrences.append((spec.at, index, 0, spec))
            continue
        times = random.Random(f"{base}/{index}/times")
        end = scenario.until if spec.end is None else spec.end
        clock = spec.start
        sequence = 0
        while True:
            clock += times.expovariate(1.0 / spec.every)
            at = round(clock, 3)
            if at >= end:
                break
            occurrences.append((at, index, sequence, spec))
            sequence += 1
            drawn += 1
            # only drawn faults count: the file's own are bounded by MAX_FAULTS at load
            if drawn > 2 * MAX_EXPANDED_FAULTS:
                raise ConfigError(
                    scenario.source,
                    f"faults[{index}]: drew more than {2 * MAX_EXPANDED_FAULTS} faults; "
                    "expected fewer (raise every or narrow from/to)",
                )
    if scenario.failures is not None:
        from sim.failures import generate  # sim.failures imports sim.scenario, hence here

        # indices below 0 (-1 unexpected, -2 planned): their own target generators, which
        # adding a fault to the file does not shift
        streams = {"unexpected": -1, "planned": -2}
        for at, stream, sequence, template in generate(
            scenario.failures, scenario.cluster, 0.0, scenario.until, base
        ):
            occurrences.append((at, streams[stream], sequence, template))
    occurrences.sort(key=lambda o: (o[0], o[1], o[2]))
    targets: dict[int, random.Random] = {}
    existing = scenario.cluster.nodes + scenario.cluster.spare_nodes
    expanded: list[Fault] = []
    for at, index, _, spec in occurrences:
        if isinstance(spec, Fault):
            fault = spec
        else:
            key = f"{base}/{index}/targets" if index >= 0 else f"{base}/failures{index}/targets"
            draw = targets.setdefault(index, random.Random(key))
            fault = _draw(spec, at, draw, existing, scenario.cluster.nproc_per_node)
        if fault.kind is FaultKind.NODE_JOIN:
            existing += fault.count or 1
        expanded.append(fault)
    return expanded


def _draw(spec: RateFault, at: float, draw: random.Random, existing: int, nproc: int) -> Fault:
    needs = KIND_FIELDS[spec.kind]
    values = {name: getattr(spec, name) for name in PARAM_FIELDS}
    # draw in a fixed order (node, local_rank, nodes) so the stream is reproducible
    if needs.get("node") is Need.TARGET and values["node"] is None:
        values["node"] = draw.randrange(existing)
    if needs.get("local_rank") is Need.TARGET and values["local_rank"] is None:
        values["local_rank"] = draw.randrange(nproc)
    if needs.get("nodes") is Need.TARGET and values["nodes"] is None:
        values["nodes"] = (draw.randrange(existing),)
    return Fault(at=at, kind=spec.kind, **values)
