"""What each fault kind does to the simulated cluster: one handler per kind, in ``HANDLERS``.

This table sits beside the parsing table, :data:`sim.scenario.model.KIND_FIELDS` (what each
kind takes in a scenario file).  Adding a fault kind is one :class:`FaultKind` member, one
entry in each table, and the model of its behaviour (in :mod:`sim.world`,
:mod:`sim.workers` or :mod:`sim.store`); tests/test_inject.py checks that every parsed
kind has a handler and every handler a parsed kind.

A handler gets the cluster, the fault, the node it names (None if it names none or one that
does not exist yet) and the fields of the ``sim.fault`` event it will be logged with, to
which it may add (``local_rank``, ``nodes``); it returns whether the fault took effect.
Handlers only act and schedule: anything later (a restart, a heal, the end of an outage)
is a task on the simulated clock.

A fault aimed at a node that is down when it fires (crashed, left, or not booted yet) is
a no-op: it is logged once, ``applied: false`` with ``why``, and schedules nothing — no
second restart of a node whose restart is already pending, no preemption or repair that
would land on the node's next incarnation.  Two kinds are properties of the machine
rather than of its running agent, and apply to a down node too: ``slow_node`` (the
hardware stays slow across a reboot) and ``network_partition`` (the node's link is cut,
and an agent booted on it during the cut starts cut off).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.scenario.model import Fault, FaultKind
from sim.workers import SIGABRT_EXIT
from sim.world import SimCluster, SimNode

__all__ = ["HANDLERS", "Handler", "apply_fault", "not_up"]

Handler = Callable[[SimCluster, Fault, SimNode | None, dict[str, Any]], bool]


def apply_fault(c: SimCluster, f: Fault, index: int) -> None:
    """Apply ``f`` (the ``index``-th fault of the run) and log it as a ``sim.fault`` event."""
    fields: dict[str, Any] = {"fault": f.kind.value, "index": index}
    node = c.nodes.get(f.node) if f.node is not None else None
    if f.node is not None:
        fields["target"] = f.node
    if f.category is not None:
        fields["category"] = f.category  # from failures: (sim/failures.py), for the report
    fields["applied"] = HANDLERS[f.kind](c, f, node, fields)
    c.emit("sim.fault", **fields)


def not_up(node: int, exists: bool) -> str:
    """Why a fault aimed at ``node`` is a no-op (``why`` of its event; real mode's too)."""
    return f"node {node} is down" if exists else f"no node {node} yet"


def _up(f: Fault, node: SimNode | None, fields: dict[str, Any]) -> SimNode | None:
    """The fault's node if it is up; else None, and why the fault is a no-op in ``fields``."""
    if node is not None and node.alive:
        return node
    assert f.node is not None  # the scenario's loader requires it for these kinds
    fields["why"] = not_up(f.node, exists=node is not None)
    return None


def _worker_crash(c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]) -> bool:
    fields["local_rank"] = lr = f.local_rank or 0
    if (up := _up(f, node, fields)) is None:
        return False
    group = up.workers.group if up.workers else None
    if group is None or not group.crash(lr, f.exit_code if f.exit_code is not None else 1):
        fields["why"] = f"node {f.node} runs no worker {lr}"
        return False
    return True


def _worker_hang(c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]) -> bool:
    fields["local_rank"] = lr = f.local_rank or 0
    if (up := _up(f, node, fields)) is None:
        return False
    group = up.workers.group if up.workers else None
    if group is None or not group.hang(lr):
        fields["why"] = f"node {f.node} runs no worker {lr} that steps"
        return False
    return True


def _node_crash(c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]) -> bool:
    if (up := _up(f, node, fields)) is None:
        return False  # its pending restart, if any, stays the only one
    up.crash()
    if f.restart_after is not None:
        c.restart_later(up, f.restart_after)
    return True


