"""Failure generators calibrated on published data: a scenario's ``failures:`` section.

A scenario's ``faults:`` names faults one by one or as rates of one kind.  ``failures:``
describes how hardware and software fail at the scale of a cluster, the way the papers report
it: a mean time between failures of *one* component (a GPU, a node) that the cluster's size
scales, and a mix of categories (faulty GPU, HBM3, software bug, …) each with a weight, the
fault kind it causes in the simulator and a repair time, fixed or drawn from a named
distribution.  Planned maintenance is a stream of its own, apart from unexpected failures::

    failures:
      unexpected:
        mtbf: 50678h            # of one GPU; 16,384 GPUs fail every ~3.1 h
        per: gpu                # gpu (nodes x nproc_per_node), node, or cluster
        categories:
          - {name: faulty_gpu, weight: 148, kind: gpu_error,
             repair: {dist: lognormal, median: 4h, sigma: 0.5}}
          - {name: software_bug, weight: 54, kind: worker_crash}
      planned:
        mtbf: 56477h
        per: node
        categories: [{name: planned_maintenance, kind: node_crash, repair: 2h}]

    failures: llama3-405b       # the preset: Table 5 of the Llama 3 paper, any cluster size

Units are the hosts that start with the job (``cluster.nodes`` + ``spare_nodes``).  A
category's ``repair`` is the fault's ``restart_after`` for ``gpu_error`` and ``node_crash``
(the node is back after it) and its ``duration`` for ``network_partition``, ``slow_node`` and
``store_outage``; kinds without a repair refuse one.

Determinism: :func:`generate` is a pure function of the model, the cluster, the time span and
a base number drawn from the scenario's "faults" generator; each stream draws from its own
generators, one per concern (times, categories, local ranks, repair times), so that changing
one stream's categories leaves its times, and the other stream, unchanged.  Every fault it
makes carries its category, which the event log records (``sim.fault``'s ``category``).
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass
from typing import Any

import yaml

from sim.durations import format_duration
from sim.scenario.limits import MAX_EXPANDED_FAULTS, MAX_SECONDS
from sim.scenario.model import Cluster, FaultKind, RateFault
from sim.scenario.reader import param_reader
from sim.scenario.walker import Choice, Ctx, Duration, Map, Real, Text, describe_node, show

__all__ = [
    "PRESETS",
    "Category",
    "Distribution",
    "FailureModel",
    "Repair",
    "Stream",
    "Unit",
    "generate",
    "read_failures",
]


class Unit(enum.StrEnum):
    """What one ``mtbf`` is of: one GPU, one node, or the whole cluster."""

    GPU = "gpu"
    NODE = "node"
    CLUSTER = "cluster"


class Distribution(enum.StrEnum):
    """Named repair-time distributions (parameters in seconds)."""

    FIXED = "fixed"  # value
    EXPONENTIAL = "exponential"  # mean
    LOGNORMAL = "lognormal"  # median, sigma (of the log)
    UNIFORM = "uniform"  # min, max


@dataclass(frozen=True, slots=True)
class Repair:
    """A repair time: ``a`` and ``b`` are (value, 0), (mean, 0), (median, sigma), (min, max)."""

    dist: Distribution
    a: float
    b: float = 0.0

    def draw(self, rng: random.Random) -> float:
        if self.dist is Distribution.FIXED:
            value = self.a
        elif self.dist is Distribution.EXPONENTIAL:
            value = rng.expovariate(1.0 / self.a)
        elif self.dist is Distribution.LOGNORMAL:
            value = self.a * math.exp(rng.gauss(0.0, self.b))
        else:
            value = rng.uniform(self.a, self.b)
        return min(round(value, 3), MAX_SECONDS)

    @property
    def mean(self) -> float:
        if self.dist is Distribution.LOGNORMAL:
            return self.a * math.exp(self.b * self.b / 2)
        if self.dist is Distribution.UNIFORM:
            return (self.a + self.b) / 2
        return self.a

    def to_data(self) -> Any:
        if self.dist is Distribution.FIXED:
            return format_duration(self.a)
        names = {
            Distribution.EXPONENTIAL: (("mean", self.a),),
            Distribution.LOGNORMAL: (("median", self.a),),
            Distribution.UNIFORM: (("min", self.a), ("max", self.b)),
        }[self.dist]
        out: dict[str, Any] = {"dist": self.dist.value}
        out.update((k, format_duration(v)) for k, v in names)
        if self.dist is Distribution.LOGNORMAL:
            out["sigma"] = self.b
        return out


@dataclass(frozen=True, slots=True)
class Category:
    """One cause of failure: its share (``weight``), the fault it causes, its repair."""

    name: str
    kind: FaultKind
    weight: float = 1.0
    repair: Repair | None = None
    notice: float | None = None  # preemption
    factor: float | None = None  # slow_node
    exit_code: int | None = None  # worker_crash

    def to_data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "weight": self.weight, "kind": self.kind.value}
        if self.repair is not None:
            out["repair"] = self.repair.to_data()
        if self.notice is not None:
            out["notice"] = format_duration(self.notice)
        if self.factor is not None:
            out["factor"] = self.factor
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        return out


@dataclass(frozen=True, slots=True)
class Stream:
    """Failures at mean interval ``mtbf`` per ``per`` unit, split among ``categories``."""

    mtbf: float
    per: Unit
    categories: tuple[Category, ...]

    def units(self, cluster: Cluster) -> int:
        hosts = cluster.nodes + cluster.spare_nodes
        return {Unit.GPU: hosts * cluster.nproc_per_node, Unit.NODE: hosts, Unit.CLUSTER: 1}[
            self.per
        ]

    def expected(self, cluster: Cluster, span: float) -> float:
        """How many failures this stream draws in ``span`` seconds, on average."""
        return span * self.units(cluster) / self.mtbf

    def to_data(self) -> dict[str, Any]:
        return {
            "mtbf": format_duration(self.mtbf),
            "per": self.per.value,
            "categories": [c.to_data() for c in self.categories],
        }


@dataclass(frozen=True, slots=True)
class FailureModel:
    """A scenario's ``failures:``: ``preset`` is the name it was given by, if any."""

    unexpected: Stream | None = None
    planned: Stream | None = None
    preset: str = ""

    def streams(self) -> tuple[tuple[str, Stream], ...]:
        return tuple(
            (n, s) for n, s in (("unexpected", self.unexpected), ("planned", self.planned)) if s
        )

    def to_data(self) -> Any:
        if self.preset:
            return self.preset
        return {name: stream.to_data() for name, stream in self.streams()}


