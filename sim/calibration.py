"""Calibration files: numbers measured on real machines that a scenario may default to.

``elastic sim SCENARIO --calibration FILE`` reads a JSON object (at most 1 MiB) such as
the one ``bench/bench_warm.py`` writes next to its report (``bench/results/warm.json``)::

    {"preload_saves": 5.2, ...}

Known keys (others are kept for the reader, and ignored):

``preload_saves``
    seconds of a worker's start that ``elastic run --preload`` removes (the measured
    cold restart minus the warm one, to every worker's next training step).  A scenario
    whose ``job:`` does not say ``preload_saves`` gets this, at most its
    ``startup_time``; one that says it keeps its own.

Bad input is one :class:`~elastic.errors.ConfigError` line naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from elastic.errors import ConfigError
from sim.scenario import Scenario

__all__ = ["MAX_CALIBRATION_BYTES", "Calibration", "apply_calibration", "load_calibration"]

MAX_CALIBRATION_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class Calibration:
    """What a calibration file says (None: the file does not say it)."""

    source: str
    preload_saves: float | None = None


def load_calibration(path: str | Path) -> Calibration:
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CALIBRATION_BYTES + 1)
    except OSError as e:
        raise ConfigError(source, f"cannot read the calibration file: {e.strerror}") from None
    if len(data) > MAX_CALIBRATION_BYTES:
        raise ConfigError(
            source, f"larger than {MAX_CALIBRATION_BYTES} bytes; expected a calibration file"
        )
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(source, f"not JSON ({e}); expected a JSON object") from None
    if not isinstance(doc, dict):
        raise ConfigError(source, f"got a JSON {type(doc).__name__}; expected an object")
    saves = doc.get("preload_saves")
    if saves is not None and (
        isinstance(saves, bool)
        or not isinstance(saves, int | float)
        or not math.isfinite(saves)
        or saves < 0
    ):
        raise ConfigError(
            f"{source}: preload_saves", f"got {saves!r}; expected seconds (a number >= 0)"
        )
    return Calibration(source, None if saves is None else float(saves))


def apply_calibration(sc: Scenario, cal: Calibration) -> Scenario:
    """``sc`` with the calibration's defaults for what its file leaves unsaid."""
    job = sc.job
    if job.preload_saves is None and cal.preload_saves is not None:
        job = dataclasses.replace(job, preload_saves=min(cal.preload_saves, job.startup_time))
    return dataclasses.replace(sc, job=job)
