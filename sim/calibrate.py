"""``elastic calibrate``: measure this machine's latencies and write a calibration file.

What is measured (wall seconds; the median of every sample):

* ``store_rtt_s`` — one round trip to the network store *as an agent sees it*: the
  agents' rank assignments (``ASSIGN_WORKER_RANKS``, a few store operations, timed by
  the agent) divided by the number of round trips one makes (the simulator, running
  the same agent code, counts them).  The bare loopback round trip (a client and a
  store host alone, 200 ``set`` and ``get``) is recorded too: an agent's is several
  times longer (its client and its loop's other work are in it);
* from a real run (``elastic real``) of a small built-in scenario — two agents of two
  workers, two worker crashes — read from its merged log:

  - ``spawn_s``: the last agent's rendezvous round completed (``RENDEZVOUS``) → the
    world's workers running (``sim.world_running``, the slowest member ready, minus the
    job's start-up time, which the model worker counts from its process's start): rank
    assignment, the group's set-up, fork and exec;
  - ``stop_s``: an agent decides to restart (``agent.restart``) → its group is stopped
    (``agent.group_stopped``);
  - ``reaction_s``: a worker exits (``model.crash``) → its agent has seen the exit
    (``torchelastic.worker.status.FAILED``);
  - and, for the record (``info``), the rendezvous rounds' own durations.

:mod:`sim.calibration` says how the simulator applies them.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from elastic.errors import ConfigError
from elastic.events import AgentEvent, kinds
from sim.calibration import Calibration
from sim.cliparse import OneLineParser
from sim.scenario.model import Scenario, StoreSpec
from sim.scenario.reader import load_scenario_text

__all__ = ["CALIBRATION_SCENARIO", "main", "measure", "phases"]

CALIBRATION_SCENARIO = """
name: calibration (two agents of two workers, two worker crashes)
seed: 0
until: 1h
cluster: {nodes: 2, nproc_per_node: 2}
job: {steps: 70, step_time: 1s, startup_time: 5s, checkpoint_every: 10, checkpoint_time: 1s}
rendezvous: {min_nodes: 2, max_nodes: 2, heartbeat_timeout: 10s, last_call_timeout: 1s}
agent: {max_restarts: 5, shutdown_timeout: 10s}
faults:
  - {at: 20s, kind: worker_crash, node: 1, local_rank: 1, exit_code: 3}
  - {at: 45s, kind: worker_crash, node: 0, local_rank: 0, exit_code: 3}