def _node_join(c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]) -> bool:
    new = [c.add_node() for _ in range(f.count or 1)]
    fields["nodes"] = [n.id for n in new]
    for n in new:
        c.start_node(n)
    return True


def _node_leave(c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]) -> bool:
    if (up := _up(f, node, fields)) is None:
        return False
    c.clock.spawn(up.leave(), name=f"leave-{up.id}")
    return True


def _preemption(c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]) -> bool:
    # a down node gets no notice: else its leave would land on the node's next incarnation
    if (up := _up(f, node, fields)) is None:
        return False
    c.clock.spawn(_preempt(up, f.notice or 0.0), name=f"preempt-{up.id}")
    return True


def _store_outage(c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]) -> bool:
    c.host.outage_start()
    c.clock.spawn(_later(c, f.duration or 0.0, c.host.outage_end), name="outage")
    return True


def _network_partition(
    c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]
) -> bool:
    targets = [c.nodes[i] for i in (f.nodes or ()) if i in c.nodes]
    fields["nodes"] = [n.id for n in targets]
    for n in targets:
        n.cut += 1  # a node down now boots cut off until the heal (SimNode.start)
        if n.store is not None:
            n.store.partition_start()
        if n.workers is not None and n.workers.group is not None:
            n.workers.group.world.break_("network_partition")
    c.clock.spawn(_later(c, f.duration or 0.0, lambda: _heal(targets)), name="heal")
    return True


def _slow_node(c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]) -> bool:
    if f.node is not None:
        nid = f.node
        c.training.set_slow(nid, f.factor or 1.0)
        if f.duration is not None:
            c.clock.spawn(
                _later(c, f.duration, lambda: c.training.set_slow(nid, 1.0)), name="unslow"
            )
    return True


def _gpu_error(c: SimCluster, f: Fault, node: SimNode | None, fields: dict[str, Any]) -> bool:
    if (up := _up(f, node, fields)) is None:
        return False
    up.gpu_bad = True
    group = up.workers.group if up.workers else None
    if group is not None:
        group.crash(f.local_rank or 0, SIGABRT_EXIT)
    if f.restart_after is not None:
        c.pending_starts += 1  # at once: see SimCluster.restart_later
        c.clock.spawn(_repair(c, up, f.restart_after), name=f"repair-{up.id}")
    return True


#: What each fault kind does; the keys are exactly :class:`FaultKind`'s members.
HANDLERS: dict[FaultKind, Handler] = {
    FaultKind.WORKER_CRASH: _worker_crash,
    FaultKind.WORKER_HANG: _worker_hang,
    FaultKind.NODE_CRASH: _node_crash,
    FaultKind.NODE_JOIN: _node_join,
    FaultKind.NODE_LEAVE: _node_leave,
    FaultKind.PREEMPTION: _preemption,
    FaultKind.STORE_OUTAGE: _store_outage,
    FaultKind.NETWORK_PARTITION: _network_partition,
    FaultKind.SLOW_NODE: _slow_node,
    FaultKind.GPU_ERROR: _gpu_error,
}


async def _later(c: SimCluster, after: float, fn: Callable[[], object]) -> None:
    await c.clock.sleep(after)
    fn()


def _heal(nodes: list[SimNode]) -> None:
    for n in nodes:
        n.cut -= 1
        if n.cut == 0 and n.store is not None:  # the last of overlapping cuts heals it;
            n.store.partition_end()  # the client of the node's agent now, maybe newer


async def _preempt(node: SimNode, notice: float) -> None:
    await node.cluster.clock.sleep(notice)
    await node.leave()


async def _repair(c: SimCluster, node: SimNode, after: float) -> None:
    """The node with a bad GPU is taken out, repaired, and boots a fresh agent."""
    try:
        await c.clock.sleep(after)
        node.gpu_bad = False
        if node.alive:
            node.crash()
        if not c.finished.is_set():
            c.emit("sim.node_restart", node=node.id)
            c.start_node(node)
    finally:
        c.pending_starts -= 1
        c.maybe_done()
