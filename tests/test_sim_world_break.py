"""A stopped world reads its workers group by group (``World.break_``'s fast path) and
gives the event log that reading them rank by rank gives (the path kept for a world where
a global rank joined twice)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sim.run import simulate
from sim.scenario import load_scenario
from sim.workers import SimGroup, World

ROOT = Path(__file__).resolve().parent.parent
# breaks by a crash, a hang (whose survivors fail at the collective timeout), a stop
SCENARIOS = [
    "worker_hang_collective_timeout.yaml",
    "worker_crash_restarts.yaml",
    "membership_joins_leaves_crashes.yaml",
    "node_crash_while_round_forms.yaml",
]


def _log_hash(name: str, seed: int | None) -> str:
    result = simulate(load_scenario(ROOT / "scenarios" / name), seed=seed, keep_events=True)
    h = hashlib.sha256()
    for e in result.events:
        h.update(e.to_json().encode())
    return h.hexdigest()


@pytest.mark.parametrize("seed", [None, 7])
@pytest.mark.parametrize("name", SCENARIOS)
def test_break_by_group_gives_the_log_of_break_by_rank(
    name: str, seed: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _log_hash(name, seed)
    join = World.join_group
    by_rank: list[World] = []

    def join_counted_twice(self: World, g: SimGroup) -> None:
        join(self, g)
        self._joined += 1  # as if a rank had joined twice: break_ reads rank by rank
        by_rank.append(self)

    monkeypatch.setattr(World, "join_group", join_counted_twice)
    assert _log_hash(name, seed) == fast
    assert by_rank
