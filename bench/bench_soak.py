"""Soak: a crash-looping ``elastic run`` job whose workers leak, sampled at every attempt.

    python bench/bench_soak.py [--restarts 1000] [--out bench/results/soak.md]

Each worker (``tests/leaky_worker.py``) starts a helper (``sleep``), a double-forked
daemon that keeps the agent's marker and a double-forked daemon started with
``env={}`` (no marker: only the agent's subreaper parentage and its cgroup find it),
then exits 1.
The agent (``--nproc-per-node 2 --max-restarts N``) restarts the group N times.  At
every attempt the agent's open fds, threads, zombie children and RSS are sampled
(psutil, from outside).  Afterwards the job's processes are looked for: none may be
left.  ``tests/test_soak.py`` runs the same for 55 restarts and for each way the agent
can end (normally, SIGTERM, SIGINT, SIGHUP, SIGKILL, an exception inside the agent).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "leaky_worker.py")
NPROC = 2

# an agent (elastic run) whose own code fails at the start of its group number AFTER+1
INJECT = """
import sys
from elastic.real import workers

after = int(sys.argv.pop(1))
original = workers.ProcessWorkers.start
calls = [0]

async def start(self, launches):
    calls[0] += 1
    if calls[0] > after:
        raise RuntimeError("injected agent failure")
    return await original(self, launches)

workers.ProcessWorkers.start = start
from elastic.run import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Sample:
    attempt: int
    fds: int
    threads: int
    zombies: int
    rss: int


@dataclass
class Soak:
    returncode: int | None = None
    samples: list[Sample] = field(default_factory=list)
    leftovers: list[int] = field(default_factory=list)
    #: what each leftover was: "pid ppid state cmdline"
    details: list[str] = field(default_factory=list)
    #: attempt → pids each worker wrote: [helper, marked daemon, env={} daemon] per worker
    pids: dict[int, list[list[int]]] = field(default_factory=dict)
    seconds: float = 0.0
    stderr: str = ""
    agent_pid: int = 0
    #: the last attempt whose workers were seen to start (sampled or not: a fast attempt
    #: may end, and the agent with it, before its sample is taken)
    reached: int = -1


def token() -> str:
    """A sleep duration unique to one run: its processes are found by command line."""
    return f"300.{os.getpid()}{time.monotonic_ns() % 10**9}"


def sleepers(tok: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if cmd[-1:] == [tok] and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.pid)
    return out


def marked(var: str, value: str) -> list[int]:
    """Live processes whose environment holds ``var=value`` (workers, the sidecar)."""
    needle = f"\0{var}={value}\0".encode()
    out = []
    for pid in psutil.pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = b"\0" + f.read() + b"\0"
            if needle in env and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except (OSError, psutil.Error):
            continue
    return out


def sample(agent: psutil.Process, attempt: int) -> Sample | None:
    try:
        with agent.oneshot():
            zombies = sum(1 for c in agent.children() if c.status() == psutil.STATUS_ZOMBIE)
            return Sample(
                attempt, agent.num_fds(), agent.num_threads(), zombies, agent.memory_info().rss
            )
    except psutil.Error:
        return None


