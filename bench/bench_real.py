"""Real-mode benchmarks of ``elastic run`` against torchrun, A/B interleaved on one machine.

    python bench/bench_real.py [--runs 5] [--out bench/results/real.md]

Each measurement runs ``elastic run`` (``python -m elastic.cli run``) and torchrun
(``python -m torch.distributed.run``) alternately, ``--runs`` times each, and reports
medians and the ratio elastic/torchrun:

1. crash → restarted worker running (1 node, 2 workers, ``--standalone``): from the
   moment rank 1 exits 1 (it writes ``time.time()`` just before) to the first line of
   the restarted rank 1.  The floor is the same interpreter starting the same script
   (``Popen`` → first line), measured in the same interleaved rounds.
2. launch → exit of a no-op job with 1, 2 and 4 workers (wall time of the command);
   the note gives the same number of worker interpreters started together by ``Popen``
   alone, which any launcher pays on this machine, and a bare Python launcher (an
   interpreter that ``posix_spawn``s the workers and waits: no agent, no rendezvous, no
   logs), the least any launcher written in Python pays.
3. agent RSS while the workers sleep (elastic: agent + its reaper sidecar).
4. agent CPU time (user + system) over 10 s while the workers sleep.
5. SIGTERM to the agent → every process gone, with workers (and a grandchild each)
   that ignore SIGTERM and ``--shutdown-timeout 2``.

A script, not a test: numbers depend on the machine and its load.  ``elastic`` is
byte-compiled first (``compileall``) as an installed package would be.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = {
    "elastic": [PY, "-m", "elastic.cli", "run"],
    "torchrun": [PY, "-m", "torch.distributed.run"],
}

CRASH = """
import os, sys, time
t = time.time()
out, rank = os.environ["OUT_DIR"], os.environ["RANK"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if attempt == "0":
    if rank == "1":
        with open(os.path.join(out, "crash"), "w") as f:
            f.write(repr(time.time()))
        sys.exit(1)
    time.sleep(60)
elif rank == "1":
    with open(os.path.join(out, "restart"), "w") as f:
        f.write(repr(t))
"""

FLOOR = """
import os, sys, time
t = time.time()
with open(sys.argv[1], "w") as f:
    f.write(repr(t))
"""

SLEEP = """
import os, time
open(os.path.join(os.environ["OUT_DIR"], "up." + os.environ["RANK"]), "w").close()
time.sleep(float(os.environ["SLEEP_FOR"]))
"""

STUBBORN = """
import json, os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\ntime.sleep(300)\\n"
child = subprocess.Popen([sys.executable, "-c", code])
path = os.path.join(os.environ["OUT_DIR"], "pids." + os.environ["RANK"])
with open(path + ".tmp", "w") as f:
    json.dump([os.getpid(), child.pid], f)
os.rename(path + ".tmp", path)
time.sleep(300)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(extra)
    return env


def _write(d: Path, name: str, code: str) -> str:
    p = d / name
    p.write_text(textwrap.dedent(code))
    return str(p)


def _wait_for(paths: list[Path], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and (p.stat().st_size > 0 or p.name.startswith("up.")) for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{paths} did not appear")
        time.sleep(0.005)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def crash_restart(system: str, d: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=d))
    train = _write(out, "crash.py", CRASH)
    subprocess.run(
        [*SYSTEMS[system], "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", train],
        env=_env(OUT_DIR=str(out)),
        capture_output=True,
        check=True,
        timeout=120,
    )
    return float((out / "restart").read_text()) - float((out / "crash").read_text())


def floor(d: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=d))
    script = _write(out, "floor.py", FLOOR)
    t0 = time.time()
    subprocess.run([PY, script, str(out / "t")], check=True)
    return float((out / "t").read_text()) - t0


def launch(system: str, d: Path, n: int) -> float:
    out = Path(tempfile.mkdtemp(dir=d))
    train = _write(out, "noop.py", "")
    t0 = time.monotonic()
    subprocess.run(
        [*SYSTEMS[system], "--standalone", "--nproc-per-node", str(n), train],
        env=_env(),
        capture_output=True,
        check=True,
        timeout=120,
    )
    return time.monotonic() - t0


