"""The report of a run, computed from its event log alone (DESIGN §4).

The same function reads a simulated run's events or a real run's JSON-lines log.

Definitions:

* ``state`` — ``TIMEOUT`` if the run hit ``until``; else ``SUCCEEDED`` if some agent
  finished SUCCEEDED; else ``UNHEALTHY`` if an agent ended so and none FAILED; else
  ``FAILED`` (including a job whose every node crashed or left).
* ``restarts`` — restarts that spent the budget: the most any one agent spent (what its
  workers saw as ``TORCHELASTIC_RESTART_COUNT`` at the end).
* ``membership_restarts`` — restarts for membership changes (no budget spent): the most
  any one agent did.
* ``rendezvous_rounds`` — distinct rendezvous rounds that completed.
* ``world_size`` — workers in the last group started.
* ``steps_done`` — useful steps: all of them when the job finished, else the last
  completed checkpoint.  ``goodput`` = steps_done * step_time / sim_time_s.
* ``recovery_s`` — for each fault that broke the running training, the time until
  training ran again (a new world formed); ``recovery_s_max`` its maximum.
* ``hangs_detected`` — groups declared UNHEALTHY plus workers reaped by a timer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from elastic.events import AgentEvent

__all__ = ["REPORT_KEYS", "build_report"]

REPORT_KEYS = (
    "name",
    "state",
    "restarts",
    "membership_restarts",
    "rendezvous_rounds",
    "world_size",
    "steps_done",
    "sim_time_s",
    "goodput",
    "events",
    "recovery_s",
    "recovery_s_max",
    "recovery_count",
    "hangs_detected",
    "final_nodes",
    "seed",
)


def build_report(events: Iterable[AgentEvent]) -> dict[str, Any]:
    evs = list(events)
    # a real run's log has no sim.* events: a worker failure, a membership change or an
    # unhealthy verdict breaks the group, and the next group start ends the recovery
    simulated = any(e.kind == "sim.start" for e in evs)
    breaks = (
        {"sim.world_broken"}
        if simulated
        else {
            "torchelastic.worker.status.FAILED",
            "agent.membership_change",
            "agent.unhealthy",
        }
    )
    resumes = "sim.world_running" if simulated else "agent.group_started"
    t0 = evs[0].t if evs else 0.0
    start: dict[str, Any] = {}
    end: dict[str, Any] = {}
    end_t = 0.0
    finishes: list[AgentEvent] = []
    restarts_by_agent: dict[tuple[Any, int], int] = {}
    membership_by_agent: dict[tuple[Any, int], int] = {}
    incarnation: dict[Any, int] = {}
    rounds: set[int] = set()
    world_size = 0
    hangs = 0
    pending_faults: list[float] = []
    recoveries: list[float] = []
    for e in evs:
        k = e.kind
        if k == "sim.start":
            start = dict(e.fields)
        elif k == "sim.end":
            end = dict(e.fields)
            end_t = e.t
        elif k == "agent.start":
            incarnation[e.node] = incarnation.get(e.node, 0) + 1
        elif k == "agent.finish":
            finishes.append(e)
            key = (e.node, incarnation.get(e.node, 0))
            restarts_by_agent[key] = int(e.fields.get("restarts", 0))
        elif k == "agent.restart" and e.fields.get("reason") == "membership":
            key = (e.node, incarnation.get(e.node, 0))
            membership_by_agent[key] = membership_by_agent.get(key, 0) + 1
        elif k == "RENDEZVOUS":
            rounds.add(int(e.fields.get("round", 0)))
        elif k == "agent.group_started":
            world_size = int(e.fields.get("world_size", world_size))
        elif k in ("agent.unhealthy", "watchdog.kill_worker_process"):
            hangs += 1
        if k in breaks:
            pending_faults.append(e.t)
        elif k == resumes and pending_faults:
            recoveries.extend(e.t - t for t in pending_faults)
            pending_faults = []
    if not end_t and evs:
        end_t = max(e.t for e in evs)
    if end.get("reason") == "until":
        state = "TIMEOUT"
    else:
        states = [str(f.fields.get("state")) for f in finishes]
        if "SUCCEEDED" in states:
            state = "SUCCEEDED"
        elif "UNHEALTHY" in states and "FAILED" not in states:
            state = "UNHEALTHY"
        else:
            # failed, or every node crashed or left before the job finished
            state = "FAILED"
    step_time = float(start.get("step_time", 0.0))
    steps_done = int(end.get("steps_done", 0))
    end_t -= t0
    goodput = steps_done * step_time / end_t if end_t > 0 else 0.0
    recovery = [round(r, 6) for r in recoveries]
    return {
        "name": start.get("name", ""),
        "state": state,
        "restarts": max(restarts_by_agent.values(), default=0),
        "membership_restarts": max(membership_by_agent.values(), default=0),
        "rendezvous_rounds": len(rounds),
        "world_size": world_size,
        "steps_done": steps_done,
        "sim_time_s": round(end_t, 6),
        "goodput": round(goodput, 6),
        "events": len(evs),
        "recovery_s": recovery,
        "recovery_s_max": max(recovery, default=0.0),
        "recovery_count": len(recovery),
        "hangs_detected": hangs,
        "final_nodes": int(end.get("final_nodes", len({f.node for f in finishes}))),
        "seed": start.get("seed", 0),
    }
