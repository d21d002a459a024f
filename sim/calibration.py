"""This machine's latencies, measured by ``elastic calibrate``, applied to the simulator.

A calibration file is JSON (at most 64 KiB) with wall-clock seconds measured on real
processes (see :mod:`sim.calibrate` for how each is measured):

``spawn_s``
    an agent's rendezvous round completed → its workers' processes running (rank
    assignment, the group's set-up, the fork and exec).  The simulator starts a
    worker's ``startup_time`` when its agent starts the group, so this is added to it.
``stop_s``
    an agent decides to stop its workers → the group is stopped (SIGTERM, the workers'
    handlers, the reaping): the model's ``stop_time``.
``reaction_s``
    a worker exits → its agent has seen the exit: delays the simulated exit notice.
``store_rtt_s``
    one round trip to the network store: the simulated store's one-way ``latency`` is
    half of it.
``preload_saves``
    seconds of a worker's start that ``elastic run --preload`` removes (the measured cold
    restart minus the warm one, to every worker's next training step; what
    ``bench/bench_warm.py`` writes to ``bench/results/warm.json``).  A scenario whose
    ``job:`` does not say ``preload_saves`` gets this, at most its ``startup_time``; one
    that says it keeps its own.

Each key is optional (an absent one is not measured and not applied); at least one
must be there, and ``version``, when present, is 1.  Other keys are kept for the reader
and ignored.  ``elastic calibrate`` writes the four latencies; ``bench_warm`` the last.

A real run at ``--time-scale K`` spends these in wall time, which is ``K`` times as much
scenario time; so the simulator applies them multiplied by the time scale of the real
run it is compared with (1 for a real run in real time).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from elastic.errors import ConfigError
from sim.scenario.model import Scenario, StoreSpec

__all__ = [
    "MAX_CALIBRATION_BYTES",
    "Calibration",
    "ModelLatencies",
    "apply_calibration",
    "load_calibration",
    "scenario_calibration",
]

MAX_CALIBRATION_BYTES = 64 << 10
FIELDS = ("spawn_s", "stop_s", "reaction_s", "store_rtt_s")


@dataclass(frozen=True, slots=True)
class ModelLatencies:
    """What the simulator's worker model and store take from a calibration."""

    extra_startup: float = 0.0
    stop_time: float = 0.0
    exit_notice: float = 0.0


@dataclass(frozen=True, slots=True)
class Calibration:
    # None: the file does not say (not measured, not applied)
    spawn_s: float | None = None
    stop_s: float | None = None
    reaction_s: float | None = None
    store_rtt_s: float | None = None
    info: dict[str, Any] | None = None  # what else was measured, and where
    preload_saves: float | None = None

    def latencies(self, time_scale: float = 1.0) -> ModelLatencies:
        k = time_scale
        return ModelLatencies(
            (self.spawn_s or 0.0) * k, (self.stop_s or 0.0) * k, (self.reaction_s or 0.0) * k
        )

    def store(self, time_scale: float = 1.0) -> StoreSpec:
        return StoreSpec(latency=(self.store_rtt_s or 0.0) / 2 * time_scale)

    def apply_store(self, sc: Scenario, time_scale: float = 1.0) -> Scenario:
        """``sc`` with the measured store latency (unchanged when none was measured)."""
        if self.store_rtt_s is None:
            return sc
        return replace(sc, store=self.store(time_scale))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": 1}
        for f in FIELDS:
            v = getattr(self, f)
            if v is not None:
                out[f] = round(v, 6)
        if self.preload_saves is not None:
            out["preload_saves"] = round(self.preload_saves, 6)
        if self.info:
            out["info"] = self.info
        return out


def load_calibration(path: str | Path, where: str = "--calibration") -> Calibration:
    """Read a calibration file; a bad one is a :class:`ConfigError` naming ``where``."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CALIBRATION_BYTES + 1)
    except OSError as e:
        raise ConfigError(where, f"{path}: cannot read it: {e.strerror}") from None
    if len(raw) > MAX_CALIBRATION_BYTES:
        raise ConfigError(where, f"{path}: larger than {MAX_CALIBRATION_BYTES} bytes")
    try:
        d = json.loads(raw)
    except ValueError:
        raise ConfigError(
            where, f"{path}: not JSON; expected a file from elastic calibrate"
        ) from None
    if not isinstance(d, dict):
        raise ConfigError(where, f"{path}: got a JSON {type(d).__name__}; expected an object")
    if d.get("version", 1) != 1:
        raise ConfigError(where, f"{path}: version {d.get('version')!r}; expected 1")
    if not any(k in d for k in (*FIELDS, "preload_saves")):
        raise ConfigError(
            where,
            f"{path}: none of {', '.join((*FIELDS, 'preload_saves'))}; expected a file from "
            "elastic calibrate or bench/bench_warm.py",
        )
    values: dict[str, float] = {}
    for key in FIELDS:
        if key not in d:
            continue
        v = d[key]
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or not 0 <= v < 60
        ):
            raise ConfigError(where, f"{path}: {key}: got {v!r}; expected seconds in [0, 60)")
        values[key] = float(v)
    saves = d.get("preload_saves")
    if saves is not None and (
        isinstance(saves, bool)
        or not isinstance(saves, int | float)
        or not math.isfinite(saves)
        or saves < 0
    ):
        raise ConfigError(
            where, f"{path}: preload_saves: got {saves!r}; expected seconds (a number >= 0)"
        )
    info = d.get("info")
    return Calibration(
        **values,
        info=info if isinstance(info, dict) else None,
        preload_saves=None if saves is None else float(saves),
    )


def apply_calibration(sc: Scenario, cal: Calibration) -> Scenario:
    """``sc`` with the calibration's ``preload_saves`` where its ``job:`` says none."""
    job = sc.job
    if job.preload_saves is None and cal.preload_saves is not None:
        job = replace(job, preload_saves=min(cal.preload_saves, job.startup_time))
    return replace(sc, job=job)


def scenario_calibration(sc: Scenario) -> Calibration | None:
    """The calibration a scenario names (``calibration: FILE``, relative to the scenario)."""
    if not sc.calibration:
        return None
    path = Path(sc.calibration)
    if not path.is_absolute() and not sc.source.startswith("<"):
        path = Path(sc.source).parent / path
    return load_calibration(path, where=f"{sc.source}: calibration")
