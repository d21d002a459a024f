"""Warm restarts: a gloo DDP job whose rank 1 crashes, under torchrun, ``elastic run`` and
``elastic run --preload``, A/B/C interleaved on one machine.

    python bench/bench_warm.py [--runs 7] [--out bench/results/warm.md]

It also writes ``warm.json`` next to the report: the calibration file ``elastic sim
--calibration`` reads (``preload_saves``: elastic's cold restart minus the warm one).

The job (written to a temporary directory): 2 workers, ``--standalone``, gloo on CPU; a
small model, SGD, a checkpoint by rank 0 every 2 steps (then a barrier), resumed from at
start.  Each worker appends ``(rank, attempt, event, time.time())`` lines to a file at
its milestones: ``start`` (the script's first line), ``imported`` (``import torch``
done), ``pg`` (``init_process_group`` done), ``model`` (model and optimiser built),
``ckpt`` (checkpoint loaded, on a restart), ``ddp`` (``DistributedDataParallel()``
returned) and ``step`` (each training step done).  In its first attempt rank 1 raises
an exception at step 6 (after writing ``crash``); the launcher restarts the group and
both ranks resume from the step-5 checkpoint and train 3 more steps.

Measured, per run, from those timestamps (one clock, one machine):

* **crash → every worker's next training step**: from rank 1's ``crash`` to the later of
  the two ranks' first ``step`` of the second attempt;
* **launch → first training step**: from just before the launcher's ``Popen`` to the
  later of the two ranks' first ``step``;
* for the restart, where the time goes: crash → both restarted workers running (their
  ``start``), then per phase (the later rank's), to the step.

Systems: ``torchrun`` (``python -m torch.distributed.run`` with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: stock torchrun 2.13 often fails to restart this
job), ``elastic`` (``elastic run``) and ``elastic --preload`` (``--preload`` with
:data:`PRELOAD`: ``torch`` and what the first ``DDP()`` imports lazily).  Runs rotate the
order each round.  A script, not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
PRELOAD = "torch,torch._dynamo"
SYSTEMS = {
    "torchrun": [PY, "-m", "torch.distributed.run"],
    "elastic": [PY, "-m", "elastic.cli", "run"],
    "elastic --preload": [PY, "-m", "elastic.cli", "run", "--preload", PRELOAD],
}
CRASH_AT = 6
STEPS = 9

JOB = f"""
import gc, os, time
T0 = time.monotonic()
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
_log = open(os.environ["BENCH_LOG"], "a", buffering=1)
def mark(event):
    _log.write(f"{{RANK}} {{ATTEMPT}} {{event}} {{time.monotonic()!r}}\\n")
mark_start = T0
_log.write(f"{{RANK}} {{ATTEMPT}} start {{T0!r}}\\n")
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
mark("imported")
dist.init_process_group("gloo", init_method="env://")
mark("pg")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
mark("model")
path = os.path.join(os.environ["BENCH_CKPT"], "ckpt.pt")
start = 0
if os.path.exists(path):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = int(state["step"]) + 1
    mark("ckpt")
