"""The model worker: a real process that trains like a scenario's ``job:`` says.

``elastic real`` runs it under real agents (``elastic run -m elastic.real.model_worker
--config FILE --node N``) so that a scenario's cluster runs for real with the same job
the simulator models (:mod:`sim.workers`):

* start-up: ``startup_time``, then the worker registers in its world (the workers of
  one rendezvous round, named by ``MASTER_ADDR:MASTER_PORT/WORLD_SIZE``) and waits for
  all ``WORLD_SIZE`` members, as ``init_process_group`` does; after
  ``collective_timeout`` without them it aborts (SIGABRT, as NCCL's watchdog does);
* training: resumes from the last checkpoint on disk, one step per ``step_time`` times
  the slowest member node's slow-down factor, a checkpoint every ``checkpoint_every``
  steps that takes ``checkpoint_time`` (rank 0 writes it, atomically);
* a step is a collective: before each step the worker checks that every member is
  alive and not hung, and that no member's node has had its link cut since the world
  formed (``elastic real`` writes ``cuts/cut.NODE.INDEX`` holding the cut's scenario
  time when it cuts a node off: the collective's stand-in, these files, does not cross
  the network, so it is told); if one is not, it stops making progress (no more beats),
  and aborts ``collective_timeout`` later unless its agent stops it first;
* progress heartbeats (:func:`elastic.progress.beat`) after each step, and each step
  inside ``timer.expires(after=timer)`` when the job has a timer;
* faults, at their scenario times: ``worker_crash`` (exit with the code; a negative
  code is that signal), ``worker_hang`` (stops stepping, ignores SIGTERM), and
  ``slow_node`` (step time times the factor, for the nodes named).

Every duration is divided by ``time_scale``.  Times are ``time.monotonic()`` (one
clock for every process of the machine); scenario time is ``(t - t0) * time_scale``.

What the worker did is appended to the events file as JSON lines in the agents' event
schema (``model.ready``, ``model.crash``, ``model.hang``, ``model.stopped``,
``model.checkpoint``, ``model.done``, ``model.abort``); ``elastic real`` merges them with
the agents' logs.  The config is JSON (at most 1 MiB), checked field by field.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic.events import AgentEvent

__all__ = ["CONFIG_ENV", "NODE_ENV", "ModelConfig", "WorkerFault", "load_config", "main"]

CONFIG_ENV = "ELASTIC_MODEL_CONFIG"
NODE_ENV = "ELASTIC_MODEL_NODE"

MAX_CONFIG_BYTES = 1 << 20
# how often a waiting worker looks at its world's directory (wall seconds): a
# stand-in for a collective's network round trip, far below any scenario's step
POLL = 0.002


@dataclass(frozen=True, slots=True)
class WorkerFault:
    """A fault the worker applies itself, at scenario time ``at``."""

    at: float
    kind: str  # worker_crash | worker_hang | slow_node
    node: int
    local_rank: int | None = None
    exit_code: int = 1
    factor: float = 1.0
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    t0: float
    time_scale: float
    dir: str  # shared: checkpoint, world registrations
    events: str  # the JSON-lines file the worker appends to
    steps: int
    step_time: float
    startup_time: float = 0.0
    checkpoint_every: int = 0
    checkpoint_time: float = 0.0
    collective_timeout: float = 600.0
    timer: float | None = None
    heartbeat: bool = False
    faults: tuple[WorkerFault, ...] = ()


class ConfigProblem(ValueError):
    pass


def _num(d: dict[str, Any], key: str, default: float | None = None, positive: bool = False) -> Any:
    v = d.get(key, default)
    if v is None and default is None and key in d:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or (positive and v <= 0):
        raise ConfigProblem(f"{key}: got {v!r}; expected a number >= 0")
    return v


def load_config(path: str) -> ModelConfig:
    """Read and check the JSON config ``elastic real`` writes."""
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigProblem(f"over {MAX_CONFIG_BYTES} bytes")
    d = json.loads(raw)
    if not isinstance(d, dict):
        raise ConfigProblem("expected a JSON object")
    faults = []
    for i, fd in enumerate(d.get("faults", [])):
        if not isinstance(fd, dict) or fd.get("kind") not in (
            "worker_crash",
            "worker_hang",
            "slow_node",
        ):
            raise ConfigProblem(f"faults[{i}]: got {fd!r}; expected a worker fault")
        dur = fd.get("duration")
        faults.append(
            WorkerFault(
                at=float(_num(fd, "at")),
                kind=str(fd["kind"]),
                node=int(_num(fd, "node")),
                local_rank=None if fd.get("local_rank") is None else int(fd["local_rank"]),
                exit_code=int(fd.get("exit_code", 1)),
                factor=float(_num(fd, "factor", 1.0)),
                duration=None if dur is None else float(dur),
            )
        )
    timer = d.get("timer")
    steps = d.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigProblem(f"steps: got {steps!r}; expected an integer >= 1")
    every = d.get("checkpoint_every", 0)
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ConfigProblem(f"checkpoint_every: got {every!r}; expected an integer >= 0")
    return ModelConfig(
        t0=float(_num(d, "t0")),
        time_scale=float(_num(d, "time_scale", 1.0, positive=True)),
        dir=str(d["dir"]),
        events=str(d["events"]),
        steps=steps,
        step_time=float(_num(d, "step_time", positive=True)),
        startup_time=float(_num(d, "startup_time", 0.0)),
        checkpoint_every=every,
        checkpoint_time=float(_num(d, "checkpoint_time", 0.0)),
        collective_timeout=float(_num(d, "collective_timeout", 600.0, positive=True)),
        timer=None if timer is None else float(_num(d, "timer", positive=True)),
        heartbeat=bool(d.get("heartbeat", False)),
        faults=tuple(sorted(faults, key=lambda f: f.at)),
    )


class Exit(Exception):
    """Leave the training loop with this exit code (negative: that signal)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class ModelWorker:
    def __init__(self, cfg: ModelConfig, node: int, env: dict[str, str]) -> None:
        self.cfg = cfg
        self.node = node
        self.rank = int(env.get("RANK", "0"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        key = f"{env.get('MASTER_ADDR', 'local')}_{env.get('MASTER_PORT', '0')}_{self.world_size}"
        self.world_key = key
        self.world_dir = Path(cfg.dir) / "worlds" / key
        self.started = self.now()
        # faults aimed at this worker that are still ahead (a worker started after a
        # fault's time does not replay it: the worker running at that time took it)
        self.pending = [
            f
            for f in cfg.faults
            if f.kind != "slow_node"
            and f.node == node
            and f.local_rank in (None, self.local_rank)
            and f.at >= self.started
        ]
        self.slow = [f for f in cfg.faults if f.kind == "slow_node"]
        self.member_nodes: set[int] = {node}
        self.peers: dict[int, int] = {}
        self.hung = False
        self.formed = 0.0  # scenario time the world gathered
        self.cuts_dir = Path(cfg.dir) / "cuts"
        self._cuts: dict[str, float] = {}  # marker name -> the cut's scenario time

    # -- time ----------------------------------------------------------------------------
    def now(self) -> float:
        """Scenario time."""
        return (time.monotonic() - self.cfg.t0) * self.cfg.time_scale

    def wall(self, scenario_t: float) -> float:
        return self.cfg.t0 + scenario_t / self.cfg.time_scale

    # -- the log -------------------------------------------------------------------------
    def emit(self, kind: str, **fields: Any) -> None:
        ev = AgentEvent(
            t=time.monotonic(),
            node=self.node,
            kind=kind,
            rank=self.rank,
            fields={"pid": os.getpid(), "world": self.world_key, **fields},
        )
        line = (ev.to_json() + "\n").encode()
        fd = os.open(self.cfg.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)  # one write with O_APPEND: lines of workers never mix
        finally:
            os.close(fd)

    # -- faults --------------------------------------------------------------------------
    def _due(self) -> None:
        while self.pending and self.pending[0].at <= self.now():
            f = self.pending.pop(0)
            if f.kind == "worker_crash":
                self.emit("model.crash", exit_code=f.exit_code, at=f.at)
                raise Exit(f.exit_code)
            if f.kind == "worker_hang":
                self.hang(f.at)

    def hang(self, at: float) -> None:
        """Stop making progress for good, and ignore SIGTERM, as a stuck collective does."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.hung = True
        (self.world_dir / f"hung.{self.rank}").touch()
        self.emit("model.hang", at=at)
        while True:
            time.sleep(3600)

    def sleep_until(self, wall_deadline: float) -> None:
        """Sleep until ``wall_deadline`` (monotonic), applying this worker's faults on time."""
        while True:
            self._due()
            now = time.monotonic()
            if now >= wall_deadline:
                return
            nxt = self.wall(self.pending[0].at) if self.pending else wall_deadline
            time.sleep(max(0.0, min(wall_deadline, nxt) - now))

    def factor(self, t: float) -> float:
        """The world's slow-down at scenario time ``t``: its slowest member node's."""
        worst = 1.0
        for f in self.slow:
            if (
                f.node in self.member_nodes
                and f.at <= t
                and (f.duration is None or t < f.at + f.duration)
            ):
                worst = max(worst, f.factor)
        return worst

    # -- the collective ------------------------------------------------------------------
    def register(self) -> None:
        self.world_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.world_dir / f".rank.{self.rank}.{os.getpid()}"
        tmp.write_text(json.dumps({"pid": os.getpid(), "node": self.node}))
        os.replace(tmp, self.world_dir / f"rank.{self.rank}")
        self.emit("model.ready", world_size=self.world_size)

    def gather(self) -> None:
        """Wait for every member (init_process_group); abort after the collective timeout."""
        deadline = time.monotonic() + self.cfg.collective_timeout / self.cfg.time_scale
        while True:
            members = {}
            for p in self.world_dir.glob("rank.*"):
                with contextlib.suppress(OSError, ValueError):
                    members[int(p.name.split(".")[1])] = json.loads(p.read_text())
            if len(members) >= self.world_size:
                self.peers = {r: int(m["pid"]) for r, m in members.items() if r != self.rank}
                self.member_nodes = {int(m["node"]) for m in members.values()}
                self.formed = self.now()
                return
            if time.monotonic() >= deadline:
                self.abort("collective_init_timeout")
            self.sleep_until(time.monotonic() + POLL)

    def _peers_ok(self) -> bool:
        for r, pid in self.peers.items():
            if (self.world_dir / f"hung.{r}").exists() or not _alive(pid):
                return False
        return not self._cut_off()

    def _cut_off(self) -> bool:
        """Whether a member node's link was cut since the world formed."""
        try:
            names = os.listdir(self.cuts_dir)
        except OSError:
            return False  # no cut yet
        for name in names:
            parts = name.split(".")
            if len(parts) != 3 or parts[0] != "cut" or not parts[1].isdigit():
                continue
            if int(parts[1]) not in self.member_nodes:
                continue
            if name not in self._cuts:
                try:
                    self._cuts[name] = float(json.loads((self.cuts_dir / name).read_text())["at"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
            if self._cuts[name] >= self.formed:
                return True
        return False

    def collective(self) -> None:
        """A step's all-reduce: returns when all peers are there; blocks forever if not."""
        if self._peers_ok():
            return
        deadline = time.monotonic() + self.cfg.collective_timeout / self.cfg.time_scale
        while time.monotonic() < deadline:
            self.sleep_until(min(deadline, time.monotonic() + 0.05))
        self.abort("collective_timeout")

    def abort(self, why: str) -> None:
        self.emit("model.abort", reason=why)
        raise Exit(-signal.SIGABRT)

    # -- checkpoints ---------------------------------------------------------------------
    def ckpt_path(self) -> Path:
        return Path(self.cfg.dir) / "checkpoint.json"

    def read_ckpt(self) -> int:
        try:
            with open(self.ckpt_path(), "rb") as f:
                d = json.loads(f.read(4096))
            return int(d["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def write_ckpt(self, step: int) -> None:
        if self.rank != 0:
            return
        tmp = self.ckpt_path().with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"step": step}))
        os.replace(tmp, self.ckpt_path())
        self.emit("model.checkpoint", step=step)

    # -- the run -------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        k = cfg.time_scale
        # start-up counts from the process's start, as a job's does: the interpreter's
        # own start-up is part of it, not added to it
        self.sleep_until(process_start() + cfg.startup_time / k)
        self.register()
        self.gather()
        step = self.read_ckpt()
        beat = _beat if cfg.heartbeat else None
        mark = time.monotonic()
        while step < cfg.steps:
            with self._timer():
                self.collective()
                mark += cfg.step_time * self.factor(self.now()) / k
                self.sleep_until(mark)
            step += 1
            if beat is not None:
                beat()
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
                with self._timer():  # a checkpoint that hangs is reaped too
                    mark += cfg.checkpoint_time / k
                    self.sleep_until(mark)
                    self.write_ckpt(step)
        self.write_ckpt(cfg.steps)
        self.emit("model.done", step=step)
        return 0

    @contextlib.contextmanager
    def _timer(self) -> Iterator[None]:
        if self.cfg.timer is None:
            yield
            return
        from elastic import timer

        with timer.expires(after=self.cfg.timer / self.cfg.time_scale):
            yield


def process_start() -> float:
    """When this process started, on ``time.monotonic()``'s clock.

    The kernel keeps it in clock ticks since boot (``/proc/self/stat`` field 22, at
    ``CLOCK_BOOTTIME``); the middle of that tick is returned, so the error is at most
    half a tick (5 ms at 100 Hz).  Falls back to now if ``/proc`` cannot be read.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    boot_now = time.clock_gettime(time.CLOCK_BOOTTIME)
    mono_now = time.monotonic()
    return mono_now - (boot_now - (ticks + 0.5) / hz)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")  # a zombie has died; its parent has not reaped it yet


def _beat() -> None:
    import elastic.progress

    elastic.progress.beat()


def _exit_with(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(5)  # the signal ends the process; this is never reached
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m elastic.real.model_worker",
        description="A training job's model, for real (run by `elastic real`).",
    )
    # defaults from the environment: `elastic run`'s own flags would take these
    # options for abbreviations of theirs (``--node`` for ``--node-rank``)
    p.add_argument(
        "--config",
        default=os.environ.get(CONFIG_ENV),
        help=f"the JSON config elastic real wrote (default: ${CONFIG_ENV})",
    )
    p.add_argument(
        "--node",
        type=int,
        default=os.environ.get(NODE_ENV),
        help=f"the scenario's node index (default: ${NODE_ENV})",
    )
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.config is None or args.node is None:
        print(
            f"model_worker: expected --config and --node (or ${CONFIG_ENV}, ${NODE_ENV})",
            file=sys.stderr,
        )
        return 2
    try:
        cfg = load_config(args.config)
    except OSError as e:
        print(
            f"model_worker: --config {args.config}: cannot read it: {e.strerror}", file=sys.stderr
        )
        return 2
    except (ValueError, KeyError, TypeError) as e:
        print(f"model_worker: --config {args.config}: {e}", file=sys.stderr)
        return 2
    if cfg.timer is not None:
        from elastic import timer

        path = os.environ.get("TORCHELASTIC_TIMER_FILE")
        if not path:
            print(
                "model_worker: job timer set but TORCHELASTIC_TIMER_FILE is not; "
                "expected TORCHELASTIC_ENABLE_FILE_TIMER=1 in the agent's environment",
                file=sys.stderr,
            )
            return 2
        timer.configure(timer.FileTimerClient(path))
    w = ModelWorker(cfg, args.node, dict(os.environ))

    def on_term(signum: int, _frame: object) -> None:
        w.emit("model.stopped", signal=signum)
        _exit_with(-signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        code = w.run()
    except Exit as e:
        code = e.code
    _exit_with(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
