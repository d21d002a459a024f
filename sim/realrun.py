"""``elastic real SCENARIO.yaml``: run a scenario's cluster for real on this machine.

Theory of operation
-------------------
Every node of the scenario is a real ``elastic run`` agent process on loopback (in a
network namespace of its own when the scenario cuts links, see below); its workers run
the model worker (:mod:`elastic.real.model_worker`), which trains as the scenario's
``job:`` says.  The agents meet through the c10d network store, hosted in a
process of its own (:mod:`elastic.real.netstore_host`, every agent a client through
``is_host=false``): as in the simulator, the store host is a machine of its own, so a
``store_outage`` (SIGSTOP … SIGCONT of that process) stops no agent, and a crash of
node 0 does not take the store with it.

Every duration is divided by ``--time-scale K``; the merged log is in scenario time
(``(t - t0) * K``).  Faults are injected for real at their scaled times:

==================  ===========================================================
worker_crash        the model worker exits with the code (it reads its faults from
                    its config; a worker started after the fault's time skips it)
worker_hang         the model worker stops stepping and ignores SIGTERM
slow_node           the model worker's step time times the factor
node_crash          SIGKILL of the agent and its process tree; ``restart_after``
                    starts a new agent for the node
node_join           new agents (the next node indices)
node_leave          SIGTERM to the agent (it stops its workers, revokes its lease)
preemption          SIGTERM to the agent ``notice`` after the fault's time
store_outage        SIGSTOP of the store host, SIGCONT ``duration`` later (announced
                    first with SIGUSR1: the host extends every lease by the outage,
                    which expires nobody's lease, as in the simulator and etcd)
network_partition   the nodes' links are cut for ``duration`` (see below)
==================  ===========================================================

Each row is one entry of :data:`HANDLERS`, keyed by the same kinds as the simulator's
table (:data:`sim.inject.HANDLERS`); a kind real mode cannot inject is named in
:data:`REFUSED` with the reason, and refused before anything starts.  As in the
simulator, a fault aimed at a node that is down when it fires is a no-op logged once
(``applied: false``, ``why``): no second restart, no leave after a notice.

A scenario with a ``network_partition`` runs every node (its agent and workers) and the
store host in a network namespace of its own (:mod:`elastic.real.netns`: a switch the
runner holds, 198.18.0.0/24, nothing leaves the machine): a cut node's frames, both
ways, are held by the switch until the heal, as the simulator holds a cut node's
messages (``sim/store.py``), so its renewals stop reaching the store, which expires its
lease on its own clock, and at the heal its requests and wake-ups go through at once.
The model workers' collective (files in the run's directory) hears of the cut from a
marker the runner writes (``cuts/``): a world with a cut member breaks at the cut, as in
the simulator.  Namespaces need root, ``ip`` and ``/dev/net/tun``; without them such a
scenario is refused before anything starts, with the reason.  Other scenarios run on
loopback.  ``gpu_error`` is refused (a CPU machine has no GPU to fail); so is the
``static`` backend (its store lives in node 0's agent).

One log: the agents' logs (``--event-log``), the model workers' lines and the runner's
own (``sim.start``, ``sim.fault``, ``sim.node_restart``, ``sim.end``) are merged; the
collective's state, which the simulator logs as ``sim.world_running`` and
``sim.world_broken``, is derived from what the workers did: a world (the workers of one
round) runs when its last member is ready, and breaks at the first crash, hang, stop or
abort of a member or the crash of a member's node.  :func:`sim.report.build_report`
then reads it as it reads a simulated run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from elastic.errors import ConfigError
from elastic.events import AgentEvent, read_events
from elastic.real import netns
from sim.cliparse import OneLineParser, seed
from sim.inject import not_up
from sim.report import build_report
from sim.run import start_fields
from sim.scenario.expand import expand_faults, fault_rng
from sim.scenario.model import Fault, FaultKind, RendezvousBackendName, Scenario

__all__ = ["HANDLERS", "REFUSED", "RealResult", "main", "real_run", "refusal"]

WORKER_FAULTS = (FaultKind.WORKER_CRASH, FaultKind.WORKER_HANG, FaultKind.SLOW_NODE)
#: The simulator's fault kinds ``elastic real`` cannot inject, and why (see HANDLERS).
REFUSED = {
    FaultKind.GPU_ERROR: "this machine's workers run on CPU: there is no GPU to fail",
}
# An agent process that has paid its interpreter's start and its imports, then waits for
# one byte on stdin before it runs ``elastic run`` (EOF: the runner is gone, it leaves).
# The simulator starts a node's agent at once; a real one spends a few hundred ms
# importing first, and agents started one after the other would meet in a first round
# closed by the last call before the last of them arrived.  So every agent is started
# ahead of its time and let through its gate at it.
GATED_RUN = (
    "import sys, elastic.cli, elastic.run, elastic.launcher.api, elastic.real.netstore, "
    "elastic.real.rdzv_store, elastic.real.workers, elastic.rendezvous.dynamic, "
    "elastic.agent.server.local_elastic_agent\n"
    "if sys.stdin.buffer.read(1) != b'g': sys.exit(1)\n"
    "sys.argv = ['elastic', *sys.argv[1:]]\n"
    "elastic.cli.entry()\n"
)
# How long before its time an agent is started (wall seconds): its imports fit in it.
LEAD = 1.5
# Wall seconds an outage's announcement adds to every lease, beyond the outage itself
# (the announcement is handled before the stop; renewals resume after it).
OUTAGE_MARGIN = 0.05
# How often the runner looks at its agents between actions (wall seconds).  The runner
# is a test harness, not agent logic: what it measures comes from the logs' times.
TICK = 0.01


def refusal(sc: Scenario, faults: Sequence[Fault]) -> str | None:
    """Why this scenario cannot run for real here, or None."""
    if sc.rendezvous.backend is not RendezvousBackendName.C10D:
        return (
            f"rendezvous.backend: got {sc.rendezvous.backend.value!r}; elastic real runs "
            "'c10d' (its store in a process of its own)"
        )
    for f in faults:
        if f.kind not in HANDLERS:
            reason = REFUSED.get(f.kind, "elastic real cannot inject it; use the simulator")
            return f"fault {f.kind.value} at {f.at:g}s: {reason}"
    for f in faults:
        if f.kind is FaultKind.NETWORK_PARTITION:
            why = netns.available()
            if why is not None:
                return (
                    f"fault {f.kind.value} at {f.at:g}s: cutting a node's link needs network "
                    f"namespaces, and {why}; run this scenario in the simulator only"
                )
            break
    return None


def _host_count(sc: Scenario, faults: Sequence[Fault]) -> int:
    """Nodes the run can have: the first ones, the spares, and every joiner."""
    joins = sum(f.count or 1 for f in faults if f.kind is FaultKind.NODE_JOIN)
    return sc.cluster.nodes + sc.cluster.spare_nodes + joins


def _read_timeout(sc: Scenario, faults: Sequence[Fault], k: float) -> float | None:
    """The agents' store ``read_timeout`` (wall s) when the scenario cuts links: longer
    than the longest cut, as the simulator's requests wait for the link however long it
    is down (an agent gives up on a silent store after it; the default is 60 s)."""
    cuts = [f.duration or 0.0 for f in faults if f.kind is FaultKind.NETWORK_PARTITION]
    return max(60.0, max(cuts) / k + 60.0) if cuts else None


@dataclass(frozen=True, slots=True)
class RealResult:
    report: dict[str, Any]
    events: list[AgentEvent]
    faults: list[Fault]


@dataclass
class _Agent:
    node: int
    incarnation: int
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class _Run:
    sc: Scenario
    k: float
    dir: Path
    t0: float
    port: int
    config: Path
    store: subprocess.Popen[bytes]
    hosts: netns.Hosts | None = None
    store_addr: str = "127.0.0.1"
    read_timeout: float | None = None
    agents: list[_Agent] = field(default_factory=list)
    live: dict[int, _Agent] = field(default_factory=dict)
    alive: dict[int, bool] = field(default_factory=dict)  # the sim's SimNode.alive
    incarnations: dict[int, int] = field(default_factory=dict)
    cuts: dict[int, int] = field(default_factory=dict)  # node -> partitions cutting it now
    events: list[AgentEvent] = field(default_factory=list)
    actions: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    pending_starts: int = 0
    seq: int = 0
    joiners: dict[int, list[_Agent]] = field(default_factory=dict)  # fault index -> agents

    # -- time ----------------------------------------------------------------------------
    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.k

    def emit(
        self, kind: str, t: float | None = None, node: int | str = "sim", **fields: Any
    ) -> None:
        """Log the runner's event ``kind`` on ``node``, as ``SimCluster.emit`` does."""
        at = self.now() if t is None else t
        self.events.append(AgentEvent(t=at, node=node, kind=kind, fields=fields))

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` at scenario time ``t``."""
        self.seq += 1
        heapq.heappush(self.actions, (t, self.seq, fn))

    def later(self, after: float, fn: Callable[[], None]) -> None:
        self.at(self.now() + after, fn)

    # -- agents --------------------------------------------------------------------------
    def spawn_agent(self, node: int) -> _Agent:
        """Start an agent for ``node`` held at its gate (see :data:`GATED_RUN`)."""
        sc, k = self.sc, self.k
        inc = self.incarnations.get(node, 0) + 1
        self.incarnations[node] = inc
        r = sc.rendezvous
        conf = ",".join(
            f"{key}={value / k:.6g}"
            for key, value in (
                ("join_timeout", r.join_timeout),
                ("last_call_timeout", r.last_call_timeout),
                ("close_timeout", r.close_timeout),
                ("heartbeat_timeout", r.heartbeat_timeout),
            )
        )
        if self.read_timeout is not None:
            conf += f",read_timeout={self.read_timeout:.6g}"
        log = self.dir / f"agent.{node}.{inc}.jsonl"
        local = self.hosts.addr(node) if self.hosts is not None else "127.0.0.1"
        prefix = self.hosts.prefix(node) if self.hosts is not None else []
        flags = [
            "--nnodes", f"{r.min_nodes}:{r.max_nodes}",
            "--nproc-per-node", str(sc.cluster.nproc_per_node),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{self.store_addr}:{self.port}",
            "--rdzv-id", "real",
            "--rdzv-conf", f"is_host=false,{conf}",
            "--local-addr", local,
            "--max-restarts", str(sc.agent.max_restarts),
            "--monitor-interval", f"{sc.agent.monitor_interval / k:.6g}",
            "--shutdown-timeout", f"{sc.agent.shutdown_timeout / k:.6g}",
            "--event-log", str(log),
        ]  # fmt: skip
        if sc.job.hang_timeout is not None:
            flags += ["--hang-timeout", f"{sc.job.hang_timeout / k:.6g}"]
        env = {
            key: v for key, v in os.environ.items() if not key.startswith(("PET_", "TORCHELASTIC_"))
        }
        env["ELASTIC_MODEL_CONFIG"] = str(self.config)
        env["ELASTIC_MODEL_NODE"] = str(node)
        if sc.job.timer is not None:
            env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1"
        with open(self.dir / f"agent.{node}.{inc}.out", "wb") as out:
            proc = subprocess.Popen(
                [
                    *prefix,
                    sys.executable,
                    "-c",
                    GATED_RUN,
                    "run",
                    *flags,
                    "-m",
                    "elastic.real.model_worker",
                ],
                env=env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        a = _Agent(node, inc, proc, log)
        self.agents.append(a)
        return a

    def open_gate(self, a: _Agent) -> None:
        """Let a gated agent run: from now on it is the node's live agent."""
        assert a.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            a.proc.stdin.write(b"g")
            a.proc.stdin.close()
        self.live[a.node] = a
        self.alive[a.node] = True

    def start_agent(self, node: int) -> None:
        self.open_gate(self.spawn_agent(node))

    def running(self) -> bool:
        for node, a in list(self.live.items()):
            if a.proc.poll() is not None:
                del self.live[node]
        return bool(self.live)


def _die_with_parent() -> None:
    """In a child, before exec: SIGKILL when the runner dies (even by SIGKILL), so a
    killed ``elastic real`` leaves no agent or store host behind (each is in a session
    of its own, out of reach of a signal to the runner's process group)."""
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def _kill_tree(pid: int, wait: bool = True) -> None:
    procs = _tree(pid)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    if wait:
        # dead or a zombie: an orphaned worker's zombie waits for a reaper this process is
        # not (psutil.wait_procs waited out its whole timeout for each such tree: several
        # seconds of every interrupted run, over 30 s on a loaded machine)
        deadline = time.monotonic() + 5
        while procs and time.monotonic() < deadline:
            procs = [p for p in procs if not _dead(p)]
            if procs:
                time.sleep(0.02)


def _dead(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _model_config(sc: Scenario, faults: Sequence[Fault], k: float, d: Path, t0: float) -> Path:
    job = sc.job
    worker_faults = []
    for f in faults:
        if f.kind in WORKER_FAULTS and f.node is not None:
            worker_faults.append(
                {
                    "at": f.at,
                    "kind": f.kind.value,
                    "node": f.node,
                    "local_rank": f.local_rank,
                    "exit_code": f.exit_code if f.exit_code is not None else 1,
                    "factor": f.factor if f.factor is not None else 1.0,
                    "duration": f.duration,
                }
            )
    cfg = {
        "t0": t0,
        "time_scale": k,
        "dir": str(d),
        "events": str(d / "workers.jsonl"),
        "steps": job.steps,
        "step_time": job.step_time,
        "startup_time": job.startup_time,
        "checkpoint_every": job.checkpoint_every,
        "checkpoint_time": job.checkpoint_time,
        "collective_timeout": job.collective_timeout,
        "timer": job.timer,
        "heartbeat": job.hang_timeout is not None,
        "faults": worker_faults,
    }
    path = d / "model.json"
    path.write_text(json.dumps(cfg, sort_keys=True))
    return path


def _start_store(
    d: Path, prefix: Sequence[str] = (), host: str = "127.0.0.1"
) -> tuple[subprocess.Popen[bytes], int]:
    with open(d / "store.err", "wb") as err:
        proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "elastic.real.netstore_host",
                "--host",
                host,
                "--port",
                "0",
                "--outage-file",
                str(d / "outage"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("listening "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the store host did not start: {line!r}")
    return proc, int(line.rsplit(":", 1)[1])


RealHandler = Callable[[_Run, Fault, int, float, dict[str, Any]], bool]


def _apply(run: _Run, f: Fault, index: int) -> None:
    """Inject ``f`` (the ``index``-th fault of the run) and log it as a ``sim.fault`` event,
    as :func:`sim.inject.apply_fault` does in the simulator."""
    # the fault's time: what follows (signals, kills) takes wall time; a worker's own
    # fault is applied by the worker at its scheduled time, not when this loop wakes
    t = f.at if f.kind in WORKER_FAULTS else run.now()
    fields: dict[str, Any] = {"fault": f.kind.value, "index": index}
    if f.node is not None:
        fields["target"] = f.node
    if f.category is not None:
        fields["category"] = f.category  # from failures: (sim/failures.py), for the report
    fields["applied"] = HANDLERS[f.kind](run, f, index, t, fields)
    run.emit("sim.fault", t=t, **fields)


def _up(run: _Run, f: Fault, fields: dict[str, Any]) -> int | None:
    """The fault's node if it is up (the simulator's ``SimNode.alive``); else None, and
    why the fault is a no-op in ``fields``."""
    node = f.node
    assert node is not None  # the scenario's loader requires it for these kinds
    if run.alive.get(node):
        return node
    fields["why"] = not_up(node, exists=node in run.alive)
    return None


def _worker_fault(run: _Run, f: Fault, index: int, t: float, fields: dict[str, Any]) -> bool:
    # the model worker injects it itself (it read its faults from its config); here it is
    # only logged, applied if a worker of the node can be there to do it
    if f.kind is not FaultKind.SLOW_NODE:
        fields["local_rank"] = lr = f.local_rank or 0
        if (node := _up(run, f, fields)) is None:
            return False
        if node not in run.live:
            fields["why"] = f"node {node} runs no worker {lr}"
            return False
    return True  # slow_node: the machine's, down or not, as in the simulator


def _node_crash(run: _Run, f: Fault, index: int, t: float, fields: dict[str, Any]) -> bool:
    if (node := _up(run, f, fields)) is None:
        return False  # its pending restart, if any, stays the only one
    a = run.live.get(node)
    if a is not None:
        _kill_tree(a.proc.pid, wait=False)  # reaped by running() and at the end
    run.alive[node] = False
    if f.restart_after is not None:
        run.pending_starts += 1
        gated = run.spawn_agent(node)  # held at its gate until the restart

        def restart() -> None:
            run.pending_starts -= 1
            if not run.alive.get(node):
                run.emit("sim.node_restart", node=node)
                run.open_gate(gated)
            else:
                _kill_tree(gated.proc.pid, wait=False)

        run.later(f.restart_after, restart)
    return True


def _node_join(run: _Run, f: Fault, index: int, t: float, fields: dict[str, Any]) -> bool:
    joining = run.joiners.pop(index)  # started LEAD ahead, at their gates
    fields["nodes"] = [a.node for a in joining]
    for a in joining:
        run.open_gate(a)
    return True


def _leave(run: _Run, node: int) -> None:
    """A graceful leave of ``node``, as ``SimNode.leave``: SIGTERM to its agent (which
    stops its workers and revokes its lease); nothing if the node is down by then."""
    if not run.alive.get(node):
        return
    run.alive[node] = False
    a = run.live.get(node)
    if a is not None and a.proc.poll() is None:
        a.proc.send_signal(signal.SIGTERM)


def _node_leave(run: _Run, f: Fault, index: int, t: float, fields: dict[str, Any]) -> bool:
    if (node := _up(run, f, fields)) is None:
        return False
    _leave(run, node)
    return True


def _preemption(run: _Run, f: Fault, index: int, t: float, fields: dict[str, Any]) -> bool:
    # a down node gets no notice: else its leave would land on the node's next incarnation
    if (node := _up(run, f, fields)) is None:
        return False
    run.later(f.notice or 0.0, functools.partial(_leave, run, node))
    return True


def _store_outage(run: _Run, f: Fault, index: int, t: float, fields: dict[str, Any]) -> bool:
    # announce it (leases are extended by its length, see netstore_host), then stop
    (run.dir / "outage").write_text(f"{(f.duration or 0.0) / run.k + OUTAGE_MARGIN}")
    run.store.send_signal(signal.SIGUSR1)
    time.sleep(OUTAGE_MARGIN / 2)  # the host handles the announcement first
    run.store.send_signal(signal.SIGSTOP)
    run.later(f.duration or 0.0, lambda: run.store.send_signal(signal.SIGCONT))
    return True


def _network_partition(run: _Run, f: Fault, index: int, t: float, fields: dict[str, Any]) -> bool:
    hosts = run.hosts
    assert hosts is not None  # refused without namespaces; made when a cut is ahead
    # the nodes that exist, as the simulator's: a node not yet started has no link; a
    # node down now is cut too (its namespace is), so an agent booted on it starts cut off
    targets = sorted(n for n in (f.nodes or ()) if n in run.incarnations)
    fields["nodes"] = targets
    cuts = run.dir / "cuts"
    cuts.mkdir(exist_ok=True)
    for n in targets:
        run.cuts[n] = run.cuts.get(n, 0) + 1  # overlapping cuts heal at the last heal
        hosts.cut(n)
        # the model workers' collective learns of it here (see the module docstring)
        tmp = cuts / f".cut.{n}.{index}"
        tmp.write_text(json.dumps({"at": t}))
        os.replace(tmp, cuts / f"cut.{n}.{index}")

    def heal() -> None:
        for n in targets:
            run.cuts[n] -= 1
            if run.cuts[n] == 0:
                hosts.heal(n)

    run.later(f.duration or 0.0, heal)
    return True


#: How ``elastic real`` injects each fault kind, keyed as the simulator's table
#: (:data:`sim.inject.HANDLERS`); a kind it cannot inject is in :data:`REFUSED` instead,
#: with the reason :func:`refusal` gives (tests/test_real_dispatch.py checks that every
#: simulated kind is in exactly one of the two).
HANDLERS: dict[FaultKind, RealHandler] = {
    FaultKind.WORKER_CRASH: _worker_fault,
    FaultKind.WORKER_HANG: _worker_fault,
    FaultKind.SLOW_NODE: _worker_fault,
    FaultKind.NODE_CRASH: _node_crash,
    FaultKind.NODE_JOIN: _node_join,
    FaultKind.NODE_LEAVE: _node_leave,
    FaultKind.PREEMPTION: _preemption,
    FaultKind.STORE_OUTAGE: _store_outage,
    FaultKind.NETWORK_PARTITION: _network_partition,
}


def _prespawn(run: _Run, index: int, nodes: list[int]) -> None:
    run.joiners[index] = [run.spawn_agent(n) for n in nodes]


def _merge(run: _Run, end_kind: dict[str, Any]) -> list[AgentEvent]:
    """One log in scenario time: the runner's, the agents' and the workers' events, and the
    collective's states derived from the workers' (see the module's docstring)."""
    k, t0 = run.k, run.t0
    evs = list(run.events)
    for a in run.agents:
        pid_suffix = f"_{a.proc.pid}"
        with contextlib.suppress(OSError), open(a.log, encoding="utf-8") as f:
            for e in read_events(f):
                node: int | str = a.node if str(e.node).endswith(pid_suffix) else e.node
                evs.append(AgentEvent((e.t - t0) * k, node, e.kind, e.role, e.rank, dict(e.fields)))
    workers: list[AgentEvent] = []
    with contextlib.suppress(OSError), open(run.dir / "workers.jsonl", encoding="utf-8") as f:
        for e in read_events(f):
            workers.append(AgentEvent((e.t - t0) * k, e.node, e.kind, e.role, e.rank, e.fields))
    evs += workers
    evs += _world_states(workers, [e for e in run.events if e.kind == "sim.fault"])
    evs.sort(key=lambda e: e.t)  # stable: the runner's events first at equal times
    evs.append(AgentEvent(run.now(), "sim", "sim.end", fields=end_kind))
    return evs


_BREAKS = ("model.crash", "model.hang", "model.stopped", "model.abort")


def _world_states(workers: list[AgentEvent], faults: list[AgentEvent]) -> list[AgentEvent]:
    out: list[AgentEvent] = []
    ready: dict[str, dict[int, float]] = {}
    nodes: dict[str, set[Any]] = {}
    sizes: dict[str, int] = {}
    over: set[str] = set()  # broken or done
    running: set[str] = set()
    # a node's crash, or its link's cut, breaks the worlds it is a member of
    cut_off: list[tuple[float, set[Any], str]] = [
        (e.t, {e.fields.get("target")}, "node_crash")
        for e in faults
        if e.fields.get("fault") == "node_crash" and e.fields.get("applied")
    ] + [
        (e.t, set(e.fields.get("nodes") or ()), "network_partition")
        for e in faults
        if e.fields.get("fault") == "network_partition" and e.fields.get("applied")
    ]
    timeline: list[tuple[float, int, AgentEvent | None, tuple[set[Any], str] | None]] = [
        (e.t, 1, e, None) for e in workers
    ] + [(t, 0, None, (gone, cause)) for t, gone, cause in cut_off]
    timeline.sort(key=lambda x: (x[0], x[1]))
    for t, _, e, lost in timeline:
        if e is None:
            assert lost is not None
            gone, cause = lost
            for w in sorted(nodes):
                if gone & nodes[w] and w not in over:
                    over.add(w)
                    out.append(AgentEvent(t, "sim", "sim.world_broken",
                                          fields={"world": w, "cause": cause}))  # fmt: skip
            continue
        w = str(e.fields.get("world", ""))
        nodes.setdefault(w, set()).add(e.node)
        if e.kind == "model.ready":
            sizes[w] = int(e.fields.get("world_size", 0))
            if w in over:
                continue
            ready.setdefault(w, {})[int(e.rank or 0)] = t
            if len(ready[w]) == sizes[w] and w not in running:
                running.add(w)
                out.append(AgentEvent(t, "sim", "sim.world_running",
                                      fields={"world": w, "world_size": sizes[w]}))  # fmt: skip
        elif e.kind == "model.done":
            over.add(w)
        elif e.kind in _BREAKS and w not in over:
            over.add(w)
            cause = e.kind.removeprefix("model.")
            out.append(AgentEvent(t, "sim", "sim.world_broken",
                                      fields={"world": w, "cause": cause}))  # fmt: skip
    return out


def _read_ckpt(d: Path) -> int:
    try:
        return int(json.loads((d / "checkpoint.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


@contextlib.contextmanager
def _workdir(keep: str | None) -> Iterator[Path]:
    if keep:
        p = Path(keep)
        p.mkdir(parents=True, exist_ok=True)
        yield p
    else:
        with tempfile.TemporaryDirectory(prefix="elastic_real_") as d:
            yield Path(d)


def real_run(
    sc: Scenario, time_scale: float = 1.0, workdir: str | None = None, log: IO[str] | None = None
) -> RealResult:
    """Run ``sc`` for real; every process started is gone when this returns."""
    wall0 = time.perf_counter()
    faults = expand_faults(sc, fault_rng(sc.seed))
    why = refusal(sc, faults)
    if why is not None:
        raise ConfigError("scenario", why)
    k = float(time_scale)
    cuts = any(f.kind is FaultKind.NETWORK_PARTITION for f in faults)
    with _workdir(workdir) as d, contextlib.ExitStack() as stack:
        hosts: netns.Hosts | None = None
        store_addr = "127.0.0.1"
        prefix: list[str] = []
        if cuts:
            netns.sweep_stale()
            n = _host_count(sc, faults)
            hosts = stack.enter_context(netns.Hosts(n + 1))  # the store host is the last
            store_addr, prefix = hosts.addr(n), hosts.prefix(n)
        store, port = _start_store(d, prefix, store_addr)
        config = d / "model.json"  # written once scenario time 0 is known
        run = _Run(sc, k, d, time.monotonic(), port, config, store, hosts, store_addr,
                   _read_timeout(sc, faults, k))  # fmt: skip
        try:
            first = [run.spawn_agent(n) for n in range(sc.cluster.nodes + sc.cluster.spare_nodes)]
            next_node = len(first)
            for i, f in sorted(enumerate(faults), key=lambda x: (x[1].at, x[0])):
                if f.kind is FaultKind.NODE_JOIN:
                    nodes = list(range(next_node, next_node + (f.count or 1)))
                    next_node += len(nodes)
                    run.at(f.at - LEAD * k, functools.partial(_prespawn, run, i, nodes))
                run.at(f.at, functools.partial(_apply, run, f, i))
            time.sleep(LEAD)  # the first agents' imports
            # scenario time 0: every first agent is let through at once, as in the simulator
            run.t0 = time.monotonic()
            _model_config(sc, faults, k, d, run.t0)
            run.emit("sim.start", **start_fields(sc), world="real", time_scale=k)
            for a in first:
                run.open_gate(a)
            reason = "done"
            while True:
                now = run.now()
                while run.actions and run.actions[0][0] <= now:
                    _, _, fn = heapq.heappop(run.actions)
                    fn()
                if not run.running() and run.pending_starts == 0:
                    break
                if now >= sc.until:
                    reason = "until"
                    break
                nxt = run.actions[0][0] if run.actions else sc.until
                time.sleep(max(0.0, min(TICK, (min(nxt, sc.until) - run.now()) / k)))
            final_nodes = sum(1 for v in run.alive.values() if v)
            steps = _read_ckpt(d)
        finally:
            for a in run.agents:
                if a.proc.poll() is None:
                    _kill_tree(a.proc.pid)
                a.proc.wait()
                if a.proc.stdin is not None and not a.proc.stdin.closed:
                    a.proc.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                store.send_signal(signal.SIGCONT)
                store.terminate()
            try:
                store.wait(timeout=10)
            except subprocess.TimeoutExpired:
                store.kill()
                store.wait()
            if store.stdout is not None:
                store.stdout.close()
        events = _merge(
            run,
            {
                "reason": reason,
                "final_nodes": final_nodes,
                "steps_done": steps,
                "best_step": steps,
                "unobserved_errors": [],
            },
        )
        if log is not None:
            for a in run.agents:
                out = d / f"agent.{a.node}.{a.incarnation}.out"
                with contextlib.suppress(OSError):
                    tail = out.read_text(errors="replace")[-1500:]
                    log.write(f"--- agent {a.node}.{a.incarnation} ---\n{tail}\n")
    report = build_report(events)
    report["sim_events"] = 0
    report["wall_s"] = round(time.perf_counter() - wall0, 3)
    report["time_scale"] = k
    return RealResult(report, events, list(faults))


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="elastic real",
        description="Run a YAML scenario on real processes: one `elastic run` agent per "
        "node on loopback (each in a network namespace of its own when the scenario has a "
        "network_partition: needs root), model workers, faults injected for real.",
    )
    p.add_argument("scenario", help="the scenario file (YAML)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="K",
        help="divide every duration of the scenario by K (the report is in scenario time)",
    )
    p.add_argument("--seed", type=seed, default=None, help="override the scenario's seed")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--events", metavar="FILE", help="write the merged event log here")
    p.add_argument("--keep", metavar="DIR", help="keep the run's files (logs, config) in DIR")
    return p


def main(argv: Sequence[str]) -> int:
    """Run a scenario's cluster on real processes: one agent per node, faults for real."""
    from sim.cli import _human, _log_bytes
    from sim.expect import check
    from sim.scenario.reader import load_scenario

    args = _parser().parse_args(list(argv))
    if not 0 < args.time_scale < float("inf"):
        print(f"elastic real: --time-scale: got {args.time_scale}; expected K > 0", file=sys.stderr)
        return 2
    try:
        sc = load_scenario(args.scenario)
        if args.seed is not None:
            sc = sc.with_seed(args.seed)
        why = refusal(sc, expand_faults(sc, fault_rng(sc.seed)))
        if why is not None:
            raise ConfigError(args.scenario, why)
    except ConfigError as e:
        print(f"elastic real: {e}", file=sys.stderr)
        return 2
    if args.keep and Path(args.keep).is_dir() and any(Path(args.keep).iterdir()):
        # a checkpoint left there would be resumed from, and old logs merged in
        print(f"elastic real: --keep: {args.keep} is not empty; expected a new or empty "
              "directory", file=sys.stderr)  # fmt: skip
        return 2
    ttl = sc.rendezvous.heartbeat_timeout / args.time_scale
    if ttl < 1.0:
        print(
            f"elastic real: warning: at --time-scale {args.time_scale:g} a node's lease lasts "
            f"{ttl * 1000:.0f} ms of wall time; an agent starved of CPU for that long loses "
            "it (keep heartbeat_timeout / K at 1 s or more)",
            file=sys.stderr,
        )

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")  # the run's finally stops everything

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        result = real_run(sc, args.time_scale, args.keep)
    except KeyboardInterrupt:
        print("elastic real: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = dict(result.report)
    if args.events:
        with open(args.events, "wb") as f:
            f.write(_log_bytes(result.events))
    failures = check(sc.expect, report)
    report["expect_failures"] = failures
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        report["_expected"] = bool(list(sc.expect.items()))
        print(_human(report, failures))
    return 1 if failures else 0