ddp = DistributedDataParallel(model)
mark("ddp")
for step in range(start, {STEPS}):
    if step == {CRASH_AT} and RANK == 1 and ATTEMPT == 0:
        mark("crash")
        raise RuntimeError("rank 1 crashes mid-training")
    g = torch.Generator().manual_seed(1000 * step + RANK)
    x = torch.randn(64, 64, generator=g)
    y = x.sum(dim=1, keepdim=True)
    opt.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    mark("step")
    if (step + 1) % 2 == 0:
        if RANK == 0:
            torch.save({{"step": step, "model": model.state_dict(), "opt": opt.state_dict()}},
                       path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()
# the DDP reducer before interpreter shutdown (see examples/ddp_gloo.py: left to it,
# gloo can die in std::terminate at exit), then the group once every rank is done
del ddp
gc.collect()
dist.barrier()
dist.destroy_process_group()
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env.update(extra)
    return env


def one_run(
    system: str, script: str, work: Path, timeout: float = 180.0
) -> dict[str, float] | None:
    """Run the job once; the measurements of this run (seconds), None if it failed."""
    log, ckpt = work / "events.log", work / "ckpt"
    ckpt.mkdir(parents=True)
    agent_log = work / "agent_events.jsonl"
    cmd = [
        *SYSTEMS[system],
        *(("--event-log", str(agent_log)) if system != "torchrun" else ()),
        *("--standalone", "--nproc-per-node", "2", "--max-restarts", "1", script),
    ]
    env = _env(BENCH_LOG=str(log), BENCH_CKPT=str(ckpt), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    with open(work / "launcher.out", "wb") as out:
        t_launch = time.monotonic()
        p = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if p.returncode != 0:
        keep = Path(tempfile.gettempdir()) / f"bench_warm_failed_{work.name}_{os.getpid()}.out"
        keep.write_bytes((work / "launcher.out").read_bytes())
        print(f"{system}: exit {p.returncode}; its output: {keep}", flush=True)
        return None
    ev: dict[tuple[int, int, str], float] = {}
    for line in log.read_text().splitlines():
        r, a, name, t = line.split()
        ev.setdefault((int(r), int(a), name), float(t))  # the first of each (first step)
    crash = ev[(1, 0, "crash")]

    def later(attempt: int, name: str) -> float:
        return max(ev[(r, attempt, name)] for r in (0, 1))

    res = {
        "restart": later(1, "step") - crash,
        "launch": later(0, "step") - t_launch,
        "r_running": later(1, "start") - crash,
    }
    for prefix, attempt, phases in (
        ("r", 1, ("start", "imported", "pg", "model", "ckpt", "ddp", "step")),
        ("l", 0, ("start", "imported", "pg", "model", "ddp", "step")),
    ):
        for prev, name in itertools.pairwise(phases):
            res[f"{prefix}_{name}"] = later(attempt, name) - later(attempt, prev)
    res["l_running"] = later(0, "start") - t_launch
    if agent_log.exists():  # the agent's side of the restart, on the same clock
        agent: dict[str, float] = {}
        for line in agent_log.read_text().splitlines():
            e = json.loads(line)
            attempt = e["fields"].get("attempt")
            if e["kind"] == "torchelastic.worker.status.FAILED" and attempt == 0:
                agent.setdefault("failed", e["t"])
            elif e["kind"] == "agent.restart":
                agent.setdefault("restart", e["t"])
            elif e["kind"] == "agent.group_started" and attempt == 1:
                agent.setdefault("started", e["t"])
        res["a_exit_seen"] = agent["failed"] - crash
        res["a_restart"] = agent["started"] - agent["failed"]
        res["a_to_running"] = later(1, "start") - agent["started"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "warm.md"))
    a = ap.parse_args()
    names = list(SYSTEMS)
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    failed: dict[str, int] = dict.fromkeys(names, 0)
    with tempfile.TemporaryDirectory(prefix="bench_warm_") as d:
        script = Path(d) / "ddp_job.py"
        script.write_text(textwrap.dedent(JOB))
        for i in range(a.runs):
            order = names[i % len(names) :] + names[: i % len(names)]
            for n in order:
                r = one_run(n, str(script), Path(d) / f"{i}_{n.replace(' ', '_')}")
                if r is None:
                    failed[n] += 1
                    continue
                results[n].append(r)
                print(
                    f"run {i + 1}/{a.runs} {n:18s} crash→steps {r['restart']:.2f} s, "
                    f"launch→step {r['launch']:.2f} s",
                    flush=True,
                )
    text = report(results, a.runs, failed)
    Path(a.out).write_text(text)
    print(text)
    Path(a.out).with_suffix(".json").write_text(json.dumps(calibration(results), indent=1) + "\n")


def calibration(results: dict[str, list[dict[str, float]]]) -> dict[str, object]:
    """The calibration file ``elastic sim --calibration`` reads (see sim/calibration.py)."""
    tr, el, pre = (results[n] for n in SYSTEMS)
    return {
        "what": "bench/bench_warm.py: gloo DDP, 2 workers, rank 1 crashes; medians, seconds",
        "machine": f"{os.cpu_count()} CPUs {platform.machine()}, Linux {platform.release()}",
        "preload": PRELOAD,
        "preload_saves": round(_med(el, "restart") - _med(pre, "restart"), 3),
        "restart_torchrun": round(_med(tr, "restart"), 3),
        "restart_elastic": round(_med(el, "restart"), 3),
        "restart_elastic_preload": round(_med(pre, "restart"), 3),
    }


def _med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report(results: dict[str, list[dict[str, float]]], runs: int, failed: dict[str, int]) -> str:
    tr, el, pre = (results[n] for n in SYSTEMS)
    lines = [
        "# Warm restarts: gloo DDP, 2 workers, rank 1 crashes (torch 2.13.0 CPU)",
        "",
        f"Command: `python bench/bench_warm.py --runs {runs}`",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), Python "
        f"{platform.python_version()}, Linux {platform.release()}; load average at the "
        f"end {', '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        f"Runs: {runs} per system, interleaved (order rotated each round); medians. "
        f"`--preload {PRELOAD}`.  Failed runs (left out): "
        + ", ".join(f"{n} {k}" for n, k in failed.items())
        + ".",
        "",
        "| measurement (s) | torchrun | elastic | elastic --preload | elastic/torchrun "
        "| --preload/torchrun | goal |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for key, label, goal in (
        ("restart", "crash → every worker's next training step", "≤ 1/5"),
        ("launch", "launch → first training step", ""),
    ):
        t, e, p = _med(tr, key), _med(el, key), _med(pre, key)
        lines.append(
            f"| {label} | {t:.2f} | {e:.2f} | {p:.2f} | {e / t:.3f} | {p / t:.3f} | {goal} |"
        )
    lines += [
        "",
        "Runs (crash → steps, s): "
        + "; ".join(
            f"{n} {min(r['restart'] for r in rows):.2f} to {max(r['restart'] for r in rows):.2f}"
            for n, rows in results.items()
        ),
        "",
        "## Where the restart goes (medians of the later rank, s)",
        "",
        "| phase | torchrun | elastic | elastic --preload |",
        "|---|---:|---:|---:|",
    ]
    phases = (
        ("a_exit_seen", "crash → the agent sees rank 1's exit (its exception and teardown)"),
        ("a_restart", "the agent: stop rank 0, new round, start both workers"),
        ("a_to_running", "started → both workers' first line (fork or exec)"),
        ("r_running", "crash → both restarted workers' first line"),
        ("r_imported", "`import torch` (and torch.distributed, nn)"),
        ("r_pg", "`init_process_group` (gloo, rendezvous on the store)"),
        ("r_model", "model and optimiser built"),
        ("r_ckpt", "checkpoint loaded"),
        ("r_ddp", "`DistributedDataParallel()` (first in the process)"),
        ("r_step", "first training step"),
    )
    for key, label in phases:
        t = f"{_med(tr, key):.3f}" if key in tr[0] else "n/a"
        lines.append(f"| {label} | {t} | {_med(el, key):.3f} | {_med(pre, key):.3f} |")
    lines += [
        "",
        "## Where the launch goes (medians of the later rank, s)",
        "",
        "| phase | torchrun | elastic | elastic --preload |",
        "|---|---:|---:|---:|",
    ]
    for key, label in (
        ("l_running", "launch → both workers' first line"),
        ("l_imported", "`import torch`"),
        ("l_pg", "`init_process_group`"),
        ("l_model", "model and optimiser"),
        ("l_ddp", "`DistributedDataParallel()`"),
        ("l_step", "first training step"),
    ):
        lines.append(
            f"| {label} | {_med(tr, key):.3f} | {_med(el, key):.3f} | {_med(pre, key):.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
