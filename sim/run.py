"""Run a scenario: build the simulated cluster, inject the faults (each kind's handler is in
:mod:`sim.inject`), return the event log.

A run is a pure function of (scenario, seed): randomness comes only from sub-generators
of the seed, one per concern (faults here; nothing else draws yet), simpy orders
simultaneous events by insertion, and nodes and faults are iterated in a fixed order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from elastic.events import AgentEvent, EventSink, ListSink, WorkerEvents, parts_sink
from elastic.rendezvous import get_rendezvous_handler
from elastic.rendezvous.api import RendezvousContext, RendezvousHandler, RendezvousParameters
from sim.calibration import Calibration, ModelLatencies
from sim.clock import SimClock
from sim.gcpause import quiet_gc
from sim.inject import apply_fault
from sim.report import ReportSink
from sim.scenario.expand import expand_faults, fault_rng
from sim.scenario.model import Fault, RendezvousBackendName, Scenario
from sim.store import SimStoreHost
from sim.workers import Training
from sim.world import SimCluster, SimNode

__all__ = ["SimResult", "simulate"]

MASTER_PORT = 29500


@dataclass(frozen=True, slots=True)
class SimResult:
    """The outcome of one run: the report (a JSON-able dict), the faults it drew, the
    errors no task observed (``sim.end``'s ``unobserved_errors``) and, when asked for
    (``simulate(..., keep_events=True)``), the event log."""

    report: dict[str, Any]
    kept_events: list[AgentEvent] | None
    faults: list[Fault]
    unobserved_errors: list[str]

    @property
    def events(self) -> list[AgentEvent]:
        """The event log; only a run asked to keep it has it (a 54-day run's log would
        not fit in memory: stream it to a sink instead)."""
        if self.kept_events is None:
            raise ValueError(
                "this run did not keep its event log: pass keep_events=True to simulate "
                "(or sink= to receive each event as it happens)"
            )
        return self.kept_events


def _handler_factory(sc: Scenario) -> Any:
    """Each node's rendezvous handler, built through the registry as real mode does."""
    rdzv = sc.rendezvous
    run_id = "sim"

    def make(node: SimNode) -> RendezvousHandler:
        c = node.cluster
        assert node.store is not None
        config: dict[str, Any] = {
            "join_timeout": rdzv.join_timeout,
            "last_call_timeout": rdzv.last_call_timeout,
            "close_timeout": rdzv.close_timeout,
            "heartbeat_timeout": rdzv.heartbeat_timeout,
            "timeout": rdzv.join_timeout,
            "master_port": MASTER_PORT,
        }
        if rdzv.backend is RendezvousBackendName.STATIC:
            config["rank"] = node.id
        params = RendezvousParameters(
            backend=rdzv.backend.value,
            endpoint=f"node0:{MASTER_PORT}",
            run_id=run_id,
            min_nodes=rdzv.min_nodes,
            max_nodes=rdzv.max_nodes,
            **config,
        )
        ctx = RendezvousContext(
            store=node.store,
            clock=c.clock,
            node_addr=f"node{node.id}",
            node_id=f"node{node.id:06d}",
        )
        return get_rendezvous_handler(params, ctx)

    return make


def start_fields(sc: Scenario) -> dict[str, Any]:
    """The fields of a run's ``sim.start`` event, in both worlds (``elastic real`` too):
    what the report needs of the scenario (steps, step time, the checkpoint settings for
    its checkpoint overhead and ETTR, ``sim/losses.py``)."""
    job = sc.job
    return {
        "name": sc.name,
        "seed": sc.seed,
        "nodes": sc.cluster.nodes,
        "spare_nodes": sc.cluster.spare_nodes,
        "nproc_per_node": sc.cluster.nproc_per_node,
        "steps": job.steps,
        "step_time": job.step_time,
        "checkpoint_every": job.checkpoint_every,
        "checkpoint_time": job.checkpoint_time,
        "until": sc.until,
        "backend": sc.rendezvous.backend.value,
    }


#: How many times a run calls its ``progress`` callback, at most (evenly in simulated time).
PROGRESS_TICKS = 200


def simulate(
    sc: Scenario,
    seed: int | None = None,
    progress: Callable[[float, float], None] | None = None,
    calibration: Calibration | None = None,
    time_scale: float = 1.0,
    *,
    sink: EventSink | None = None,
    keep_events: bool = False,
) -> SimResult:
    """Run ``sc`` (with ``seed`` overriding the file's) and return its report.

    The event log is streamed, never held: each event goes, as it happens, to the report
    (:class:`sim.report.ReportSink`, which keeps only what the report needs) and to
    ``sink`` (a file, a hash, the plot's timeline...).  ``keep_events=True`` also keeps
    the whole log in :attr:`SimResult.events` (tests; memory grows with the run).

    ``progress(now, until)`` is called every ``until / PROGRESS_TICKS`` simulated
    seconds (for a progress bar).  The ticks are the clock's observer events
    (``SimClock.every``): they do not change the order of the run's events, its event log
    or its ``sim_events``.

    ``calibration``: this machine's latencies (:mod:`sim.calibration`), as a real run at
    ``time_scale`` meets them; they replace the store's latency and add to the worker
    model's start-up, stop time and exit notice.
    """
    wall0 = time.perf_counter()
    if seed is not None:
        sc = sc.with_seed(seed)
    lat = ModelLatencies()
    if calibration is not None:
        lat = calibration.latencies(time_scale)
        sc = calibration.apply_store(sc, time_scale)
    faults = expand_faults(sc, fault_rng(sc.seed))
    clock = SimClock()
    report_sink = ReportSink()
    kept = ListSink() if keep_events else None
    sinks: list[EventSink] = [report_sink]
    if sink is not None:
        sinks.append(sink)
    if kept is not None:
        sinks.append(kept)
    events = _RunSinks(sinks)
    job = sc.job
    # the job as this run meets it: its start-up net of what a preload saves, plus this
    # machine's extra start-up
    model = replace(
        job,
        startup_time=job.startup_time - (job.preload_saves or 0.0) + lat.extra_startup,
        preload_saves=None,
    )
    training = Training(clock, model, events, stop_time=lat.stop_time, exit_notice=lat.exit_notice)
    host = SimStoreHost(clock, latency=sc.store.latency)
    initial = sc.cluster.nodes + sc.cluster.spare_nodes
    from sim.hangs import health_watches_factory

    cluster = SimCluster(
        clock,
        host,
        training,
        events,
        nproc_per_node=sc.cluster.nproc_per_node,
        max_restarts=sc.agent.max_restarts,
        monitor_interval=sc.agent.monitor_interval,
        exit_barrier_timeout=sc.agent.exit_barrier_timeout,
        shutdown_timeout=sc.agent.shutdown_timeout,
        handler_factory=_handler_factory(sc),
        health_watches=health_watches_factory(sc, training, clock, events),
    )
    cluster.emit("sim.start", **start_fields(sc))
    for _ in range(initial):
        cluster.add_node()
    for n in list(cluster.nodes.values()):
        cluster.start_node(n)
    clock.spawn(_drive_faults(cluster, faults), name="faults")
    deadline = clock.env.timeout(sc.until)
    if progress is not None:
        progress(0.0, sc.until)
        clock.every(sc.until / PROGRESS_TICKS, lambda now: progress(now, sc.until))
    with quiet_gc():  # the collector took half the CPU at 2,048 nodes (sim/gcpause.py)
        clock.run_first(clock.event_of(cluster.finished), deadline)
    reason = "done" if cluster.finished.is_set() else "until"
    unobserved = [f"{n}: {type(e).__name__}: {e}" for n, e in clock.unobserved]
    if clock.unobserved_dropped:
        unobserved.append(f"{clock.unobserved_dropped} more failed tasks (not kept)")
    cluster.emit(
        "sim.end",
        reason=reason,
        final_nodes=sum(1 for n in cluster.nodes.values() if n.alive),
        steps_done=training.model.steps if training.done else training.ckpt_step,
        best_step=training.best_step,
        unobserved_errors=unobserved,
    )
    # the log ends here: the agents' coroutines still suspended are closed whenever the
    # garbage collector frees them (their ``finally`` stops groups and emits), during a
    # later run of the same process; what they say must not reach this run's sinks
    events.close()
    sim_events = clock.events()  # the progress ticks' events are not the run's
    report = report_sink.result()
    report["sim_events"] = sim_events
    report["wall_s"] = round(time.perf_counter() - wall0, 3)
    return SimResult(report, kept.events if kept is not None else None, faults, unobserved)


class _RunSinks:
    """One run's sinks, fed every event until :meth:`close` (the run's ``sim.end``).

    Performance: ``emit`` is the only sink's own ``emit`` when there is one (a run with
    no ``sink=``: its report), called without a loop; ~20 events per node per restart.
    ``emit_group`` (a group of workers' events as one record, 16 of those 20) is there
    only when every sink takes records (the report does; a ``sink=`` without
    ``emit_group`` makes the agents emit each event, as they always did), so a run whose
    sinks read no worker's events pays once per group, not once per worker.  Likewise
    ``emit_parts`` and ``emit_group_parts`` (an event or a record as its parts, no
    :class:`AgentEvent` or record made) are the only sink's own when it takes parts (the
    report: :func:`~elastic.events.parts_sink`), a call of each sink's when every sink
    takes parts (the report and ``--plot``'s timeline), else ``None``."""

    __slots__ = ("_sinks", "_takers", "emit", "emit_group", "emit_group_parts", "emit_parts")

    def __init__(self, sinks: list[EventSink]) -> None:
        self._sinks: tuple[EventSink, ...] = tuple(sinks)
        self.emit: Callable[[AgentEvent], None] = (
            self._sinks[0].emit if len(self._sinks) == 1 else self._emit_all
        )
        takers = [getattr(s, "emit_group", None) for s in self._sinks]
        self._takers = tuple(t for t in takers if t is not None)
        self.emit_group: Callable[[WorkerEvents], None] | None = None
        if len(self._takers) == len(self._sinks):
            self.emit_group = self._takers[0] if len(self._takers) == 1 else self._group_all
        self.emit_parts: Callable[..., None] | None = None
        self.emit_group_parts: Callable[..., None] | None = None
        parts = [parts_sink(s) for s in self._sinks]
        if len(parts) == 1 and parts[0] is not None:
            self.emit_parts = parts[0].emit_parts
            self.emit_group_parts = parts[0].emit_group_parts
        elif all(p is not None for p in parts):
            # several sinks that all take parts (the report and --plot's timeline)
            each = tuple(p.emit_parts for p in parts if p is not None)
            each_group = tuple(p.emit_group_parts for p in parts if p is not None)

            def emit_parts(*event: Any) -> None:
                for take in each:
                    take(*event)

            def emit_group_parts(*record: Any) -> None:
                for take in each_group:
                    take(*record)

            self.emit_parts, self.emit_group_parts = emit_parts, emit_group_parts

    def _emit_all(self, event: AgentEvent) -> None:
        for s in self._sinks:
            s.emit(event)

    def _group_all(self, group: WorkerEvents) -> None:
        for take in self._takers:
            take(group)

    def close(self) -> None:
        self._sinks = ()
        self._takers = ()
        self.emit = _drop
        if self.emit_group is not None:
            self.emit_group = _drop_group
        if self.emit_parts is not None:
            self.emit_parts = self.emit_group_parts = _drop_parts


def _drop(event: AgentEvent) -> None:
    """A closed run's sinks: what the agents say after the run's end reaches no one."""


def _drop_group(group: WorkerEvents) -> None:
    """A closed run's sinks, for a group of workers' events."""


def _drop_parts(*parts: Any) -> None:
    """A closed run's sinks, for an event or a record given as its parts."""


async def _drive_faults(c: SimCluster, faults: list[Fault]) -> None:
    clock = c.clock
    for i, f in enumerate(faults):
        delay = f.at - clock.now()
        if delay > 0:
            await clock.sleep(delay)
        if c.finished.is_set():
            return
        apply_fault(c, f, i)
