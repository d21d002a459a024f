"""The scenario as data: what a validated scenario file holds, as frozen dataclasses.

Durations are float seconds and defaults are filled in (torch's, where torch has one).  The
reader (:mod:`sim.scenario.reader`) builds these from YAML, the writer
(:mod:`sim.scenario.writer`) turns them back into YAML that reads back equal, and
:mod:`sim.scenario.expand` turns rate faults into timed ones.

Decisions worth knowing (see also the field docstrings):

- ``rendezvous.backend`` defaults to ``c10d`` (the dynamic rendezvous, which is the only one
  that handles every fault kind); files without a ``rendezvous:`` section get
  ``min_nodes = max_nodes = cluster.nodes``.  ``static`` needs ``min_nodes = max_nodes =
  nodes``, no spare nodes and no ``node_join`` faults.
- Nodes are numbered from 0: the ``cluster.nodes`` first, then the ``spare_nodes``, then
  nodes brought by ``node_join`` faults in time order.  A timed fault may name a node that
  exists by its time; a rate fault may name any node that can ever exist.
- A fault naming a node that is down when it fires is the runner's to ignore.
- What each fault kind takes is one table, :data:`KIND_FIELDS`, read by the reader, the
  expansion and the JSON Schema (:mod:`sim.schema`); what each kind does to the simulated
  cluster is the table beside it in :mod:`sim.inject`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from elastic.errors import ConfigError
from sim.expect import Expectation

if TYPE_CHECKING:
    from sim.failures import FailureModel

__all__ = [
    "DEFAULT_UNTIL",
    "FIELD_DEFAULTS",
    "KIND_FIELDS",
    "PARAM_FIELDS",
    "Agent",
    "Cluster",
    "Fault",
    "FaultKind",
    "Job",
    "Need",
    "RateFault",
    "RendezvousBackendName",
    "RendezvousSpec",
    "Scenario",
    "StoreSpec",
]

#: The simulation gives up at this simulated time unless ``until:`` says otherwise.
DEFAULT_UNTIL = 7 * 86400.0


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


class RendezvousBackendName(enum.StrEnum):
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

    The methods are the training arithmetic the simulated workers run on
    (:mod:`sim.workers`): progress is computed from time, never stepped through.
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

    def segment(self) -> float:
        """The seconds from one checkpoint's end to the next's: its steps and the save."""
        return self.checkpoint_every * self.step_time + self.checkpoint_time

    def progress(self, s0: int, work: float) -> tuple[int, int]:
        """(steps reached, last completed checkpoint) after ``work`` seconds from step ``s0``."""
        if work <= 0:
            return s0, s0
        k = self.checkpoint_every
        if k <= 0:
            steps = s0 + math.floor(work / self.step_time + 1e-9)
            return min(steps, self.steps), s0
        seg = self.segment()
        n_full = math.floor(work / seg + 1e-9)
        rem = work - n_full * seg
        in_seg = min(k, math.floor(rem / self.step_time + 1e-9))
        steps = min(self.steps, s0 + n_full * k + in_seg)
        ckpt = min(self.steps, s0 + n_full * k)
        return steps, ckpt

    def phase_start(self, work: float) -> float:
        """Where (in work seconds) the step or checkpoint in progress at ``work`` began.

        A worker's step timer is acquired there (the model worker runs every step and
        every checkpoint inside ``expires(after=timer)``)."""
        st = self.step_time
        k = self.checkpoint_every
        if k <= 0:
            return math.floor(work / st + 1e-9) * st
        seg = self.segment()
        n_full = math.floor(work / seg + 1e-9)
        rem = work - n_full * seg
        if rem < k * st - 1e-9:
            return n_full * seg + math.floor(rem / st + 1e-9) * st
        return n_full * seg + k * st  # in the checkpoint

    def last_beat(self, work: float) -> float | None:
        """Where (in work seconds) the last step completed before ``work``: a worker beats
        after each step.  None before the first step of a world completed."""
        st = self.step_time
        k = self.checkpoint_every
        if k <= 0:
            n = math.floor(work / st + 1e-9)
            return n * st if n > 0 else None
        seg = self.segment()
        n_full = math.floor(work / seg + 1e-9)
        rem = work - n_full * seg
        in_seg = min(k, math.floor(rem / st + 1e-9))
        if in_seg > 0:
            return n_full * seg + in_seg * st
        if n_full == 0:
            return None
        return (n_full - 1) * seg + k * st  # the step before the last checkpoint

    def work_to_finish(self, s0: int) -> float:
        """Seconds of work from step ``s0`` (a checkpoint) to the last step."""
        remaining = max(0, self.steps - s0)
        if remaining == 0:
            return 0.0
        k = self.checkpoint_every
        n_ckpt = (math.ceil(remaining / k) - 1) if k > 0 else 0
        return remaining * self.step_time + n_ckpt * self.checkpoint_time


@dataclass(frozen=True, slots=True)
class Agent:
    """Agent settings, with torch 2.13's defaults (``SimpleElasticAgent``, ``torchrun``)."""

    max_restarts: int = 3
    monitor_interval: float = 0.1
    exit_barrier_timeout: float = 300.0
    shutdown_timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class RendezvousSpec:
    """Rendezvous settings; the timeouts default to torch's dynamic rendezvous.

    ``heartbeat_timeout`` is how long a silent node stays a member: torch drops a node after
    ``keep_alive_interval`` 5 s times ``keep_alive_max_attempt`` 3 = 15 s, our lease TTL.
    """

    min_nodes: int
    max_nodes: int
    backend: RendezvousBackendName = RendezvousBackendName.C10D
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    heartbeat_timeout: float = 15.0
    close_timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class StoreSpec:
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
    # the failure category a ``failures:`` generator drew it from (sim/failures.py), if any
    category: str | None = None


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
    # the failure category a ``failures:`` generator drew it from (sim/failures.py), if any
    category: str | None = None


