"""Scenario files: load, validate and write back the YAML that describes a simulated run.

Theory of operation.  The text is parsed with PyYAML's composer (``yaml.compose`` with
``SafeLoader``, libyaml's when available, after a check of the nesting depth), which yields
a tree of nodes that still carry their line numbers, and never with a constructor that
could build arbitrary objects.  A small schema walker reads that tree
into frozen dataclasses: every mapping is checked for unknown and duplicate keys first, every
scalar is converted by a reader that knows what it expects.  The first problem found raises
:class:`elastic.errors.ConfigError` whose ``where`` is ``"<file>:<line>"`` and whose message
names the dotted key (``faults[1].kind``), the value seen and what was expected, e.g.::

    scenarios/x.yaml:14: faults[1].kind: got 'worker_crsh'; expected one of worker_crash, ...

Nothing else escapes the loader: YAML syntax errors, odd tags, deep nesting, oversized files
and non-UTF-8 bytes all become a :class:`ConfigError`.

The result is data for the simulator: durations are float seconds, defaults are filled in
(torch's, where torch has one), and ``Scenario.to_yaml()`` writes a scenario that loads back
equal.  Faults given as rates (``{kind: worker_crash, every: 3h}``) stay rates in the
:class:`Scenario`; :func:`expand_faults` turns them into timed faults, deterministically from
the "faults" random generator, so a random run can be written back as an explicit scenario
with ``scenario.with_faults(expand_faults(scenario, rng)).to_yaml()``.

Decisions worth knowing (see also the field docstrings):

- ``rendezvous.backend`` defaults to ``c10d`` (the dynamic rendezvous, which is the only one
  that handles every fault kind); files without a ``rendezvous:`` section get
  ``min_nodes = max_nodes = cluster.nodes``.  ``static`` needs ``min_nodes = max_nodes =
  nodes``, no spare nodes and no ``node_join`` faults.
- Nodes are numbered from 0: the ``cluster.nodes`` first, then the ``spare_nodes``, then
  nodes brought by ``node_join`` faults in time order.  A timed fault may name a node that
  exists by its time; a rate fault may name any node that can ever exist.
- A fault naming a node that is down when it fires is the runner's to ignore.

Limits (DESIGN §3; each refused with the file, line, key, value and the limit):

- the file: at most ``MAX_SCENARIO_BYTES`` (4 MiB), YAML nested at most 64 levels, at most
  ``MAX_YAML_NODES`` (300,000) scalars and collections in all — counted while the depth is
  checked, before the tree is built, so an oversized file is refused in well under a second;
- ``cluster``: at most ``MAX_NODES`` (10,000) nodes, spare nodes, min/max nodes, and nodes
  that can ever exist (with timed and drawn ``node_join`` counts); at most ``MAX_WORKERS``
  (100,000) workers (nodes and spares times ``nproc_per_node``, itself ≤ 4,096).  Measured:
  10,000 nodes of 8 workers simulate 100 steps in ≈11 s and ≈280 MB;
- ``faults``: at most ``MAX_FAULTS`` (10,000) entries, rate faults drawing at most
  ``MAX_EXPANDED_FAULTS`` (10,000) in expectation (twice that at most); a node list at
  most ``MAX_NODES`` long;
- numbers: integers (steps, counts, restarts…) at most 10¹², seeds at most 2⁶⁴, exit codes within
  ±2³¹; durations at most ``MAX_SECONDS`` (100 years); rendezvous timeouts at least 1 s
  (torch reads them as whole seconds, so a ``1ms`` timeout would be 0); ``slow_node``
  factors at most 10⁶.

Every check runs in time linear in the input (duplicates through sets, node bounds
through prefix sums).
"""

from __future__ import annotations

import bisect
import difflib
import enum
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import yaml

from elastic.errors import ConfigError
from sim.durations import DURATION_EXPECTED, format_duration, parse_duration
from sim.expect import COUNT_KEYS, EXPECT_KEYS, SECONDS_KEYS, Bound, Expectation, ExpectedState

__all__ = [
    "DEFAULT_UNTIL",
    "MAX_EXPANDED_FAULTS",
    "MAX_FAULTS",
    "MAX_NODES",
    "MAX_SCENARIO_BYTES",
    "MAX_SECONDS",
    "MAX_WORKERS",
    "MAX_YAML_NODES",
    "Agent",
    "Cluster",
    "Fault",
    "FaultKind",
    "Job",
    "RateFault",
    "Rendezvous",
    "RendezvousBackend",
    "Scenario",
    "Store",
    "expand_faults",
    "fault_rng",
    "load_scenario",
    "load_scenario_text",
]

#: A scenario file larger than this is refused before parsing (DESIGN §3: size limits).
MAX_SCENARIO_BYTES = 4 << 20
#: Rate faults may draw at most this many faults per run in expectation (twice that at most),
#: so that the run written back as an explicit scenario stays under MAX_SCENARIO_BYTES.
MAX_EXPANDED_FAULTS = 10_000
#: The simulation gives up at this simulated time unless ``until:`` says otherwise.
DEFAULT_UNTIL = 7 * 86400.0

# Upper bounds that keep a typo (an extra zero or ten) from building a simulation that
# cannot fit in memory or time (see "Limits" above).
MAX_NODES = 10_000
MAX_WORKERS = 100_000
MAX_FAULTS = 10_000
MAX_YAML_NODES = 300_000
MAX_SECONDS = 100 * 365.25 * 86400.0
_MAX_NODES = MAX_NODES
_MAX_NPROC = 4096
_MAX_INT = 10**12
_MAX_EXIT = 2**31
_MAX_FACTOR = 1e6
_MIN_RDZV_TIMEOUT = 1.0

