"""The limits a scenario file is held to (DESIGN §3: size limits on everything read).

Each is refused by the reader with the file, line, key, value and the limit:

- the file: at most ``MAX_SCENARIO_BYTES`` (4 MiB), YAML nested at most ``MAX_DEPTH`` (64)
  levels, at most ``MAX_YAML_NODES`` (300,000) scalars and collections in all — counted while
  the depth is checked, before the tree is built, so an oversized file is refused in well
  under a second;
- ``cluster``: at most ``MAX_NODES`` (10,000) nodes, spare nodes, min/max nodes, and nodes
  that can ever exist (with timed and drawn ``node_join`` counts); at most ``MAX_WORKERS``
  (100,000) workers (nodes and spares times ``nproc_per_node``, itself ≤ ``MAX_NPROC``,
  4,096).  Measured: 10,000 nodes of 8 workers simulate 100 steps in ≈11 s and ≈280 MB;
- ``faults``: at most ``MAX_FAULTS`` (10,000) entries, rate faults drawing at most
  ``MAX_EXPANDED_FAULTS`` (10,000) in expectation (twice that at most); a node list at
  most ``MAX_NODES`` long;
- numbers: integers (steps, counts, restarts…) at most ``MAX_INT`` (10¹²), seeds at most
  2⁶⁴, exit codes within ±``MAX_EXIT`` (2³¹); durations at most ``MAX_SECONDS`` (100 years);
  rendezvous timeouts at least ``MIN_RDZV_TIMEOUT`` (1 s: torch reads them as whole seconds,
  so a ``1ms`` timeout would be 0); ``slow_node`` factors at most ``MAX_FACTOR`` (10⁶).

They keep a typo (an extra zero or ten) from building a simulation that cannot fit in
memory or time.
"""

from __future__ import annotations

__all__ = [
    "MAX_DEPTH",
    "MAX_EXIT",
    "MAX_EXPANDED_FAULTS",
    "MAX_FACTOR",
    "MAX_FAULTS",
    "MAX_INT",
    "MAX_NODES",
    "MAX_NPROC",
    "MAX_SCENARIO_BYTES",
    "MAX_SECONDS",
    "MAX_WORKERS",
    "MAX_YAML_NODES",
    "MIN_RDZV_TIMEOUT",
]

#: A scenario file larger than this is refused before parsing.
MAX_SCENARIO_BYTES = 4 << 20
#: Rate faults may draw at most this many faults per run in expectation (twice that at most),
#: so that the run written back as an explicit scenario stays under MAX_SCENARIO_BYTES.
MAX_EXPANDED_FAULTS = 10_000
MAX_NODES = 10_000
MAX_WORKERS = 100_000
MAX_FAULTS = 10_000
MAX_YAML_NODES = 300_000
MAX_SECONDS = 100 * 365.25 * 86400.0
MAX_NPROC = 4096
MAX_INT = 10**12
MAX_EXIT = 2**31
MAX_FACTOR = 1e6
MIN_RDZV_TIMEOUT = 1.0
#: A scenario nests about four levels (faults → fault → nodes); this is far above that.
MAX_DEPTH = 64
