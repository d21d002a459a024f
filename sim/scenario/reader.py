"""The scenario reader: YAML text → a validated :class:`~sim.scenario.model.Scenario`.

The text goes through the schema walker (:mod:`sim.scenario.walker`: PyYAML's composer,
never a constructor, then typed readers over the node tree); every mapping is checked for
unknown and duplicate keys first, every scalar is converted by a reader that knows what it
expects.  The first problem found raises :class:`elastic.errors.ConfigError` naming the
file and line, the dotted key, the value seen and what was expected.  Nothing else escapes
the loader: YAML syntax errors, odd tags, deep nesting, oversized files and non-UTF-8 bytes
all become a :class:`ConfigError`.  The limits it applies are :mod:`sim.scenario.limits`.

The keys each section takes are the tables below (``TOP_KEYS``, ``SECTIONS``); what each
fault kind takes is :data:`sim.scenario.model.KIND_FIELDS`, read through
:func:`param_reader`.  Faults given as rates (``{kind: worker_crash, every: 3h}``) stay rates
in the :class:`Scenario`; :func:`sim.scenario.expand.expand_faults` draws them.

Every check runs in time linear in the input (duplicates through sets, node bounds
through prefix sums).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from elastic.errors import ConfigError
from sim.durations import DURATION_EXPECTED, format_duration
from sim.expect import COUNT_KEYS, EXPECT_KEYS, SECONDS_KEYS, Bound, Expectation, ExpectedState
from sim.scenario.limits import (
    MAX_EXPANDED_FAULTS,
    MAX_FACTOR,
    MAX_FAULTS,
    MAX_NODES,
    MAX_NPROC,
    MAX_SCENARIO_BYTES,
    MAX_WORKERS,
    MIN_RDZV_TIMEOUT,
)
from sim.scenario.model import (
    DEFAULT_UNTIL,
    FIELD_DEFAULTS,
    KIND_FIELDS,
    Agent,
    Cluster,
    Fault,
    FaultKind,
    Job,
    Need,
    RateFault,
    RendezvousBackendName,
    RendezvousSpec,
    Scenario,
    StoreSpec,
)
from sim.scenario.walker import (
    LOADER,
    TAG,
    AnyInt,
    Choice,
    Ctx,
    Duration,
    Int,
    Map,
    NodeList,
    Reader,
    Real,
    Text,
    check_depth,
    describe_node,
    show,
)

__all__ = [
    "RDZV_TIMEOUT",
    "SECTIONS",
    "TOP_KEYS",
    "load_scenario",
    "load_scenario_text",
    "param_reader",
]


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario file at ``path``; raise :class:`ConfigError` if bad."""
    source = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SCENARIO_BYTES + 1)
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigError(source, f"cannot read the scenario file: {reason}") from None
    if len(data) > MAX_SCENARIO_BYTES:
        raise ConfigError(
            source, f"the file is larger than {MAX_SCENARIO_BYTES} bytes; expected a scenario"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ConfigError(
            f"{source}:{line}", f"byte {data[error.start]:#04x} is not UTF-8; expected UTF-8 text"
        ) from None
    return load_scenario_text(text, name=source)


def load_scenario_text(text: str, name: str = "<string>") -> Scenario:
    """Validate scenario ``text``; ``name`` is the file name used in error messages."""
    if len(text) > MAX_SCENARIO_BYTES:
        raise ConfigError(
            name, f"the text is longer than {MAX_SCENARIO_BYTES} characters; expected a scenario"
        )
    try:
        check_depth(text, name)
        root = yaml.compose(text, Loader=LOADER)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(p for p in (error.context, error.problem) if p)
        raise ConfigError(f"{name}:{line}", f"YAML syntax error: {what}") from None
    except yaml.reader.ReaderError as error:
        line = text[: error.position].count("\n") + 1
        code = error.character if isinstance(error.character, int) else ord(error.character)
        raise ConfigError(
            f"{name}:{line}",
            f"got the character U+{code:04X}, which YAML does not allow; expected printable text",
        ) from None
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"{name}:1", f"YAML error: {first}") from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == TAG + "null"):
        raise ConfigError(
            f"{name}:1",
            "the file is empty; expected a scenario mapping with at least cluster: and job:",
        )
    return _ScenarioReader(Ctx(name)).read(root)