def workers_alone(d: Path, n: int) -> float:
    """Wall time of ``n`` no-op workers started together by plain ``Popen``: the part of
    a launch that any launcher pays on this machine.

    Timed like :func:`launch`: output captured, so the end is seen at the pipes' EOF (a
    ``wait`` with a timeout would poll with growing sleeps and add up to tens of ms)."""
    out = Path(tempfile.mkdtemp(dir=d))
    train = _write(out, "noop.py", "")
    t0 = time.monotonic()
    procs = [
        subprocess.Popen([PY, "-u", train], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(n)
    ]
    for p in procs:
        p.communicate(timeout=60)
    return time.monotonic() - t0


BARE = """
import os, sys
pids = [os.posix_spawn(sys.executable, [sys.executable, "-u", sys.argv[2]], os.environ)
        for _ in range(int(sys.argv[1]))]
sys.exit(max(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids))
"""


def bare_launcher(d: Path, n: int) -> float:
    """Wall time of a bare Python launcher (interpreter start, ``n`` spawns, waits)."""
    out = Path(tempfile.mkdtemp(dir=d))
    train = _write(out, "noop.py", "")
    t0 = time.monotonic()
    subprocess.run(
        [PY, "-c", BARE, str(n), train], env=_env(), capture_output=True, check=True, timeout=120
    )
    return time.monotonic() - t0


def _agent_procs(agent: psutil.Process) -> list[psutil.Process]:
    """The agent, plus (for elastic) its reaper sidecar: a child that is not a worker."""
    procs = [agent]
    for c in agent.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "reaper.py" in " ".join(c.cmdline()):
                procs.append(c)
    return procs


def idle(system: str, d: Path, seconds: float) -> tuple[float, float]:
    """(agent RSS in MiB while workers sleep, agent CPU seconds over ``seconds``)."""
    out = Path(tempfile.mkdtemp(dir=d))
    train = _write(out, "sleep.py", SLEEP)
    p = subprocess.Popen(
        [*SYSTEMS[system], "--standalone", "--nproc-per-node", "2", train],
        env=_env(OUT_DIR=str(out), SLEEP_FOR=str(seconds + 30)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for([out / "up.0", out / "up.1"])
        time.sleep(1.0)  # let start-up work settle
        procs = _agent_procs(psutil.Process(p.pid))
        rss = sum(q.memory_info().rss for q in procs) / 2**20
        c0 = sum(sum(q.cpu_times()[:2]) for q in procs)
        time.sleep(seconds)
        c1 = sum(sum(q.cpu_times()[:2]) for q in procs)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    return rss, c1 - c0


def sigterm(system: str, d: Path, grace: int = 2) -> float:
    out = Path(tempfile.mkdtemp(dir=d))
    train = _write(out, "stubborn.py", STUBBORN)
    p = subprocess.Popen(
        [
            *SYSTEMS[system],
            "--standalone",
            "--nproc-per-node",
            "2",
            "--shutdown-timeout",
            str(grace),
            train,
        ],
        env=_env(OUT_DIR=str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    files = [out / "pids.0", out / "pids.1"]
    _wait_for(files)
    pids = {pid for f in files for pid in json.loads(f.read_text())}
    pids |= {c.pid for c in psutil.Process(p.pid).children(recursive=True)}
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.wait(60)
    while any(_alive(q) for q in pids):
        if time.monotonic() - t0 > 60:
            break
        time.sleep(0.002)
    took = time.monotonic() - t0
    for q in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(q, signal.SIGKILL)
    return took


def ab(
    runs: int, fn: Callable[[str], float], beside: Callable[[], float] | None = None
) -> dict[str, list[float]]:
    """Interleaved runs: elastic, torchrun, elastic, torchrun, …

    ``beside``: a reference measured in the same rounds (under ``"beside"``), so that a
    comparison with it sees the same load as the systems did.
    """
    res: dict[str, list[float]] = {s: [] for s in [*SYSTEMS, "beside"]}
    for i in range(runs):
        for s in SYSTEMS:
            res[s].append(fn(s))
            print(f"  {s} run {i + 1}: {res[s][-1]:.4f}", file=sys.stderr, flush=True)
        if beside is not None:
            res["beside"].append(beside())
    return res


def _start_path() -> str:
    try:
        import elastic.real._spawn  # noqa: F401
    except ImportError:
        return "the Python exec shim (the C extension elastic.real._spawn is not built)"
    return "C (elastic.real._spawn: vfork → PR_SET_PDEATHSIG → exec)"


SECTIONS = ("crash", "launch", "idle", "sigterm")


def _spread(xs: list[float], scale: float = 1.0, fmt: str = ".3f") -> str:
    return f"{min(xs) * scale:{fmt}} to {max(xs) * scale:{fmt}}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument(
        "--out",
        default=None,
        help="where to write the table (default: bench/results/real.md; with --only, "
        "nowhere: a partial table does not replace the full one)",
    )
    ap.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="run only these measurements (repeatable)",
    )
    a = ap.parse_args()
    only = set(a.only or SECTIONS)
    if a.out is None and not a.only:
        a.out = str(ROOT / "bench" / "results" / "real.md")
    compileall.compile_dir(str(ROOT / "elastic"), quiet=1)
    rows: list[tuple[str, float, float, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        med = statistics.median

        if "crash" in only:
            print("crash -> restarted worker", file=sys.stderr)
            # the floor in the same rounds: a noisy spell of this shared machine then
            # raises both, not only the restarts
            r = ab(a.runs, lambda s: crash_restart(s, d), beside=lambda: floor(d))
            fl = med(r["beside"])
            e, t = med(r["elastic"]) * 1000, med(r["torchrun"]) * 1000
            rows.append(
                (
                    "crash → restarted worker running (ms)",
                    e,
                    t,
                    "≤ 1/4",
                    f"floor {fl * 1000:.0f} ms; target floor + 20 ms; runs: elastic "
                    f"{_spread(r['elastic'], 1000, '.0f')}, torchrun "
                    f"{_spread(r['torchrun'], 1000, '.0f')} ms",
                )
            )
        for n in (1, 2, 4) if "launch" in only else ():
            print(f"launch -> exit, {n} workers", file=sys.stderr)
            r = ab(a.runs, lambda s, n=n: launch(s, d, n))
            alone = med(workers_alone(d, n) for _ in range(a.runs))
            bare = med(bare_launcher(d, n) for _ in range(a.runs))
            t = med(r["torchrun"])
            rows.append(
                (
                    f"no-op job launch → exit, {n} worker(s) (s)",
                    med(r["elastic"]),
                    t,
                    "≤ 1/10",
                    f"{n} worker interpreter(s) alone: {alone:.3f} s; bare Python "
                    f"launcher: {bare:.3f} s = {bare / t:.3f} of torchrun's; runs: elastic "
                    f"{_spread(r['elastic'])}, torchrun {_spread(r['torchrun'], fmt='.2f')} s",
                )
            )
        if "idle" in only:
            print("idle agent: RSS and CPU", file=sys.stderr)
            idle_runs: dict[str, list[tuple[float, float]]] = {s: [] for s in SYSTEMS}
            for i in range(max(1, a.runs // 2)):
                for s in SYSTEMS:
                    idle_runs[s].append(idle(s, d, a.idle_seconds))
                    print(f"  {s} run {i + 1}: {idle_runs[s][-1]}", file=sys.stderr, flush=True)
            rows.append(
                (
                    "agent RSS while workers sleep (MiB)",
                    med(x[0] for x in idle_runs["elastic"]),
                    med(x[0] for x in idle_runs["torchrun"]),
                    "≤ 1/3",
                    "elastic: agent + reaper sidecar",
                )
            )
            rows.append(
                (
                    f"agent CPU over {a.idle_seconds:g} s idle (ms)",
                    med(x[1] for x in idle_runs["elastic"]) * 1000,
                    med(x[1] for x in idle_runs["torchrun"]) * 1000,
                    "≤ 1/5",
                    "",
                )
            )
        if "sigterm" in only:
            print("SIGTERM -> all gone", file=sys.stderr)
            r = ab(a.runs, lambda s: sigterm(s, d))
            rows.append(
                (
                    "SIGTERM → all gone, workers ignore SIGTERM, --shutdown-timeout 2 (s)",
                    med(r["elastic"]),
                    med(r["torchrun"]),
                    "≤ 2.2 s",
                    "",
                )
            )

    cpu = platform.processor() or platform.machine()
    lines = [
        "# Real-mode benchmarks: `elastic run` vs torchrun (torch 2.13.0 CPU)",
        "",
        f"Command: `python bench/bench_real.py --runs {a.runs} --idle-seconds {a.idle_seconds:g}"
        + "".join(f" --only {x}" for x in a.only or ())
        + "`",
        f"Machine: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        f"Runs: {a.runs} per system, A/B interleaved (idle: {max(1, a.runs // 2)}); medians.",
        f"Worker start path: {_start_path()}.",
        "",
        "| measurement | elastic | torchrun | elastic/torchrun | target | note |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, e, t, target, note in rows:
        ratio = e / t if t else float("nan")
        lines.append(f"| {name} | {e:.3g} | {t:.3g} | {ratio:.3f} | {target} | {note} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out is not None:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
