"""Multi-node benchmarks of ``elastic run`` against torchrun: K agents of one job on loopback.

    python bench/bench_multinode.py [--runs 5] [--out bench/results/multinode.md]

Every agent is a real process (``python -m elastic.cli run`` or ``python -m
torch.distributed.run``) with ``--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT``,
one worker each; the two systems run alternately (A/B interleaved), ``--runs`` times
each, and the table gives medians and the ratio elastic/torchrun.

1. **last join → every worker started** (``--nnodes K``, K = 2, 4, 8): K-1 agents are
   started and wait in the rendezvous; then the K-th.  From the moment the K-th agent
   logs that it begins the rendezvous (the time the line reaches this process: elastic's
   "attempts to join the next round", torch's message; torchrun's "Rendezvous'ing worker
   group", printed just before its handler's) to the latest worker start.  Each worker is
   a shell script run with ``--no-python`` that first writes ``date +%s.%N``: its start
   is a fork and an exec, so the row measures the launchers, not this machine's Python
   start-up (K interpreters started together are given beside it, for scale).  Neither
   agent's own start-up (imports, store connection) is counted.
2. **SIGKILL of one worker of a 2-agent job → both agents' workers running again**:
   from the kill to the latest start of a new worker on either agent.
3. **``--nnodes 2:4`` with 2 agents: last join → started**, with ``last_call_timeout=1``:
   the round closes when the last call ends, so the target is that second + 50 ms.

A script, not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = {
    "elastic": [PY, "-m", "elastic.cli", "run"],
    "torchrun": [PY, "-m", "torch.distributed.run"],
}
# The line an agent logs as it begins the rendezvous (INFO): elastic's is torch's
# dynamic-rendezvous message; torchrun's own rendezvous logger does not print that one at
# LOGLEVEL=INFO, so its agent's "Rendezvous'ing worker group" (just before it) is used.
JOIN_LINE = {
    "elastic": "attempts to join the next round",
    "torchrun": "Rendezvous'ing worker group",
}

# The worker is a shell script run with --no-python (both launchers take it): its start
# costs a fork and an exec, not a Python interpreter's 25 ms, so the rows measure the
# launchers, not how fast this machine starts K interpreters (the floor is beside them).
WORKER = """#!/bin/sh
t=$(date +%s.%N)
name="start.$AGENT.$TORCHELASTIC_RESTART_COUNT.$$"
printf '%s' "$t" > "$OUT_DIR/$name.tmp" && mv "$OUT_DIR/$name.tmp" "$OUT_DIR/$name"
while [ ! -e "$OUT_DIR/stop" ]; do sleep 0.02; done
"""
# the same worker in Python, for the floor row (K interpreters started together)
PY_WORKER = """
import os, time
t = time.time()
out = os.environ["OUT_DIR"]
name = "start.%s.%s.%d" % (os.environ["AGENT"], os.environ["TORCHELASTIC_RESTART_COUNT"],
                           os.getpid())
with open(os.path.join(out, name + ".tmp"), "w") as f:
    f.write(repr(t))