def _lognormal(median_h: float, sigma: float) -> Repair:
    return Repair(Distribution.LOGNORMAL, median_h * 3600.0, sigma)


# Table 5 of "The Llama 3 Herd of Models" (2024): 419 unexpected interruptions in a 54-day
# snapshot of Llama 3 405B pre-training on 16,384 GPUs (2,048 hosts x 8), plus 47 planned
# ones.  The counts and the rates are the paper's; the fault kinds are our reading of each
# cause; the repair times are NOT published — they are assumptions (a node with a failed GPU
# or board is swapped out for hours, a link or NIC for about an hour; software faults need
# only a restart) and a scenario can override them with an explicit failures: section.
_GPU_REPAIR = _lognormal(4.0, 0.5)
_HOST_REPAIR = _lognormal(8.0, 0.5)
_NET_REPAIR = _lognormal(1.0, 0.5)
_LLAMA3_GPUS = 16_384
_LLAMA3_HOSTS = 2_048
_LLAMA3_SPAN = 54 * 86400.0
_LLAMA3_TABLE5: tuple[tuple[str, int, FaultKind, Repair | None], ...] = (
    ("faulty_gpu", 148, FaultKind.GPU_ERROR, _GPU_REPAIR),
    ("gpu_hbm3_memory", 72, FaultKind.GPU_ERROR, _GPU_REPAIR),
    ("software_bug", 54, FaultKind.WORKER_CRASH, None),
    ("network_switch_cable", 35, FaultKind.NODE_CRASH, _NET_REPAIR),
    ("host_maintenance_unplanned", 32, FaultKind.NODE_CRASH, _lognormal(2.0, 0.5)),
    ("gpu_sram_memory", 19, FaultKind.GPU_ERROR, _GPU_REPAIR),
    ("gpu_system_processor", 17, FaultKind.GPU_ERROR, _GPU_REPAIR),
    ("nic", 7, FaultKind.NODE_CRASH, _NET_REPAIR),
    ("nccl_watchdog_timeout", 7, FaultKind.WORKER_HANG, None),
    ("silent_data_corruption", 6, FaultKind.GPU_ERROR, _GPU_REPAIR),
    ("gpu_thermal", 6, FaultKind.GPU_ERROR, _GPU_REPAIR),
    ("ssd", 3, FaultKind.NODE_CRASH, _HOST_REPAIR),
    ("power_supply", 3, FaultKind.NODE_CRASH, _HOST_REPAIR),
    ("server_chassis", 2, FaultKind.NODE_CRASH, _HOST_REPAIR),
    ("io_expansion_board", 2, FaultKind.NODE_CRASH, _HOST_REPAIR),
    ("dependency", 2, FaultKind.WORKER_CRASH, None),
    ("cpu", 2, FaultKind.NODE_CRASH, _HOST_REPAIR),
    ("system_memory", 2, FaultKind.NODE_CRASH, _HOST_REPAIR),
)
_LLAMA3_UNEXPECTED = sum(count for _, count, _, _ in _LLAMA3_TABLE5)  # 419
_LLAMA3_PLANNED = 47