# Names shared by Fault and RateFault after their timing fields, in the order they are written.
PARAM_FIELDS = (
    "node",
    "local_rank",
    "exit_code",
    "restart_after",
    "count",
    "notice",
    "duration",
    "nodes",
    "factor",
    "category",
)


class Need(enum.Enum):
    REQUIRED = "required"
    OPTIONAL = "optional"
    # required in a timed fault; drawn uniformly per occurrence in a rate fault
    TARGET = "target"


# What each fault kind takes (a table, not ifs: adding a kind is one line here).
KIND_FIELDS: dict[FaultKind, dict[str, Need]] = {
    FaultKind.WORKER_CRASH: {
        "node": Need.TARGET,
        "local_rank": Need.TARGET,
        "exit_code": Need.OPTIONAL,
    },
    FaultKind.WORKER_HANG: {"node": Need.TARGET, "local_rank": Need.TARGET},
    FaultKind.NODE_CRASH: {"node": Need.TARGET, "restart_after": Need.OPTIONAL},
    FaultKind.NODE_JOIN: {"count": Need.OPTIONAL},
    FaultKind.NODE_LEAVE: {"node": Need.TARGET},
    FaultKind.PREEMPTION: {"node": Need.TARGET, "notice": Need.REQUIRED},
    FaultKind.STORE_OUTAGE: {"duration": Need.REQUIRED},
    FaultKind.NETWORK_PARTITION: {"nodes": Need.TARGET, "duration": Need.REQUIRED},
    FaultKind.SLOW_NODE: {
        "node": Need.TARGET,
        "factor": Need.REQUIRED,
        "duration": Need.OPTIONAL,
    },
    FaultKind.GPU_ERROR: {
        "node": Need.TARGET,
        "local_rank": Need.OPTIONAL,
        "restart_after": Need.OPTIONAL,
    },
}
FIELD_DEFAULTS: dict[str, int] = {"exit_code": 1, "count": 1}


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario; build it with :func:`load_scenario` or :func:`load_scenario_text`.

    ``faults`` keeps the file's order, timed and rate faults mixed.  ``source`` (the file it
    came from) is not part of equality, so a scenario written out and read back is equal.
    """

    name: str
    cluster: Cluster
    job: Job
    rendezvous: RendezvousSpec
    seed: int = 0
    until: float = DEFAULT_UNTIL
    description: str = ""
    agent: Agent = field(default_factory=Agent)
    store: StoreSpec = field(default_factory=StoreSpec)
    faults: tuple[Fault | RateFault, ...] = ()
    expect: Expectation = field(default_factory=Expectation)
    source: str = field(default="<string>", compare=False)
    # a calibration file (``elastic calibrate``), as written in the scenario; relative to
    # the scenario's directory (see :mod:`sim.calibration`)
    calibration: str = ""
    # ``failures:``: failure generators on published rates (sim/failures.py)
    failures: FailureModel | None = None

    def with_seed(self, seed: int) -> Scenario:
        """This scenario with another seed (``elastic sim --seed``); refuses a negative seed."""
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError("--seed", f"got {seed!r}; expected an integer ≥ 0")
        return replace(self, seed=seed)

    def with_faults(self, faults: Iterable[Fault | RateFault]) -> Scenario:
        """This scenario with ``faults`` instead (e.g. the output of :func:`expand_faults`).

        They replace every source of faults: ``failures:`` too, whose draws
        :func:`expand_faults` includes.
        """
        return replace(self, faults=tuple(faults), failures=None)

    @property
    def has_rate_faults(self) -> bool:
        """Whether some faults are drawn at random (so the run depends on the seed's draws)."""
        return self.failures is not None or any(isinstance(f, RateFault) for f in self.faults)

    def to_dict(self) -> dict[str, Any]:
        """The scenario in the file's schema (plain dicts, lists, str and numbers)."""
        from sim.scenario.writer import scenario_to_dict  # the writer imports this module

        return scenario_to_dict(self)

    def to_yaml(self) -> str:
        """The scenario as YAML that :func:`~sim.scenario.reader.load_scenario_text` reads
        back equal."""
        from sim.scenario.writer import scenario_to_yaml  # the writer imports this module

        return scenario_to_yaml(self)