os.rename(os.path.join(out, name + ".tmp"), os.path.join(out, name))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    """One agent process; its stderr lines are time-stamped as they arrive."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.time(), line))

    def first(self, text: str, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if text in line:
                    return t
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.005)
        tail = "".join(line for _, line in self.lines[-20:])
        raise RuntimeError(f"no line with {text!r} (exit {self.proc.poll()}):\n{tail}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


class Job:
    def __init__(self, system: str, d: Path, nnodes: str, conf: str) -> None:
        self.system = system
        self.d = d
        self.out = d / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.script = d / "worker.sh"
        self.script.write_text(WORKER)
        self.script.chmod(0o755)
        self.port = free_port()
        self.nnodes = nnodes
        self.conf = conf
        self.agents: list[Agent] = []

    def start(self, name: str) -> Agent:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC"))}
        env.update(OUT_DIR=str(self.out), AGENT=name, LOGLEVEL="INFO", PYTHONUNBUFFERED="1")
        cmd = [
            *SYSTEMS[self.system],
            "--nnodes", self.nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", "bench",
            "--rdzv-conf", self.conf, "--max-restarts", "3", "--monitor-interval", "0.1",
            "--no-python", str(self.script),
        ]  # fmt: skip
        a = Agent(cmd, env)
        self.agents.append(a)
        return a

    def starts(self) -> list[tuple[str, int, float, int]]:
        """(agent, restart count, start time, pid) of every worker start so far."""
        found = []
        for f in self.out.glob("start.*"):
            if f.name.endswith(".tmp"):
                continue
            _, agent, count, pid = f.name.split(".")
            with contextlib.suppress(ValueError, OSError):
                found.append((agent, int(count), float(f.read_text()), int(pid)))
        return found

    def wait_starts(
        self, pred: Callable[[list[tuple[str, int, float, int]]], bool]
    ) -> list[tuple[str, int, float, int]]:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            s = self.starts()
            if pred(s):
                return s
            time.sleep(0.005)
        raise RuntimeError(f"{self.system}: workers did not start: {self.starts()}")

    def close(self) -> None:
        (self.out / "stop").write_text("")
        for a in self.agents:
            try:
                a.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                a.kill()
            with contextlib.suppress(Exception):
                a.kill()


def last_join(system: str, d: Path, k: int) -> float:
    job = Job(system, d, str(k), "join_timeout=120,last_call_timeout=30")
    try:
        first = [job.start(f"a{i}") for i in range(k - 1)]
        for a in first:
            a.first(JOIN_LINE[system])
        time.sleep(1.5)  # they are waiting in the rendezvous now
        t0 = job.start(f"a{k - 1}").first(JOIN_LINE[system])
        s = job.wait_starts(lambda s: len(s) >= k)
        return max(t for _, _, t, _ in s) - t0
    finally:
        job.close()


def interpreters(d: Path, k: int) -> float:
    """K worker interpreters started together by Popen alone → the last one's first line.

    What any launcher pays on this machine for K workers (the floor of row 1).
    """
    out = d / "out"
    out.mkdir(parents=True, exist_ok=True)
    script = d / "worker.py"
    script.write_text(PY_WORKER)
    env = dict(os.environ, OUT_DIR=str(out), TORCHELASTIC_RESTART_COUNT="0")
    t0 = time.time()
    procs = [
        subprocess.Popen([PY, "-u", str(script)], env=dict(env, AGENT=f"a{i}")) for i in range(k)
    ]
    for p in procs:
        p.wait(timeout=60)
    starts = [float(f.read_text()) for f in out.glob("start.*") if not f.name.endswith(".tmp")]
    return max(starts) - t0


def kill_worker(system: str, d: Path) -> float:
    job = Job(system, d, "2", "join_timeout=120,last_call_timeout=30")
    try:
        job.start("a")
        job.start("b")
        s = job.wait_starts(lambda s: len(s) >= 2)
        time.sleep(0.5)
        victim = next(pid for agent, _, _, pid in s if agent == "b")
        t0 = time.time()
        os.kill(victim, signal.SIGKILL)
        later = job.wait_starts(lambda s: {a for a, _, t, _ in s if t > t0} == {"a", "b"})
        return max(t for _, _, t, _ in later if t > t0) - t0
    finally:
        job.close()


def last_call(system: str, d: Path) -> float:
    job = Job(system, d, "2:4", "join_timeout=120,last_call_timeout=1")
    try:
        a = job.start("a")
        a.first(JOIN_LINE[system])
        time.sleep(0.5)
        t0 = job.start("b").first(JOIN_LINE[system])
        s = job.wait_starts(lambda s: len(s) >= 2)
        return max(t for _, _, t, _ in s) - t0
    finally:
        job.close()


def ab(runs: int, fn: Callable[[str, Path], float]) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {"elastic": [], "torchrun": []}
    for i in range(runs):
        for system in ("elastic", "torchrun"):
            with tempfile.TemporaryDirectory() as d:
                res[system].append(fn(system, Path(d)))
        print(f"  run {i + 1}: elastic {res['elastic'][-1]:.3f} s, "
              f"torchrun {res['torchrun'][-1]:.3f} s", file=sys.stderr, flush=True)  # fmt: skip
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "bench/results/multinode.md"))
    p.add_argument("--ks", default="2,4,8")
    args = p.parse_args()
    med = statistics.median
    rows = []
    for k in (int(x) for x in args.ks.split(",")):
        print(f"last join -> started, K={k}", file=sys.stderr)
        r = ab(args.runs, lambda s, d, k=k: last_join(s, d, k))
        floors = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as d:
                floors.append(interpreters(Path(d), k))
        e, t = med(r["elastic"]), med(r["torchrun"])
        rows.append(
            (
                f"K = {k} agents: last join → every worker started (for scale: {k} Python "
                f"interpreters started together take {med(floors) * 1000:.0f} ms here)",
                e,
                t,
                "≤ 1/20",
                r,
            )
        )
    print("SIGKILL of a worker -> both agents' workers running", file=sys.stderr)
    r = ab(args.runs, kill_worker)
    rows.append(("2 agents: SIGKILL of one worker → both agents' workers running again",
                 med(r["elastic"]), med(r["torchrun"]), "≤ 1/10", r))  # fmt: skip
    print("--nnodes 2:4 with 2 agents, last_call_timeout=1", file=sys.stderr)
    r = ab(args.runs, last_call)
    rows.append(("`--nnodes 2:4`, 2 agents, last call 1 s: last join → started",
                 med(r["elastic"]), med(r["torchrun"]), "≤ 1.050 s (elastic)", r))  # fmt: skip
    lines = [
        "# Multi-node benchmarks: `elastic run` vs torchrun (torch 2.13.0 CPU), K agents on "
        "loopback",
        "",
        f"`python bench/bench_multinode.py --runs {args.runs}` on {platform.node()} "
        f"({os.cpu_count()} CPUs), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        "A/B interleaved, medians; see the script's docstring for what each row measures.",
        "",
        "| measurement | elastic | torchrun | elastic/torchrun | target "
        "| runs (elastic; torchrun) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, e, t, target, r in rows:
        spread = (", ".join(f"{x * 1000:.0f}" for x in r["elastic"]) + "; "
                  + ", ".join(f"{x * 1000:.0f}" for x in r["torchrun"]) + " ms")  # fmt: skip
        lines.append(
            f"| {name} | {e * 1000:.0f} ms | {t * 1000:.0f} ms | {e / t:.3f} | {target} | "
            f"{spread} |"
        )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