# libyaml's parser (when PyYAML was built with it) is about 7x faster than the pure-Python
# one.  Its composer recurses in C with no depth limit and crashes the process on ~100k
# nested brackets, so _check_depth walks the parser's events (produced iteratively) first.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER_BASE: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class FaultKind(enum.StrEnum):
    """The faults a scenario can inject (DESIGN §5)."""

    WORKER_CRASH = "worker_crash"
    WORKER_HANG = "worker_hang"
    NODE_CRASH = "node_crash"
    NODE_JOIN = "node_join"
    NODE_LEAVE = "node_leave"
    PREEMPTION = "preemption"
    STORE_OUTAGE = "store_outage"
    NETWORK_PARTITION = "network_partition"
    SLOW_NODE = "slow_node"
    GPU_ERROR = "gpu_error"


class RendezvousBackend(enum.StrEnum):
    """The rendezvous the simulated agents use (torchrun's ``--rdzv-backend`` names)."""

    C10D = "c10d"
    STATIC = "static"


@dataclass(frozen=True, slots=True)
class Cluster:
    """The machines: ``nodes`` start with the job, ``spare_nodes`` start too and wait."""

    nodes: int
    nproc_per_node: int
    spare_nodes: int = 0


@dataclass(frozen=True, slots=True)
class Job:
    """The model of a worker.  Durations are seconds; ``checkpoint_every`` 0 means never.

    ``timer``: each step runs inside ``expires(after=timer)``, so a hung worker is reaped by
    the timer server.  ``hang_timeout``: progress-heartbeat hang detection.  Both off if None.
    ``preload_saves``: how much of ``startup_time`` ``elastic run --preload`` removes from
    every start of the workers (None: not said; a calibration file may supply it, see
    :mod:`sim.calibration`; else 0).
    """

    steps: int
    step_time: float
    startup_time: float = 0.0
    checkpoint_every: int = 0
    checkpoint_time: float = 0.0
    collective_timeout: float = 600.0
    timer: float | None = None
    hang_timeout: float | None = None
    preload_saves: float | None = None


@dataclass(frozen=True, slots=True)
class Agent:
    """Agent settings, with torch 2.13's defaults (``SimpleElasticAgent``, ``torchrun``)."""

    max_restarts: int = 3
    monitor_interval: float = 0.1
    exit_barrier_timeout: float = 300.0
    shutdown_timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Rendezvous settings; the timeouts default to torch's dynamic rendezvous.

    ``heartbeat_timeout`` is how long a silent node stays a member: torch drops a node after
    ``keep_alive_interval`` 5 s times ``keep_alive_max_attempt`` 3 = 15 s, our lease TTL.
    """

    min_nodes: int
    max_nodes: int
    backend: RendezvousBackend = RendezvousBackend.C10D
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    heartbeat_timeout: float = 15.0
    close_timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class Store:
    """The simulated store host: one-way latency of every operation, in seconds."""

    latency: float = 0.001


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault at a fixed time ``at`` (seconds).  Fields that do not apply to ``kind`` are None.

    ``exit_code`` (worker_crash) and ``count`` (node_join) are always filled in (default 1).
    ``restart_after`` None: the node never comes back.  ``duration`` None for slow_node:
    slow until the end.  ``local_rank`` None for gpu_error: the whole node's GPUs.
    """

    at: float
    kind: FaultKind
    node: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    restart_after: float | None = None
    count: int | None = None
    notice: float | None = None
    duration: float | None = None
    nodes: tuple[int, ...] | None = None
    factor: float | None = None


@dataclass(frozen=True, slots=True)
class RateFault:
    """Faults drawn at random: exponential gaps of mean ``every`` within [``start``, ``end``).

    ``end`` None means until the scenario's ``until``.  Target fields left None (``node``,
    ``local_rank``, ``nodes``) are drawn uniformly per occurrence by :func:`expand_faults`.
    """

    kind: FaultKind
    every: float
    start: float = 0.0
    end: float | None = None
    node: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    restart_after: float | None = None
    count: int | None = None
    notice: float | None = None
    duration: float | None = None
    nodes: tuple[int, ...] | None = None
    factor: float | None = None


# Names shared by Fault and RateFault after their timing fields, in the order they are written.
_PARAM_FIELDS = (
    "node",
    "local_rank",
    "exit_code",
    "restart_after",
    "count",
    "notice",
    "duration",
    "nodes",
    "factor",
)


class _Need(enum.Enum):
    REQUIRED = "required"
    OPTIONAL = "optional"
    # required in a timed fault; drawn uniformly per occurrence in a rate fault
    TARGET = "target"