"""


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def phases(events: Sequence[AgentEvent], startup_time: float, k: float) -> dict[str, list[float]]:
    """The samples of each latency (wall seconds) in a merged real log at time scale ``k``."""
    evs = sorted(events, key=lambda e: e.t)
    out: dict[str, list[float]] = {
        "spawn_s": [],
        "stop_s": [],
        "reaction_s": [],
        "rdzv_s": [],
        "assign_s": [],  # durations logged in wall time already
    }
    last_rdzv: dict[Any, float] = {}
    restart_at: dict[Any, float] = {}
    crash_at: dict[tuple[Any, Any], float] = {}
    for e in evs:
        if e.kind == kinds.RENDEZVOUS:
            last_rdzv[e.node] = e.t
            if int(e.fields.get("round", 0)) > 0 and "duration_ms" in e.fields:
                out["rdzv_s"].append(float(e.fields["duration_ms"]) / 1000)
        elif e.kind == "sim.world_running" and last_rdzv:
            # the world runs when its slowest member is ready: that member's spawn is
            # what a recovery waits for, so the sample is per world, after the round's
            # last agent finished it
            out["spawn_s"].append((e.t - startup_time - max(last_rdzv.values())) / k)
        elif e.kind == kinds.AGENT_RESTART:
            restart_at[e.node] = e.t
        elif e.kind == kinds.AGENT_GROUP_STOPPED and e.node in restart_at:
            out["stop_s"].append((e.t - restart_at.pop(e.node)) / k)
        elif e.kind == kinds.ASSIGN_WORKER_RANKS and "duration_ms" in e.fields:
            out["assign_s"].append(float(e.fields["duration_ms"]) / 1000)
        elif e.kind == "model.crash":
            crash_at[(e.node, e.rank)] = e.t
        elif e.kind == kinds.WORKER_FAILED and (e.node, e.rank) in crash_at:
            out["reaction_s"].append((e.t - crash_at.pop((e.node, e.rank))) / k)
    return out


async def _store_rtt(port: int, n: int) -> list[float]:
    from elastic.real.clock import AsyncioClock
    from elastic.real.netstore import NetStoreClient

    client = await NetStoreClient.connect(
        "127.0.0.1", port, token=None, clock=AsyncioClock(), connect_timeout=10, read_timeout=10
    )
    samples: list[float] = []
    try:
        for i in range(n):
            t = time.perf_counter()
            await client.set(f"calibrate/{i % 8}", b"x" * 64)
            samples.append(time.perf_counter() - t)
            t = time.perf_counter()
            await client.get(f"calibrate/{i % 8}", 10)
            samples.append(time.perf_counter() - t)
    finally:
        await client.aclose()
    return samples


def store_rtt(n: int = 200) -> list[float]:
    """Round trips (seconds) to a store host on loopback, ``2 n`` samples."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastic.real.netstore_host", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("listening "):
            raise RuntimeError(f"the store host did not start: {line!r}")
        return asyncio.run(_store_rtt(int(line.rsplit(":", 1)[1]), n))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def measure(time_scale: float = 10.0, runs: int = 1) -> Calibration:
    """Measure this machine (real processes; a few seconds per run at scale 10)."""
    from sim.realrun import real_run

    sc = load_scenario_text(CALIBRATION_SCENARIO, "<calibration>")
    samples: dict[str, list[float]] = {
        "spawn_s": [],
        "stop_s": [],
        "reaction_s": [],
        "rdzv_s": [],
        "assign_s": [],
    }
    for _ in range(runs):
        result = real_run(sc, time_scale)
        for key, xs in phases(result.events, sc.job.startup_time, time_scale).items():
            samples[key] += xs
    rtt = store_rtt()
    trips = assign_round_trips(sc)
    agent_rtt = _median(samples["assign_s"]) / trips
    return Calibration(
        # the rank assignment's round trips are in the sample, and the simulator makes
        # them before it starts the workers' start-up: not counted twice
        spawn_s=max(0.0, _median(samples["spawn_s"]) - trips * agent_rtt),
        stop_s=_median(samples["stop_s"]),
        reaction_s=_median(samples["reaction_s"]),
        store_rtt_s=agent_rtt,
        info={
            "machine": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "time_scale": time_scale,
            "runs": runs,
            "samples": {k: len(v) for k, v in samples.items()} | {"store_rtt_s": len(rtt)},
            "rendezvous_round_s": round(_median(samples["rdzv_s"]), 6),
            # the bare loopback round trip, for the record: an agent's is several times
            # longer (its client, its loop's other work), and that is what the model needs
            "store_rtt_loopback_s": round(_median(rtt), 6),
            "assign_round_trips": trips,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )


def assign_round_trips(sc: Scenario) -> float:
    """How many store round trips one rank assignment makes: the simulator counts them
    (the same agent code), as its duration over a round trip's."""
    from sim.run import simulate

    latency = 0.0005
    result = simulate(replace(sc, store=StoreSpec(latency=latency), faults=()), keep_events=True)
    durations = [
        float(e.fields["duration_ms"]) / 1000
        for e in result.events
        if e.kind == kinds.ASSIGN_WORKER_RANKS and "duration_ms" in e.fields
    ]
    return max(1.0, round(_median(durations) / (2 * latency), 2))


def main(argv: Sequence[str]) -> int:
    """Measure this machine's latencies and write a calibration file for the simulator."""
    p = OneLineParser(
        prog="elastic calibrate",
        description="Measure this machine's latencies (real processes) and write a "
        "calibration file for `elastic sim --calibration` or a scenario's calibration: key.",
    )
    p.add_argument("-o", "--output", default="calibration.json", help="the file to write")
    p.add_argument(
        "--time-scale", type=float, default=10.0, metavar="K", help="the real run's time scale"
    )
    p.add_argument("--runs", type=int, default=1, help="real runs to measure (more: steadier)")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    args = p.parse_args(list(argv))
    try:
        if not 0 < args.time_scale < float("inf"):
            raise ConfigError("--time-scale", f"got {args.time_scale}; expected K > 0")
        if args.runs < 1:
            raise ConfigError("--runs", f"got {args.runs}; expected an integer >= 1")
        out = Path(args.output)
        if not out.parent.is_dir():
            raise ConfigError("--output", f"got {args.output!r}; its directory does not exist")
    except ConfigError as e:
        print(f"elastic calibrate: {e}", file=sys.stderr)
        return 2
    cal = measure(args.time_scale, args.runs)
    data = cal.to_dict()
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(f.name, out)
    if args.json:
        print(json.dumps(data, sort_keys=True))
    else:
        for key in ("spawn_s", "stop_s", "reaction_s", "store_rtt_s"):
            print(f"  {key:<12} {data[key] * 1000:8.2f} ms")
        print(f"wrote {out}")
    return 0