TOP_KEYS = (
    "name",
    "description",
    "seed",
    "until",
    "cluster",
    "job",
    "agent",
    "rendezvous",
    "store",
    "faults",
    "failures",
    "expect",
    "calibration",
)
_CLUSTER_KEYS = ("nodes", "nproc_per_node", "spare_nodes")
_JOB_KEYS = (
    "steps",
    "step_time",
    "startup_time",
    "checkpoint_every",
    "checkpoint_time",
    "collective_timeout",
    "timer",
    "hang_timeout",
    "preload_saves",
)
_AGENT_KEYS = ("max_restarts", "monitor_interval", "exit_barrier_timeout", "shutdown_timeout")
_RDZV_KEYS = (
    "backend",
    "min_nodes",
    "max_nodes",
    "join_timeout",
    "last_call_timeout",
    "heartbeat_timeout",
    "close_timeout",
)
_STORE_KEYS = ("latency",)
SECTIONS = {
    "cluster": _CLUSTER_KEYS,
    "job": _JOB_KEYS,
    "agent": _AGENT_KEYS,
    "rendezvous": _RDZV_KEYS,
    "store": _STORE_KEYS,
}


def _homes(here: str) -> dict[str, str]:
    """Keys of the other sections (and top-level sections), mapped to where they belong."""
    homes: dict[str, str] = {}
    for section, keys in SECTIONS.items():
        if section != here:
            for key in keys:
                homes.setdefault(key, f"under {section}:")
    for key in TOP_KEYS:
        if here:
            homes.setdefault(key, "at the top level")
    return homes


@dataclass(frozen=True, slots=True)
class _NodeRef:
    """A node index a fault names, kept to check once all node_join faults are known."""

    index: int
    at: float | None  # None for a rate fault: it may fire at any time in its window
    value: int
    node: yaml.Node
    path: str