def run(
    restarts: int,
    mode: str = "crash",
    *,
    end: str = "exit",
    env_tag: tuple[str, str] | None = None,
    timeout: float = 600.0,
    flags: Sequence[str] = (),
) -> Soak:
    """Run the job; ``end``: "exit" (let it end), a signal name sent once attempt
    ``restarts`` is up, or "inject" (the agent raises when it would start that one);
    ``flags``: more ``elastic run`` flags (``--preload json``, say)."""
    tok = token()
    out = Soak()
    with tempfile.TemporaryDirectory(prefix="soak_") as where:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        if env_tag is not None:
            env[env_tag[0]] = env_tag[1]
        args = [
            "--nproc-per-node",
            str(NPROC),
            "--max-restarts",
            str(restarts),
            "--log-dir",
            os.path.join(where, "logs"),
            "--monitor-interval",
            "0.1",
            "--shutdown-timeout",
            "3",
            *flags,
            WORKER,
            where,
            mode,
            tok,
        ]
        if end == "inject":
            cmd = [sys.executable, "-c", INJECT, str(restarts), *args]
        else:
            cmd = [sys.executable, "-m", "elastic.cli", "run", *args]
        t0 = time.monotonic()
        # a file, not a pipe: nobody reads a pipe until the end, and a thousand restarts'
        # log lines fill one (the agent would block writing to it)
        err = tempfile.TemporaryFile(dir=where)  # noqa: SIM115  # closed below
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        agent = psutil.Process(proc.pid)
        out.agent_pid = proc.pid
        deadline = t0 + timeout
        last = restarts if end == "exit" else restarts - (1 if end == "inject" else 0)

        def started(attempt: int) -> bool:
            # a worker's file: the other may be stopped before it writes its own
            return any((Path(where) / f"{r}_{attempt}").exists() for r in range(NPROC))

        try:
            attempt = 0
            while attempt <= last:
                if started(attempt):
                    out.reached = attempt
                    s = sample(agent, attempt)
                    if s is not None:
                        out.samples.append(s)
                    attempt += 1
                elif started(attempt + 1):
                    out.reached = attempt + 1
                    attempt += 1  # passed before it could be sampled
                elif proc.poll() is not None or time.monotonic() > deadline:
                    break
                else:
                    time.sleep(0.002)
            if end not in ("exit", "inject"):
                proc.send_signal(signal.Signals[end])
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.seek(0)
            out.stderr = err.read().decode(errors="replace")
            err.close()
        out.returncode = proc.returncode
        out.seconds = time.monotonic() - t0
        for f in Path(where).iterdir():
            if f.is_file() and "_" in f.name and not f.name.endswith(".tmp"):
                attempt_pids = [int(p) for p in f.read_text().split()]
                out.pids.setdefault(int(f.name.split("_")[1]), []).append(attempt_pids)
        # what is left of the job: its sleeps, and (tagged runs) its workers and sidecar
        settle = time.monotonic() + 5.0
        while True:
            left = sleepers(tok)
            if env_tag is not None:
                left += marked(*env_tag)
            if not left or time.monotonic() > settle:
                break
            time.sleep(0.05)
        out.leftovers = sorted(set(left))
        for pid in out.leftovers:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                out.details.append(f"{pid} ppid {p.ppid()} {p.status()} {' '.join(p.cmdline())}")
        for pid in out.leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return out


def growth(samples: list[Sample], skip: int = 5) -> dict[str, tuple[int, int, int]]:
    """(value after ``skip`` warm-up attempts, last value, max) of each figure."""
    after = samples[min(skip, len(samples) - 1)]
    tail = samples[skip:] or samples
    out = {}
    for name in ("fds", "threads", "zombies", "rss"):
        out[name] = (
            getattr(after, name),
            getattr(samples[-1], name),
            max(getattr(s, name) for s in tail),
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--restarts", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak.md"))
    a = ap.parse_args()
    result = run(a.restarts, timeout=3600.0)
    g = growth(result.samples)
    mib = 1 << 20
    checkpoints = [s for s in result.samples if s.attempt in (10, 100, 250, 500, 750, a.restarts)]
    lines = [
        f"# Soak: {a.restarts} restarts of a leaking, crash-looping job",
        "",
        f"Command: `python bench/bench_soak.py --restarts {a.restarts}`",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), Python "
        f"{platform.python_version()}, Linux {platform.release()}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        f"Job: {NPROC} workers, each starting a helper, a double-forked daemon and an "
        "`env={}` double-forked daemon, then exiting 1; "
        f"`--max-restarts {a.restarts}`.  Exit status {result.returncode} (1: restarts "
        f"exhausted), {result.seconds:.0f} s in all "
        f"({result.seconds / max(len(result.samples), 1) * 1000:.0f} ms per attempt).",
        f"Attempts sampled: {len(result.samples)}.  Processes of the job left afterwards: "
        f"{len(result.leftovers)}{': ' + '; '.join(result.details) if result.details else ''}.",
        "",
        "| agent figure | after 5 attempts | last attempt | max after 5 |",
        "|---|---:|---:|---:|",
        f"| open fds | {g['fds'][0]} | {g['fds'][1]} | {g['fds'][2]} |",
        f"| threads | {g['threads'][0]} | {g['threads'][1]} | {g['threads'][2]} |",
        f"| zombie children | {g['zombies'][0]} | {g['zombies'][1]} | {g['zombies'][2]} |",
        f"| RSS (MiB) | {g['rss'][0] / mib:.1f} | {g['rss'][1] / mib:.1f} | "
        f"{g['rss'][2] / mib:.1f} |",
        "",
        "| attempt | fds | threads | zombies | RSS (MiB) |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {s.attempt} | {s.fds} | {s.threads} | {s.zombies} | {s.rss / mib:.1f} |"
            for s in checkpoints
        ),
        "",
        "Samples are taken from outside (psutil) when both workers of an attempt have "
        "written their pids, so a zombie counted is a worker or daemon between its exit "
        "and the agent's reaping of it (microseconds to a millisecond).",
        "",
    ]
    Path(a.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