#: Named failure models (``failures: NAME``).
PRESETS: dict[str, FailureModel] = {
    "llama3-405b": FailureModel(
        # per GPU: 16,384 GPUs x 54 days / 419 ≈ 50,678 h (5.8 years) for one GPU
        unexpected=Stream(
            mtbf=_LLAMA3_GPUS * _LLAMA3_SPAN / _LLAMA3_UNEXPECTED,
            per=Unit.GPU,
            categories=tuple(
                Category(name=name, kind=kind, weight=float(count), repair=repair)
                for name, count, kind, repair in _LLAMA3_TABLE5
            ),
        ),
        # per node: 2,048 hosts x 54 days / 47 ≈ 56,477 h; a node is taken out and comes
        # back (the simulator has no graceful leave that returns, so a crash with a repair)
        planned=Stream(
            mtbf=_LLAMA3_HOSTS * _LLAMA3_SPAN / _LLAMA3_PLANNED,
            per=Unit.NODE,
            categories=(
                Category(
                    name="planned_maintenance",
                    kind=FaultKind.NODE_CRASH,
                    repair=Repair(Distribution.FIXED, 2 * 3600.0),
                ),
            ),
        ),
        preset="llama3-405b",
    ),
}

# What a category's repair time becomes in the fault, per kind; kinds absent take no repair.
_REPAIR_FIELD: dict[FaultKind, str] = {
    FaultKind.GPU_ERROR: "restart_after",
    FaultKind.NODE_CRASH: "restart_after",
    FaultKind.NETWORK_PARTITION: "duration",
    FaultKind.SLOW_NODE: "duration",
    FaultKind.STORE_OUTAGE: "duration",
}
# Fields a category must give for its kind (the fault needs them and nothing draws them).
_CATEGORY_NEEDS: dict[FaultKind, tuple[str, ...]] = {
    FaultKind.PREEMPTION: ("notice",),
    FaultKind.SLOW_NODE: ("factor",),
    FaultKind.NETWORK_PARTITION: ("repair",),
    FaultKind.STORE_OUTAGE: ("repair",),
}
# The kinds a failure can cause (node_join brings a node: not a failure).
FAILURE_KINDS = tuple(k for k in FaultKind if k is not FaultKind.NODE_JOIN)
_CATEGORY_KEYS = ("name", "weight", "kind", "repair", "notice", "factor", "exit_code")
_STREAM_KEYS = ("mtbf", "per", "categories")
_MODEL_KEYS = ("unexpected", "planned")
_MAX_CATEGORIES = 100