class _ScenarioReader:
    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    def read(self, root: yaml.Node) -> Scenario:
        top = Map(self.ctx, root, "", "a mapping of scenario keys (" + ", ".join(TOP_KEYS) + ")")
        top.check_keys(TOP_KEYS, "one of", _homes(""))
        source = self.ctx.source
        default_name = "unnamed" if source.startswith("<") else Path(source).stem
        name = top.get("name", Text(), default_name)
        description = top.get("description", Text(), "")
        seed = top.get("seed", Int(0, 2**64), 0)
        until = top.get("until", Duration(positive=True), DEFAULT_UNTIL)
        cluster = self._cluster(top)
        job = self._job(top)
        agent = self._agent(top)
        store = self._store(top)
        rendezvous = self._rendezvous(top, cluster)
        faults = self._faults(top, cluster, rendezvous, until)
        failures = None
        failures_node = top.value_node("failures")
        if failures_node is not None:
            from sim.failures import read_failures  # it imports param_reader from here

            failures = read_failures(self.ctx, failures_node, cluster, until)
        expect = self._expect(top)
        calibration = top.get("calibration", Text(), "")
        return Scenario(
            name=name,
            description=description,
            seed=seed,
            until=until,
            cluster=cluster,
            job=job,
            agent=agent,
            rendezvous=rendezvous,
            store=store,
            faults=faults,
            expect=expect,
            source=source,
            calibration=calibration,
            failures=failures,
        )

    def _section(self, top: Map, key: str, required: bool) -> Map | None:
        keys = SECTIONS[key]
        section = top.section(key, f"a mapping with keys {', '.join(keys)}")
        if section is None:
            if required:
                raise self.ctx.error(
                    top.node, key, f"missing; expected a mapping with keys {', '.join(keys)}"
                )
            return None
        section.check_keys(keys, "one of", _homes(key))
        return section

    def _cluster(self, top: Map) -> Cluster:
        m = self._section(top, "cluster", required=True)
        assert m is not None  # required sections are never None
        cluster = Cluster(
            nodes=m.req("nodes", Int(1, MAX_NODES)),
            nproc_per_node=m.req("nproc_per_node", Int(1, MAX_NPROC)),
            spare_nodes=m.get("spare_nodes", Int(0, MAX_NODES), 0),
        )
        hosts = cluster.nodes + cluster.spare_nodes
        if hosts > MAX_NODES:
            raise self.ctx.error(
                m.line_of("spare_nodes"),
                m.sub("spare_nodes"),
                f"got {cluster.spare_nodes} with {cluster.nodes} nodes; expected at most "
                f"{MAX_NODES} nodes and spares in all",
            )
        if hosts * cluster.nproc_per_node > MAX_WORKERS:
            raise self.ctx.error(
                m.line_of("nproc_per_node"),
                m.sub("nproc_per_node"),
                f"got {cluster.nproc_per_node} with {hosts} nodes and spares, "
                f"{hosts * cluster.nproc_per_node} workers; expected at most {MAX_WORKERS}",
            )
        return cluster

    def _job(self, top: Map) -> Job:
        m = self._section(top, "job", required=True)
        assert m is not None
        startup_time = m.get("startup_time", Duration(), 0.0)
        preload_saves = m.opt("preload_saves", Duration())
        if preload_saves is not None and preload_saves > startup_time:
            raise self.ctx.error(
                m.line_of("preload_saves"),
                m.sub("preload_saves"),
                f"got {format_duration(preload_saves)}; expected at most the job's "
                f"startup_time ({format_duration(startup_time)}), the part a preload removes",
            )
        return Job(
            steps=m.req("steps", Int(1)),
            step_time=m.req("step_time", Duration(positive=True)),
            startup_time=startup_time,
            checkpoint_every=m.get("checkpoint_every", Int(0), 0),
            checkpoint_time=m.get("checkpoint_time", Duration(), 0.0),
            collective_timeout=m.get("collective_timeout", Duration(positive=True), 600.0),
            timer=m.opt("timer", Duration(positive=True)),
            hang_timeout=m.opt("hang_timeout", Duration(positive=True)),
            preload_saves=preload_saves,
        )

    def _agent(self, top: Map) -> Agent:
        m = self._section(top, "agent", required=False)
        if m is None:
            return Agent()
        return Agent(
            max_restarts=m.get("max_restarts", Int(0), 3),
            monitor_interval=m.get("monitor_interval", Duration(positive=True), 0.1),
            exit_barrier_timeout=m.get("exit_barrier_timeout", Duration(), 300.0),
            shutdown_timeout=m.get("shutdown_timeout", Duration(), 30.0),
        )

    def _store(self, top: Map) -> StoreSpec:
        m = self._section(top, "store", required=False)
        if m is None:
            return StoreSpec()
        return StoreSpec(latency=m.get("latency", Duration(), StoreSpec().latency))

    def _rendezvous(self, top: Map, cluster: Cluster) -> RendezvousSpec:
        m = self._section(top, "rendezvous", required=False)
        if m is None:
            return RendezvousSpec(min_nodes=cluster.nodes, max_nodes=cluster.nodes)
        backend = m.get("backend", Choice(RendezvousBackendName), RendezvousBackendName.C10D)
        given_min = m.opt("min_nodes", Int(1, MAX_NODES))
        given_max = m.opt("max_nodes", Int(1, MAX_NODES))
        if given_min is None:
            min_nodes = cluster.nodes if given_max is None else min(cluster.nodes, given_max)
        else:
            min_nodes = given_min
        max_nodes = max(cluster.nodes, min_nodes) if given_max is None else given_max
        if max_nodes < min_nodes:
            raise self.ctx.error(
                m.line_of("max_nodes"),
                m.sub("max_nodes"),
                f"got {max_nodes}; expected ≥ min_nodes ({min_nodes})",
            )
        if backend is RendezvousBackendName.STATIC:
            # max first: a max_nodes given alone also lowers the default min_nodes
            for key, value in (("max_nodes", max_nodes), ("min_nodes", min_nodes)):
                if value != cluster.nodes:
                    raise self.ctx.error(
                        m.line_of(key),
                        m.sub(key),
                        f"got {value}; expected {cluster.nodes} (cluster.nodes): a static "
                        "rendezvous has a fixed world; use backend: c10d for elastic sizes",
                    )
            if cluster.spare_nodes:
                raise self.ctx.error(
                    m.line_of("backend"),
                    m.sub("backend"),
                    f"got 'static'; expected c10d with cluster.spare_nodes "
                    f"{cluster.spare_nodes}: a static rendezvous has no room for spares",
                )
        return RendezvousSpec(
            backend=backend,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            join_timeout=m.get("join_timeout", RDZV_TIMEOUT, 600.0),
            last_call_timeout=m.get("last_call_timeout", RDZV_TIMEOUT, 30.0),
            heartbeat_timeout=m.get("heartbeat_timeout", RDZV_TIMEOUT, 15.0),
            close_timeout=m.get("close_timeout", RDZV_TIMEOUT, 30.0),
        )

    def _faults(
        self, top: Map, cluster: Cluster, rendezvous: RendezvousSpec, until: float
    ) -> tuple[Fault | RateFault, ...]:
        node = top.value_node("faults")
        if node is None:
            return ()
        if not isinstance(node, yaml.SequenceNode):
            raise self.ctx.error(
                node, "faults", f"got {describe_node(node)}; expected a list of faults"
            )
        if len(node.value) > MAX_FAULTS:
            raise self.ctx.error(
                node,
                "faults",
                f"got {len(node.value)} faults; expected at most {MAX_FAULTS} (use rate "
                "faults, every:, for many)",
            )
        faults: list[Fault | RateFault] = []
        refs: list[_NodeRef] = []
        expected_draws = 0.0
        joined_nodes = 0.0
        for index, item in enumerate(node.value):
            fault = self._fault(item, f"faults[{index}]", index, cluster, rendezvous, until, refs)
            if fault.kind is FaultKind.NODE_JOIN:
                draws = 1.0
                if isinstance(fault, RateFault):
                    end = until if fault.end is None else fault.end
                    draws = 2 * (end - fault.start) / fault.every  # the most expand draws
                joined_nodes += draws * (fault.count or 1)
                total = cluster.nodes + cluster.spare_nodes + joined_nodes
                if total > MAX_NODES:
                    raise self.ctx.error(
                        item,
                        f"faults[{index}]",
                        f"node_join faults bring the nodes that can exist to {total:.0f}; "
                        f"expected at most {MAX_NODES} in all",
                    )
            if isinstance(fault, RateFault):
                end = until if fault.end is None else fault.end
                expected_draws += (end - fault.start) / fault.every
                if expected_draws > MAX_EXPANDED_FAULTS:
                    every = Map(self.ctx, item, f"faults[{index}]", "").line_of("every")
                    raise self.ctx.error(
                        every,
                        f"faults[{index}].every",
                        f"got {show(format_duration(fault.every))}; the rate faults would draw "
                        f"about {expected_draws:.0f} faults; expected at most "
                        f"{MAX_EXPANDED_FAULTS} (raise every or narrow from/to)",
                    )
            faults.append(fault)
        self._check_nodes(faults, refs, cluster)
        return tuple(faults)

    def _fault(
        self,
        item: yaml.Node,
        path: str,
        index: int,
        cluster: Cluster,
        rendezvous: RendezvousSpec,
        until: float,
        refs: list[_NodeRef],
    ) -> Fault | RateFault:
        m = Map(self.ctx, item, path, "a fault mapping such as {at: 10m, kind: worker_crash, ...}")
        kind = m.req("kind", Choice(FaultKind))
        if kind is FaultKind.NODE_JOIN and rendezvous.backend is RendezvousBackendName.STATIC:
            raise self.ctx.error(
                m.line_of("kind"),
                m.sub("kind"),
                "got 'node_join'; expected no node_join with rendezvous.backend static "
                "(a static rendezvous has a fixed world; use c10d)",
            )
        params = KIND_FIELDS[kind]
        is_rate = "every" in m.entries
        if is_rate and "at" in m.entries:
            raise self.ctx.error(
                m.entries["at"][0],
                m.sub("at"),
                "given with every:; expected either at: (one fault at that time) or every: "
                "(faults drawn at that mean interval), not both",
            )
        timing = ("kind", "every", "from", "to") if is_rate else ("at", "kind")
        m.check_keys(
            (*timing, *params, "category"),
            f"a key of a {'rate ' if is_rate else ''}{kind.value} fault",
            {k: "to rate faults (with every:)" for k in ("from", "to")} if not is_rate else {},
        )
        if not is_rate and "at" not in m.entries:
            raise self.ctx.error(
                m.node, m.sub("at"), f"missing; expected {DURATION_EXPECTED} (or every: for a rate)"
            )
        at: float | None = None
        start, end, every = 0.0, None, 0.0
        if is_rate:
            every = m.req("every", Duration(positive=True))
            start = m.get("from", Duration(), 0.0)
            end = m.opt("to", Duration())
            last = until if end is None else end
            if end is not None and end > until:
                raise self.ctx.error(
                    m.line_of("to"),
                    m.sub("to"),
                    f"got {show(format_duration(end))}; expected ≤ until "
                    f"({format_duration(until)})",
                )
            if start >= last:
                raise self.ctx.error(
                    m.line_of("from"),
                    m.sub("from"),
                    f"got {show(format_duration(start))}; expected before "
                    f"{'to' if end is not None else 'until'} ({format_duration(last)})",
                )
        else:
            at = m.req("at", Duration())
            if at > until:
                raise self.ctx.error(
                    m.line_of("at"),
                    m.sub("at"),
                    f"got {show(format_duration(at))}; expected ≤ until "
                    f"({format_duration(until)}), when the simulation stops",
                )
        values: dict[str, Any] = {}
        for name, need in params.items():
            reader = param_reader(name, cluster)
            if need is Need.REQUIRED or (need is Need.TARGET and not is_rate):
                value = m.req(name, reader)
            else:
                value = m.opt(name, reader)
            if value is None and name in FIELD_DEFAULTS:
                value = FIELD_DEFAULTS[name]
            values[name] = value
        values["category"] = m.opt("category", Text())
        node_value = values.get("node")
        if isinstance(node_value, int):
            refs.append(_NodeRef(index, at, node_value, m.line_of("node"), m.sub("node")))
        nodes_value = values.get("nodes")
        if isinstance(nodes_value, tuple):
            nodes_node = m.line_of("nodes")
            for position, number in enumerate(nodes_value):
                assert isinstance(nodes_node, yaml.SequenceNode)
                refs.append(
                    _NodeRef(
                        index, at, number, nodes_node.value[position], f"{path}.nodes[{position}]"
                    )
                )
        if is_rate:
            return RateFault(kind=kind, every=every, start=start, end=end, **values)
        assert at is not None
        return Fault(at=at, kind=kind, **values)

    def _check_nodes(
        self, faults: Sequence[Fault | RateFault], refs: Sequence[_NodeRef], cluster: Cluster
    ) -> None:
        """Refuse node indices that never exist (or do not exist yet, for a timed fault)."""
        base = cluster.nodes + cluster.spare_nodes
        joins = sorted(
            (f.at, i, f.count or 1)
            for i, f in enumerate(faults)
            if isinstance(f, Fault) and f.kind is FaultKind.NODE_JOIN
        )
        # prefix sums over joins in (time, index) order: one bisect per reference, not a
        # pass over every join (quadratic in a file of many joins and references)
        keys = [(when, i) for when, i, _ in joins]
        before = [0]
        for _, _, count in joins:
            before.append(before[-1] + count)
        rate_join_starts = [
            f.start for f in faults if isinstance(f, RateFault) and f.kind is FaultKind.NODE_JOIN
        ]
        first_rate_join = min(rate_join_starts, default=None)
        all_joined = before[-1]
        for ref in refs:
            if ref.at is None:
                if rate_join_starts:
                    continue  # nodes brought by drawn joins are unknown until expansion
                joined, why = all_joined, "that can ever exist"
            else:
                if first_rate_join is not None and first_rate_join < ref.at:
                    continue
                joined = before[bisect.bisect_left(keys, (ref.at, ref.index))]
                why = f"that exist at {format_duration(ref.at)}"
            bound = base + joined
            if ref.value >= bound:
                raise self.ctx.error(
                    ref.node,
                    ref.path,
                    f"got {ref.value}; expected a node index from 0 to {bound - 1}, one of the "
                    f"nodes {why} (cluster.nodes {cluster.nodes} + spare_nodes "
                    f"{cluster.spare_nodes} + {joined} from node_join faults before it; "
                    "numbered from 0)",
                )

    def _expect(self, top: Map) -> Expectation:
        m = top.section("expect", "a mapping of expected report values")
        if m is None:
            return Expectation()
        m.check_keys(EXPECT_KEYS, "one of the report keys", {})
        values: dict[str, Any] = {}
        for key in EXPECT_KEYS:
            node = m.value_node(key)
            if node is None:
                continue
            path = m.sub(key)
            if key == "state":
                values[key] = Choice(ExpectedState).read(self.ctx, node, path)
                continue
            reader: Reader[float | int]
            if key in COUNT_KEYS:
                reader = Int(0)
            elif key in SECONDS_KEYS:
                reader = Duration()
            else:
                reader = Real(0.0, 1.0)  # goodput is a fraction of wall time
            values[key] = self._bound(node, path, reader)
        return Expectation(**values)

    def _bound(self, node: yaml.Node, path: str, reader: Reader[float | int]) -> Bound:
        if not isinstance(node, yaml.MappingNode):
            return Bound(exact=reader.read(self.ctx, node, path))
        m = Map(self.ctx, node, path, "")
        m.check_keys(("min", "max"), f"{reader.expected}, or a range with", {})
        low = m.opt("min", reader)
        high = m.opt("max", reader)
        if low is None and high is None:
            raise self.ctx.error(node, path, "got an empty range; expected min:, max: or both")
        if low is not None and high is not None and high < low:
            raise self.ctx.error(
                m.line_of("max"), m.sub("max"), f"got {high}; expected ≥ min ({low})"
            )
        return Bound(min=low, max=high)


RDZV_TIMEOUT = Duration(positive=True, least=MIN_RDZV_TIMEOUT)


def param_reader(name: str, cluster: Cluster) -> Reader[Any]:
    if name == "node":
        # the upper bound depends on node_join faults; _check_nodes applies it afterwards
        return Int(0, MAX_NODES)
    if name == "local_rank":
        return Int(0, cluster.nproc_per_node - 1)
    if name == "exit_code":
        return AnyInt()
    if name == "count":
        return Int(1, MAX_NODES)
    if name == "factor":
        return Real(1.0, MAX_FACTOR, lo_open=True)
    if name == "nodes":
        return NodeList()
    if name in ("restart_after", "notice"):
        return Duration()
    if name == "duration":
        return Duration(positive=True)
    raise AssertionError(f"no reader for fault field {name}")  # the table names only these