# What each fault kind takes (a table, not ifs: adding a kind is one line here).
_KIND_FIELDS: dict[FaultKind, dict[str, _Need]] = {
    FaultKind.WORKER_CRASH: {
        "node": _Need.TARGET,
        "local_rank": _Need.TARGET,
        "exit_code": _Need.OPTIONAL,
    },
    FaultKind.WORKER_HANG: {"node": _Need.TARGET, "local_rank": _Need.TARGET},
    FaultKind.NODE_CRASH: {"node": _Need.TARGET, "restart_after": _Need.OPTIONAL},
    FaultKind.NODE_JOIN: {"count": _Need.OPTIONAL},
    FaultKind.NODE_LEAVE: {"node": _Need.TARGET},
    FaultKind.PREEMPTION: {"node": _Need.TARGET, "notice": _Need.REQUIRED},
    FaultKind.STORE_OUTAGE: {"duration": _Need.REQUIRED},
    FaultKind.NETWORK_PARTITION: {"nodes": _Need.TARGET, "duration": _Need.REQUIRED},
    FaultKind.SLOW_NODE: {
        "node": _Need.TARGET,
        "factor": _Need.REQUIRED,
        "duration": _Need.OPTIONAL,
    },
    FaultKind.GPU_ERROR: {
        "node": _Need.TARGET,
        "local_rank": _Need.OPTIONAL,
        "restart_after": _Need.OPTIONAL,
    },
}
_FIELD_DEFAULTS: dict[str, int] = {"exit_code": 1, "count": 1}


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario; build it with :func:`load_scenario` or :func:`load_scenario_text`.

    ``faults`` keeps the file's order, timed and rate faults mixed.  ``source`` (the file it
    came from) is not part of equality, so a scenario written out and read back is equal.
    """

    name: str
    cluster: Cluster
    job: Job
    rendezvous: Rendezvous
    seed: int = 0
    until: float = DEFAULT_UNTIL
    description: str = ""
    agent: Agent = field(default_factory=Agent)
    store: Store = field(default_factory=Store)
    faults: tuple[Fault | RateFault, ...] = ()
    expect: Expectation = field(default_factory=Expectation)
    source: str = field(default="<string>", compare=False)
    # a calibration file (``elastic calibrate``), as written in the scenario; relative to
    # the scenario's directory (see :mod:`sim.calibration`)
    calibration: str = ""

    def with_seed(self, seed: int) -> Scenario:
        """This scenario with another seed (``elastic sim --seed``); refuses a negative seed."""
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError("--seed", f"got {seed!r}; expected an integer ≥ 0")
        return replace(self, seed=seed)

    def with_faults(self, faults: Iterable[Fault | RateFault]) -> Scenario:
        """This scenario with ``faults`` instead (e.g. the output of :func:`expand_faults`)."""
        return replace(self, faults=tuple(faults))

    @property
    def has_rate_faults(self) -> bool:
        """Whether some faults are drawn at random (so the run depends on the seed's draws)."""
        return any(isinstance(f, RateFault) for f in self.faults)

    def to_dict(self) -> dict[str, Any]:
        """The scenario in the file's schema (plain dicts, lists, str and numbers)."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["seed"] = self.seed
        out["until"] = format_duration(self.until)
        out["cluster"] = {
            "nodes": self.cluster.nodes,
            "nproc_per_node": self.cluster.nproc_per_node,
            "spare_nodes": self.cluster.spare_nodes,
        }
        job: dict[str, Any] = {
            "steps": self.job.steps,
            "step_time": format_duration(self.job.step_time),
            "startup_time": format_duration(self.job.startup_time),
            "checkpoint_every": self.job.checkpoint_every,
            "checkpoint_time": format_duration(self.job.checkpoint_time),
            "collective_timeout": format_duration(self.job.collective_timeout),
        }
        if self.job.timer is not None:
            job["timer"] = format_duration(self.job.timer)
        if self.job.hang_timeout is not None:
            job["hang_timeout"] = format_duration(self.job.hang_timeout)
        if self.job.preload_saves is not None:
            job["preload_saves"] = format_duration(self.job.preload_saves)
        out["job"] = job
        out["agent"] = {
            "max_restarts": self.agent.max_restarts,
            "monitor_interval": format_duration(self.agent.monitor_interval),
            "exit_barrier_timeout": format_duration(self.agent.exit_barrier_timeout),
            "shutdown_timeout": format_duration(self.agent.shutdown_timeout),
        }
        rdzv = self.rendezvous
        out["rendezvous"] = {
            "backend": rdzv.backend.value,
            "min_nodes": rdzv.min_nodes,
            "max_nodes": rdzv.max_nodes,
            "join_timeout": format_duration(rdzv.join_timeout),
            "last_call_timeout": format_duration(rdzv.last_call_timeout),
            "heartbeat_timeout": format_duration(rdzv.heartbeat_timeout),
            "close_timeout": format_duration(rdzv.close_timeout),
        }
        out["store"] = {"latency": format_duration(self.store.latency)}
        if self.calibration:
            out["calibration"] = self.calibration
        out["faults"] = [_fault_to_dict(f) for f in self.faults]
        expect: dict[str, Any] = {}
        for key, wanted in self.expect.items():
            if isinstance(wanted, ExpectedState):
                expect[key] = wanted.value
            elif wanted.exact is not None:
                expect[key] = wanted.exact
            else:
                expect[key] = {
                    k: v for k, v in (("min", wanted.min), ("max", wanted.max)) if v is not None
                }
        out["expect"] = expect
        return out

    def to_yaml(self) -> str:
        """The scenario as YAML that :func:`load_scenario_text` reads back equal."""
        data = self.to_dict()
        # one fault (and one range) per line reads like the hand-written files
        data["faults"] = [_FlowDict(f) for f in data["faults"]]
        data["expect"] = {
            k: _FlowDict(v) if isinstance(v, dict) else v for k, v in data["expect"].items()
        }
        for allow_unicode in (True, False):
            text = yaml.dump(
                data,
                Dumper=_ScenarioDumper,
                sort_keys=False,
                default_flow_style=False,
                allow_unicode=allow_unicode,
                width=100,
            )
            # PyYAML writes some characters (NEL U+0085, U+2028) raw that read back as line
            # breaks; escaping all non-ASCII is the exact fallback
            if yaml.load(text, Loader=_LOADER) == data:
                break
        return text


class _FlowDict(dict[str, Any]):
    """A mapping written in flow style (``{at: 10m, kind: worker_crash}``)."""


def _represent_flow(dumper: yaml.SafeDumper, data: _FlowDict) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    # short lists of scalars (network_partition nodes) stay on one line
    flow = all(not isinstance(item, dict | list) for item in data) and bool(data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


# a SafeDumper (libyaml's when available) writing _FlowDict in flow style, lists as in
# the examples; built with type() because its base is chosen at import time
_ScenarioDumper: Any = type("_ScenarioDumper", (_DUMPER_BASE,), {})
_ScenarioDumper.add_representer(_FlowDict, _represent_flow)
_ScenarioDumper.add_representer(list, _represent_list)


def _fault_to_dict(fault: Fault | RateFault) -> dict[str, Any]:
    out: dict[str, Any]
    if isinstance(fault, Fault):
        out = {"at": format_duration(fault.at), "kind": fault.kind.value}
    else:
        out = {"kind": fault.kind.value, "every": format_duration(fault.every)}
        if fault.start:
            out["from"] = format_duration(fault.start)
        if fault.end is not None:
            out["to"] = format_duration(fault.end)
    for name in _PARAM_FIELDS:
        value = getattr(fault, name)
        if value is None:
            continue
        if name == "nodes":
            value = list(value)
        elif name in ("restart_after", "notice", "duration"):
            value = format_duration(value)
        out[name] = value
    return out


# ---------------------------------------------------------------------------- loading


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
        _check_depth(text, name)
        root = yaml.compose(text, Loader=_LOADER)
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
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _TAG + "null"):
        raise ConfigError(
            f"{name}:1",
            "the file is empty; expected a scenario mapping with at least cluster: and job:",
        )
    return _ScenarioReader(_Ctx(name)).read(root)


#: A scenario nests about four levels (faults → fault → nodes); this is far above that.
_MAX_DEPTH = 64


def _check_depth(text: str, name: str) -> None:
    """Refuse YAML nested deeper than :data:`_MAX_DEPTH` before any recursive composing."""
    depth = 0
    count = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent | yaml.AliasEvent):
            count += 1
            if count > MAX_YAML_NODES:
                line = event.start_mark.line + 1 if event.start_mark is not None else 1
                raise ConfigError(
                    f"{name}:{line}",
                    f"the YAML holds more than {MAX_YAML_NODES} values; expected a scenario "
                    f"(at most {MAX_FAULTS} faults and {MAX_NODES} nodes)",
                )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > _MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark is not None else 1
                raise ConfigError(
                    f"{name}:{line}",
                    f"the YAML nests more than {_MAX_DEPTH} levels deep; expected a scenario "
                    "mapping a few levels deep",
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


# ---------------------------------------------------------------------------- the walker

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {_TAG + t for t in ("null", "bool", "int", "float", "str")}


class _Ctx:
    """Where we are reading from, and the scalar constructor (safe tags only)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._constructor = yaml.SafeLoader("")

    def where(self, node: yaml.Node) -> str:
        return f"{self.source}:{node.start_mark.line + 1}"

    def error(self, node: yaml.Node, path: str, message: str) -> ConfigError:
        return ConfigError(self.where(node), f"{path}: {message}")

    def scalar(self, node: yaml.Node, path: str, expected: str) -> object:
        """The Python value of a scalar node: None, bool, int, float or str; else an error."""
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, path, f"got {_describe_node(node)}; expected {expected}")
        if node.tag not in _PLAIN_TAGS:
            shown = node.tag.removeprefix(_TAG)
            raise self.error(
                node, path, f"got a {shown} value {_show(node.value)}; expected {expected}"
            )
        try:
            value = self._constructor.construct_object(node, deep=True)
        except (ValueError, TypeError, ArithmeticError, yaml.YAMLError):
            # an explicit tag on a value it cannot convert, e.g. `!!int abc`
            raise self.error(
                node, path, f"got {_show(node.value)} tagged {node.tag}; expected {expected}"
            ) from None
        if isinstance(value, int | float) and ":" in node.value:
            # YAML 1.1 reads 1:30 as the base-60 number 90, which nobody means in a scenario
            raise self.error(
                node,
                path,
                f"got {node.value}, which YAML reads as the base-60 number {value}; "
                f"expected {expected}",
            )
        return value