class _Kind(enum.StrEnum):
    """The kinds a category may name (FaultKind without node_join), for the reader."""

    WORKER_CRASH = "worker_crash"
    WORKER_HANG = "worker_hang"
    NODE_CRASH = "node_crash"
    NODE_LEAVE = "node_leave"
    PREEMPTION = "preemption"
    STORE_OUTAGE = "store_outage"
    NETWORK_PARTITION = "network_partition"
    SLOW_NODE = "slow_node"
    GPU_ERROR = "gpu_error"


assert {k.value for k in _Kind} == {k.value for k in FAILURE_KINDS}


def read_failures(ctx: Ctx, node: yaml.Node, cluster: Cluster, until: float) -> FailureModel:
    """Read ``failures:`` (a preset's name or a mapping); refuse it in one line if bad."""
    path = "failures"
    if isinstance(node, yaml.ScalarNode):
        name = Text().read(ctx, node, path)
        model = PRESETS.get(name)
        if model is None:
            raise ctx.error(
                node,
                path,
                f"got {show(name)}; expected a preset ({', '.join(sorted(PRESETS))}) or a "
                "mapping with unexpected: and/or planned:",
            )
    else:
        m = Map(ctx, node, path, "a preset name or a mapping with unexpected: and/or planned:")
        m.check_keys(_MODEL_KEYS, "one of", {})
        streams = {key: _stream(ctx, m, key) for key in _MODEL_KEYS}
        if not any(streams.values()):
            raise ctx.error(node, path, "got no stream; expected unexpected:, planned: or both")
        model = FailureModel(unexpected=streams["unexpected"], planned=streams["planned"])
    total = sum(s.expected(cluster, until) for _, s in model.streams())
    if total > MAX_EXPANDED_FAULTS:
        raise ctx.error(
            node,
            path,
            f"would draw about {total:.0f} failures in {format_duration(until)} on this "
            f"cluster; expected at most {MAX_EXPANDED_FAULTS} (raise mtbf or shorten until)",
        )
    return model


def _stream(ctx: Ctx, top: Map, key: str) -> Stream | None:
    m = top.section(key, "a mapping with mtbf:, per: and categories:")
    if m is None:
        return None
    m.check_keys(_STREAM_KEYS, "one of", {})
    mtbf = m.req("mtbf", Duration(positive=True))
    per = m.get("per", Choice(Unit), Unit.NODE)
    node = m.value_node("categories")
    path = m.sub("categories")
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        shown = "nothing" if node is None else describe_node(node)
        raise ctx.error(
            node or m.node,
            path,
            f"got {shown}; expected a non-empty list of categories like "
            "{name: faulty_gpu, weight: 148, kind: gpu_error, repair: 4h}",
        )
    if len(node.value) > _MAX_CATEGORIES:
        raise ctx.error(node, path, f"got {len(node.value)}; expected at most {_MAX_CATEGORIES}")
    categories = tuple(_category(ctx, item, f"{path}[{i}]") for i, item in enumerate(node.value))
    names = [c.name for c in categories]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ctx.error(
                node.value[i], f"{path}[{i}].name", f"got {name!r} twice; expected unique names"
            )
    return Stream(mtbf=mtbf, per=per, categories=categories)


def _category(ctx: Ctx, node: yaml.Node, path: str) -> Category:
    m = Map(ctx, node, path, "a category mapping like {name: nic, weight: 7, kind: node_crash}")
    m.check_keys(_CATEGORY_KEYS, "a key of a failure category", {})
    name = m.req("name", Text())
    kind = FaultKind(m.req("kind", Choice(_Kind)).value)
    weight = m.get("weight", Real(0.0, 1e12, lo_open=True), 1.0)
    for needed in _CATEGORY_NEEDS.get(kind, ()):
        if m.value_node(needed) is None:
            raise ctx.error(m.node, m.sub(needed), f"missing; a {kind.value} failure needs it")
    allowed = {"repair"} if kind in _REPAIR_FIELD else set()
    allowed |= {"notice"} if kind is FaultKind.PREEMPTION else set()
    allowed |= {"factor"} if kind is FaultKind.SLOW_NODE else set()
    allowed |= {"exit_code"} if kind is FaultKind.WORKER_CRASH else set()
    for key in ("repair", "notice", "factor", "exit_code"):
        if key not in allowed and m.value_node(key) is not None:
            raise ctx.error(
                m.line_of(key), m.sub(key), f"given for a {kind.value} failure, which takes none"
            )
    repair_node = m.value_node("repair")
    repair = None if repair_node is None else _repair(ctx, repair_node, m.sub("repair"))
    widest = Cluster(nodes=1, nproc_per_node=1)
    return Category(
        name=name,
        kind=kind,
        weight=weight,
        repair=repair,
        notice=m.opt("notice", param_reader("notice", widest)),
        factor=m.opt("factor", param_reader("factor", widest)),
        exit_code=m.opt("exit_code", param_reader("exit_code", widest)),
    )


_DIST_KEYS: dict[Distribution, tuple[str, ...]] = {
    Distribution.FIXED: ("value",),
    Distribution.EXPONENTIAL: ("mean",),
    Distribution.LOGNORMAL: ("median", "sigma"),
    Distribution.UNIFORM: ("min", "max"),
}


def _repair(ctx: Ctx, node: yaml.Node, path: str) -> Repair:
    if not isinstance(node, yaml.MappingNode):
        return Repair(Distribution.FIXED, Duration().read(ctx, node, path))
    m = Map(ctx, node, path, "")
    dist = m.req("dist", Choice(Distribution))
    keys = _DIST_KEYS[dist]
    m.check_keys(("dist", *keys), f"a key of a {dist.value} repair time", {})
    if dist is Distribution.LOGNORMAL:
        return Repair(
            dist, m.req("median", Duration(positive=True)), m.req("sigma", Real(0.0, 10.0))
        )
    if dist is Distribution.UNIFORM:
        low = m.req("min", Duration())
        high = m.req("max", Duration())
        if high < low:
            raise ctx.error(
                m.line_of("max"), m.sub("max"), f"got {format_duration(high)}; expected ≥ min"
            )
        return Repair(dist, low, high)
    return Repair(dist, m.req(keys[0], Duration(positive=dist is Distribution.EXPONENTIAL)))


def generate(
    model: FailureModel, cluster: Cluster, start: float, end: float, base: int
) -> list[tuple[float, str, int, RateFault]]:
    """The failures in [``start``, ``end``): (time, stream, sequence, fault template).

    A template is a :class:`RateFault` (its ``every`` is the stream's cluster-wide mean
    interval) whose ``node`` and ``nodes`` are left for :func:`sim.scenario.expand_faults`
    to draw among the nodes that exist at its time; its category, repair time (as
    ``restart_after`` or ``duration``), ``local_rank`` (for a GPU's or worker's fault) and
    the category's fixed fields are drawn or set here.
    """
    out: list[tuple[float, str, int, RateFault]] = []
    for stream_name, stream in model.streams():
        seed = f"{base}/failures/{stream_name}"
        times = random.Random(f"{seed}/times")
        which = random.Random(f"{seed}/categories")
        ranks = random.Random(f"{seed}/local_ranks")
        repairs = random.Random(f"{seed}/repairs")
        every = stream.mtbf / stream.units(cluster)
        weights = [c.weight for c in stream.categories]
        clock, sequence = start, 0
        while True:
            clock += times.expovariate(1.0 / every)
            at = round(clock, 3)
            if at >= end:
                break
            category = which.choices(stream.categories, weights)[0]
            values: dict[str, Any] = {
                "notice": category.notice,
                "factor": category.factor,
                "exit_code": category.exit_code,
            }
            if category.kind in (
                FaultKind.GPU_ERROR,
                FaultKind.WORKER_CRASH,
                FaultKind.WORKER_HANG,
            ):
                values["local_rank"] = ranks.randrange(cluster.nproc_per_node)
            if category.kind is FaultKind.WORKER_CRASH and values["exit_code"] is None:
                values["exit_code"] = 1
            if category.repair is not None:
                # a duration of 0 (an exponential draw rounded down) means no fault at all
                values[_REPAIR_FIELD[category.kind]] = max(category.repair.draw(repairs), 0.001)
            template = RateFault(kind=category.kind, every=every, category=category.name, **values)
            out.append((at, stream_name, sequence, template))
            sequence += 1
    return out