def _describe_node(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return _show(node.value)


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Reader(Protocol[T_co]):
    @property
    def expected(self) -> str: ...

    def read(self, ctx: _Ctx, node: yaml.Node, path: str) -> T_co: ...


@dataclass(frozen=True, slots=True)
class _Int:
    lo: int = 0
    hi: int | None = _MAX_INT

    @property
    def expected(self) -> str:
        big = {_MAX_INT: "10**12", 2**64: "2**64"}.get(self.hi or 0)
        if big is not None:
            return f"an integer ≥ {self.lo} (at most {big})"
        if self.hi is not None:
            return f"an integer from {self.lo} to {self.hi}"
        return f"an integer ≥ {self.lo}"

    def read(self, ctx: _Ctx, node: yaml.Node, path: str) -> int:
        value = _read_int(ctx, node, path, self.expected)
        if value < self.lo or (self.hi is not None and value > self.hi):
            raise ctx.error(node, path, f"got {_show(value)}; expected {self.expected}")
        return value


@dataclass(frozen=True, slots=True)
class _AnyInt:
    @property
    def expected(self) -> str:
        return "an integer"

    def read(self, ctx: _Ctx, node: yaml.Node, path: str) -> int:
        value = _read_int(ctx, node, path, self.expected)
        if not -_MAX_EXIT <= value < _MAX_EXIT:
            raise ctx.error(node, path, f"got {_show(value)}; expected an integer within ±2**31")
        return value


def _read_int(ctx: _Ctx, node: yaml.Node, path: str, expected: str) -> int:
    value = ctx.scalar(node, path, expected)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ctx.error(node, path, f"got {_show(value)}; expected {expected}")
    return value


@dataclass(frozen=True, slots=True)
class _Real:
    """A finite number in [lo, hi], or (lo, hi] when ``lo_open``."""

    lo: float = 0.0
    hi: float | None = None
    lo_open: bool = False

    @property
    def expected(self) -> str:
        low = f"> {self.lo:g}" if self.lo_open else f"≥ {self.lo:g}"
        if self.hi is not None:
            return f"a number {low} and ≤ {self.hi:g}"
        return f"a number {low}"

    def read(self, ctx: _Ctx, node: yaml.Node, path: str) -> float:
        value = ctx.scalar(node, path, self.expected)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ctx.error(node, path, f"got {_show(value)}; expected {self.expected}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        too_low = number <= self.lo if self.lo_open else number < self.lo
        if not math.isfinite(number) or too_low or (self.hi is not None and number > self.hi):
            raise ctx.error(node, path, f"got {_show(value)}; expected {self.expected}")
        return number


@dataclass(frozen=True, slots=True)
class _Duration:
    positive: bool = False
    least: float = 0.0  # seconds; > 0 for the rendezvous timeouts (whole seconds in torch)

    @property
    def expected(self) -> str:
        if self.least:
            low = f", at least {format_duration(self.least)}"
        else:
            low = ", greater than 0" if self.positive else ""
        return f"{DURATION_EXPECTED}{low}, at most 100 years"

    def read(self, ctx: _Ctx, node: yaml.Node, path: str) -> float:
        value = ctx.scalar(node, path, self.expected)
        try:
            seconds = parse_duration(value)
        except ValueError as error:
            raise ctx.error(node, path, f"got {_show(value)}; {error}") from None
        if (self.positive and seconds == 0) or seconds < self.least or seconds > MAX_SECONDS:
            raise ctx.error(node, path, f"got {_show(value)}; expected {self.expected}")
        return seconds


@dataclass(frozen=True, slots=True)
class _Text:
    @property
    def expected(self) -> str:
        return "a string"

    def read(self, ctx: _Ctx, node: yaml.Node, path: str) -> str:
        value = ctx.scalar(node, path, self.expected)
        if not isinstance(value, str):
            raise ctx.error(node, path, f"got {_show(value)}; expected {self.expected}")
        return value


E = TypeVar("E", bound=enum.StrEnum)


@dataclass(frozen=True, slots=True)
class _Choice(Generic[E]):
    choices: type[E]

    @property
    def expected(self) -> str:
        return "one of " + ", ".join(c.value for c in self.choices)

    def read(self, ctx: _Ctx, node: yaml.Node, path: str) -> E:
        value = ctx.scalar(node, path, self.expected)
        for choice in self.choices:
            if value == choice.value:
                return choice
        raise ctx.error(node, path, f"got {_show(value)}; expected {self.expected}")


_MISSING: Any = object()


class _Map:
    """A mapping node being read: keys indexed once, unknown and duplicate keys refused."""

    def __init__(self, ctx: _Ctx, node: yaml.Node, path: str, expected: str) -> None:
        self.ctx = ctx
        self.node = node
        self.path = path
        if not isinstance(node, yaml.MappingNode):
            label = path or "top level"
            raise ctx.error(node, label, f"got {_describe_node(node)}; expected {expected}")
        self.entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key_node.tag != _TAG + "str" or not isinstance(key, str):
                shown = _describe_node(key_node) if key is None else _show(key)
                raise ctx.error(
                    key_node, path or "top level", f"got key {shown}; expected {expected}"
                )
            if key in self.entries:
                first = self.entries[key][0].start_mark.line + 1
                raise ctx.error(
                    key_node, self.sub(key), f"duplicate key (first given on line {first})"
                )
            self.entries[key] = (key_node, value_node)

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def check_keys(self, allowed: Sequence[str], what: str, elsewhere: dict[str, str]) -> None:
        """Refuse the first key not in ``allowed``, suggesting the closest one or its home."""
        for key, (key_node, _) in self.entries.items():
            if key in allowed:
                continue
            parts = [f"unknown key {_show(key)}"]
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            if key in elsewhere:
                parts.append(f"it belongs {elsewhere[key]}")
            elif close:
                parts.append(f"did you mean {close[0]!r}?")
            parts.append(f"expected {what}: {', '.join(allowed)}")
            raise self.ctx.error(key_node, self.sub(key), "; ".join(parts))

    def value_node(self, key: str) -> yaml.Node | None:
        """The value's node, or None if the key is absent or null (null means "use the default")."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        value = entry[1]
        if isinstance(value, yaml.ScalarNode) and value.tag == _TAG + "null":
            return None
        return value

    def req(self, key: str, reader: _Reader[T]) -> T:
        node = self.value_node(key)
        if node is None:
            raise self.ctx.error(self.node, self.sub(key), f"missing; expected {reader.expected}")
        return reader.read(self.ctx, node, self.sub(key))

    def opt(self, key: str, reader: _Reader[T]) -> T | None:
        node = self.value_node(key)
        return None if node is None else reader.read(self.ctx, node, self.sub(key))

    def get(self, key: str, reader: _Reader[T], default: T) -> T:
        value = self.opt(key, reader)
        return default if value is None else value

    def section(self, key: str, expected: str) -> _Map | None:
        node = self.value_node(key)
        return None if node is None else _Map(self.ctx, node, self.sub(key), expected)

    def line_of(self, key: str) -> yaml.Node:
        """The node to blame for ``key``: its value if given, else the whole mapping."""
        return self.value_node(key) or self.node


_TOP_KEYS = (
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
_SECTIONS = {
    "cluster": _CLUSTER_KEYS,
    "job": _JOB_KEYS,
    "agent": _AGENT_KEYS,
    "rendezvous": _RDZV_KEYS,
    "store": _STORE_KEYS,
}


def _homes(here: str) -> dict[str, str]:
    """Keys of the other sections (and top-level sections), mapped to where they belong."""
    homes: dict[str, str] = {}
    for section, keys in _SECTIONS.items():
        if section != here:
            for key in keys:
                homes.setdefault(key, f"under {section}:")
    for key in _TOP_KEYS:
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
    def __init__(self, ctx: _Ctx) -> None:
        self.ctx = ctx

    def read(self, root: yaml.Node) -> Scenario:
        top = _Map(self.ctx, root, "", "a mapping of scenario keys (" + ", ".join(_TOP_KEYS) + ")")
        top.check_keys(_TOP_KEYS, "one of", _homes(""))
        source = self.ctx.source
        default_name = "unnamed" if source.startswith("<") else Path(source).stem
        name = top.get("name", _Text(), default_name)
        description = top.get("description", _Text(), "")
        seed = top.get("seed", _Int(0, 2**64), 0)
        until = top.get("until", _Duration(positive=True), DEFAULT_UNTIL)
        cluster = self._cluster(top)
        job = self._job(top)
        agent = self._agent(top)
        store = self._store(top)
        rendezvous = self._rendezvous(top, cluster)
        faults = self._faults(top, cluster, rendezvous, until)
        expect = self._expect(top)
        calibration = top.get("calibration", _Text(), "")
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
        )

    def _section(self, top: _Map, key: str, required: bool) -> _Map | None:
        keys = _SECTIONS[key]
        section = top.section(key, f"a mapping with keys {', '.join(keys)}")
        if section is None:
            if required:
                raise self.ctx.error(
                    top.node, key, f"missing; expected a mapping with keys {', '.join(keys)}"
                )
            return None
        section.check_keys(keys, "one of", _homes(key))
        return section

    def _cluster(self, top: _Map) -> Cluster:
        m = self._section(top, "cluster", required=True)
        assert m is not None  # required sections are never None
        cluster = Cluster(
            nodes=m.req("nodes", _Int(1, _MAX_NODES)),
            nproc_per_node=m.req("nproc_per_node", _Int(1, _MAX_NPROC)),
            spare_nodes=m.get("spare_nodes", _Int(0, _MAX_NODES), 0),
        )
        hosts = cluster.nodes + cluster.spare_nodes
        if hosts > _MAX_NODES:
            raise self.ctx.error(
                m.line_of("spare_nodes"),
                m.sub("spare_nodes"),
                f"got {cluster.spare_nodes} with {cluster.nodes} nodes; expected at most "
                f"{_MAX_NODES} nodes and spares in all",
            )
        if hosts * cluster.nproc_per_node > MAX_WORKERS:
            raise self.ctx.error(
                m.line_of("nproc_per_node"),
                m.sub("nproc_per_node"),
                f"got {cluster.nproc_per_node} with {hosts} nodes and spares, "
                f"{hosts * cluster.nproc_per_node} workers; expected at most {MAX_WORKERS}",
            )
        return cluster

    def _job(self, top: _Map) -> Job:
        m = self._section(top, "job", required=True)
        assert m is not None
        startup_time = m.get("startup_time", _Duration(), 0.0)
        preload_saves = m.opt("preload_saves", _Duration())
        if preload_saves is not None and preload_saves > startup_time:
            raise self.ctx.error(
                m.line_of("preload_saves"),
                m.sub("preload_saves"),
                f"got {format_duration(preload_saves)}; expected at most the job's "
                f"startup_time ({format_duration(startup_time)}), the part a preload removes",
            )
        return Job(
            steps=m.req("steps", _Int(1)),
            step_time=m.req("step_time", _Duration(positive=True)),
            startup_time=startup_time,
            checkpoint_every=m.get("checkpoint_every", _Int(0), 0),
            checkpoint_time=m.get("checkpoint_time", _Duration(), 0.0),
            collective_timeout=m.get("collective_timeout", _Duration(positive=True), 600.0),
            timer=m.opt("timer", _Duration(positive=True)),
            hang_timeout=m.opt("hang_timeout", _Duration(positive=True)),
            preload_saves=preload_saves,
        )

    def _agent(self, top: _Map) -> Agent:
        m = self._section(top, "agent", required=False)
        if m is None:
            return Agent()
        return Agent(
            max_restarts=m.get("max_restarts", _Int(0), 3),
            monitor_interval=m.get("monitor_interval", _Duration(positive=True), 0.1),
            exit_barrier_timeout=m.get("exit_barrier_timeout", _Duration(), 300.0),
            shutdown_timeout=m.get("shutdown_timeout", _Duration(), 30.0),
        )

    def _store(self, top: _Map) -> Store:
        m = self._section(top, "store", required=False)
        if m is None:
            return Store()
        return Store(latency=m.get("latency", _Duration(), Store().latency))

    def _rendezvous(self, top: _Map, cluster: Cluster) -> Rendezvous:
        m = self._section(top, "rendezvous", required=False)
        if m is None:
            return Rendezvous(min_nodes=cluster.nodes, max_nodes=cluster.nodes)
        backend = m.get("backend", _Choice(RendezvousBackend), RendezvousBackend.C10D)
        given_min = m.opt("min_nodes", _Int(1, _MAX_NODES))
        given_max = m.opt("max_nodes", _Int(1, _MAX_NODES))
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
        if backend is RendezvousBackend.STATIC:
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
        return Rendezvous(
            backend=backend,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            join_timeout=m.get("join_timeout", _RDZV_TIMEOUT, 600.0),
            last_call_timeout=m.get("last_call_timeout", _RDZV_TIMEOUT, 30.0),
            heartbeat_timeout=m.get("heartbeat_timeout", _RDZV_TIMEOUT, 15.0),
            close_timeout=m.get("close_timeout", _RDZV_TIMEOUT, 30.0),
        )

    def _faults(
        self, top: _Map, cluster: Cluster, rendezvous: Rendezvous, until: float
    ) -> tuple[Fault | RateFault, ...]:
        node = top.value_node("faults")
        if node is None:
            return ()
        if not isinstance(node, yaml.SequenceNode):
            raise self.ctx.error(
                node, "faults", f"got {_describe_node(node)}; expected a list of faults"
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
                if total > _MAX_NODES:
                    raise self.ctx.error(
                        item,
                        f"faults[{index}]",
                        f"node_join faults bring the nodes that can exist to {total:.0f}; "
                        f"expected at most {_MAX_NODES} in all",
                    )
            if isinstance(fault, RateFault):
                end = until if fault.end is None else fault.end
                expected_draws += (end - fault.start) / fault.every
                if expected_draws > MAX_EXPANDED_FAULTS:
                    every = _Map(self.ctx, item, f"faults[{index}]", "").line_of("every")
                    raise self.ctx.error(
                        every,
                        f"faults[{index}].every",
                        f"got {_show(format_duration(fault.every))}; the rate faults would draw "
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
        rendezvous: Rendezvous,
        until: float,
        refs: list[_NodeRef],
    ) -> Fault | RateFault:
        m = _Map(self.ctx, item, path, "a fault mapping such as {at: 10m, kind: worker_crash, ...}")
        kind = m.req("kind", _Choice(FaultKind))
        if kind is FaultKind.NODE_JOIN and rendezvous.backend is RendezvousBackend.STATIC:
            raise self.ctx.error(
                m.line_of("kind"),
                m.sub("kind"),
                "got 'node_join'; expected no node_join with rendezvous.backend static "
                "(a static rendezvous has a fixed world; use c10d)",
            )
        params = _KIND_FIELDS[kind]
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
            (*timing, *params),
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
            every = m.req("every", _Duration(positive=True))
            start = m.get("from", _Duration(), 0.0)
            end = m.opt("to", _Duration())
            last = until if end is None else end
            if end is not None and end > until:
                raise self.ctx.error(
                    m.line_of("to"),
                    m.sub("to"),
                    f"got {_show(format_duration(end))}; expected ≤ until "
                    f"({format_duration(until)})",
                )
            if start >= last:
                raise self.ctx.error(
                    m.line_of("from"),
                    m.sub("from"),
                    f"got {_show(format_duration(start))}; expected before "
                    f"{'to' if end is not None else 'until'} ({format_duration(last)})",
                )
        else:
            at = m.req("at", _Duration())
            if at > until:
                raise self.ctx.error(
                    m.line_of("at"),
                    m.sub("at"),
                    f"got {_show(format_duration(at))}; expected ≤ until "
                    f"({format_duration(until)}), when the simulation stops",
                )
        values: dict[str, Any] = {}
        for name, need in params.items():
            reader = _param_reader(name, cluster)
            if need is _Need.REQUIRED or (need is _Need.TARGET and not is_rate):
                value = m.req(name, reader)
            else:
                value = m.opt(name, reader)
            if value is None and name in _FIELD_DEFAULTS:
                value = _FIELD_DEFAULTS[name]
            values[name] = value
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

    def _expect(self, top: _Map) -> Expectation:
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
                values[key] = _Choice(ExpectedState).read(self.ctx, node, path)
                continue
            reader: _Reader[float | int]
            if key in COUNT_KEYS:
                reader = _Int(0)
            elif key in SECONDS_KEYS:
                reader = _Duration()
            else:
                reader = _Real(0.0, 1.0)  # goodput is a fraction of wall time
            values[key] = self._bound(node, path, reader)
        return Expectation(**values)

    def _bound(self, node: yaml.Node, path: str, reader: _Reader[float | int]) -> Bound:
        if not isinstance(node, yaml.MappingNode):
            return Bound(exact=reader.read(self.ctx, node, path))
        m = _Map(self.ctx, node, path, "")
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


_RDZV_TIMEOUT = _Duration(positive=True, least=_MIN_RDZV_TIMEOUT)


def _param_reader(name: str, cluster: Cluster) -> _Reader[Any]:
    if name == "node":
        # the upper bound depends on node_join faults; _check_nodes applies it afterwards
        return _Int(0, _MAX_NODES)
    if name == "local_rank":
        return _Int(0, cluster.nproc_per_node - 1)
    if name == "exit_code":
        return _AnyInt()
    if name == "count":
        return _Int(1, _MAX_NODES)
    if name == "factor":
        return _Real(1.0, _MAX_FACTOR, lo_open=True)
    if name == "nodes":
        return _NodeList()
    if name in ("restart_after", "notice"):
        return _Duration()
    if name == "duration":
        return _Duration(positive=True)
    raise AssertionError(f"no reader for fault field {name}")  # the table names only these


@dataclass(frozen=True, slots=True)
class _NodeList:
    @property
    def expected(self) -> str:
        return "a non-empty list of distinct node indices, like [0, 1]"

    def read(self, ctx: _Ctx, node: yaml.Node, path: str) -> tuple[int, ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise ctx.error(node, path, f"got {_describe_node(node)}; expected {self.expected}")
        if len(node.value) > _MAX_NODES:
            raise ctx.error(
                node, path, f"got {len(node.value)} nodes; expected at most {_MAX_NODES}"
            )
        numbers: list[int] = []
        seen: set[int] = set()  # a set: a list's `in` made a long list quadratic
        reader = _Int(0, _MAX_NODES)
        for position, item in enumerate(node.value):
            number = reader.read(ctx, item, f"{path}[{position}]")
            if number in seen:
                raise ctx.error(
                    item, f"{path}[{position}]", f"got {number} twice; expected {self.expected}"
                )
            seen.add(number)
            numbers.append(number)
        return tuple(numbers)


# ---------------------------------------------------------------------------- expansion


def fault_rng(seed: int) -> random.Random:
    """The "faults" random generator for ``seed``, separate from every other concern's.

    Seeded from a string (hashed with SHA-512 by :mod:`random`), so it is the same on every
    platform and Python run, whatever ``PYTHONHASHSEED`` is.
    """
    return random.Random(f"elastic/faults/{seed}")


def expand_faults(scenario: Scenario, rng: random.Random) -> list[Fault]:
    """Turn every rate fault into timed faults; return all faults sorted by (time, file index).

    Guarantees: a pure function of the scenario's faults, cluster and ``until`` and of the
    state of ``rng`` (one 64-bit draw is taken from it).  Each rate fault draws from its own
    generators, derived from that draw and its index, one for times and one for targets, so
    adding or changing one fault leaves the others' draws unchanged.  Drawn times are rounded
    to the millisecond, so the explicit scenario reads well; targets are drawn uniformly among
    the nodes that exist by then (initial, spare, and joined before it) and the local ranks.
    """
    base = rng.getrandbits(64)
    occurrences: list[tuple[float, int, int, Fault | RateFault]] = []
    drawn = 0
    for index, spec in enumerate(scenario.faults):
        if isinstance(spec, Fault):
            occurrences.append((spec.at, index, 0, spec))
            continue
        times = random.Random(f"{base}/{index}/times")
        end = scenario.until if spec.end is None else spec.end
        clock = spec.start
        sequence = 0
        while True:
            clock += times.expovariate(1.0 / spec.every)
            at = round(clock, 3)
            if at >= end:
                break
            occurrences.append((at, index, sequence, spec))
            sequence += 1
            drawn += 1
            # only drawn faults count: the file's own are bounded by MAX_FAULTS at load
            if drawn > 2 * MAX_EXPANDED_FAULTS:
                raise ConfigError(
                    scenario.source,
                    f"faults[{index}]: drew more than {2 * MAX_EXPANDED_FAULTS} faults; "
                    "expected fewer (raise every or narrow from/to)",
                )
    occurrences.sort(key=lambda o: (o[0], o[1], o[2]))
    targets: dict[int, random.Random] = {}
    existing = scenario.cluster.nodes + scenario.cluster.spare_nodes
    expanded: list[Fault] = []
    for at, index, _, spec in occurrences:
        if isinstance(spec, Fault):
            fault = spec
        else:
            draw = targets.setdefault(index, random.Random(f"{base}/{index}/targets"))
            fault = _draw(spec, at, draw, existing, scenario.cluster.nproc_per_node)
        if fault.kind is FaultKind.NODE_JOIN:
            existing += fault.count or 1
        expanded.append(fault)
    return expanded


def _draw(spec: RateFault, at: float, draw: random.Random, existing: int, nproc: int) -> Fault:
    needs = _KIND_FIELDS[spec.kind]
    values = {name: getattr(spec, name) for name in _PARAM_FIELDS}
    # draw in a fixed order (node, local_rank, nodes) so the stream is reproducible
    if needs.get("node") is _Need.TARGET and values["node"] is None:
        values["node"] = draw.randrange(existing)
    if needs.get("local_rank") is _Need.TARGET and values["local_rank"] is None:
        values["local_rank"] = draw.randrange(nproc)
    if needs.get("nodes") is _Need.TARGET and values["nodes"] is None:
        values["nodes"] = (draw.randrange(existing),)
    return Fault(at=at, kind=spec.kind, **values)
