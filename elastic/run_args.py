"""The command line of ``elastic run``: torchrun 2.13's flags, and the launch config.

Every torchrun flag is accepted with both spellings (``--nproc-per-node`` and
``--nproc_per_node``), and every one that torchrun lets the environment set reads
``PET_<DEST>`` when the flag is absent (``PET_NPROC_PER_NODE=4``); switches read
``PET_<DEST>`` as an integer, non-zero meaning on.  ``--logs-specs`` and
``--numa-binding`` have no environment fallback, as in torch.  Our additions:
``--hang-timeout`` (seconds without progress before the agent treats the group as hung)
and ``--event-log`` (a file for the agent's JSON-lines events), both optional.

:func:`config_from_args` applies torchrun's rules (``run`` + ``config_from_args``):

* ``--standalone`` → backend ``c10d``, endpoint ``localhost:0``, a random run id,
  whatever was given; a single-node ``static`` job with neither ``--rdzv-endpoint`` nor
  ``--master-port`` gets the same (torch does this silently);
* ``--master-port`` defaults to 29500; a static job's endpoint is
  ``<master-addr>:<master-port>`` and its rendezvous config gets ``rank = --node-rank``;
* ``--nproc-per-node``: an integer, ``cpu`` (CPUs this process may run on), ``gpu``
  (GPUs visible through NVML and ``CUDA_VISIBLE_DEVICES``; an error if none), ``auto``
  (GPUs if any, else CPUs);
* ``OMP_NUM_THREADS=1`` for workers when unset and more than one worker per node.  It
  is returned in ``LaunchConfig.extra_env`` for the launcher to add to each worker's
  environment; unlike torch, ``os.environ`` is never changed here.

Unlike torch, every bad value — on the command line or in a ``PET_`` variable — is a
:class:`~elastic.errors.ConfigError` naming the flag (or variable), the value and what
was expected, never a traceback; argparse's own errors exit with status 2 and one line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from elastic._records import Frozen, set_fields
from elastic.cliparse import plain
from elastic.errors import ConfigError, one_line
from elastic.ids import uuid4_str
from elastic.rendezvous.conf import check_rdzv_conf
from elastic.rendezvous.utils import parse_rendezvous_config, parse_rendezvous_endpoint

__all__ = [
    "LaunchConfig",
    "Std",
    "check_env_values",
    "get_rdzv_endpoint",
    "get_use_env",
    "config_from_args",
    "determine_local_world_size",
    "get_args_parser",
    "parse",
    "parse_args",
    "parse_min_max_nnodes",
    "run_script_path",
]

from elastic.multiprocessing.api import Std  # the one Std, at torch's place

if TYPE_CHECKING:
    from elastic.multiprocessing.api import LogsSpecs

logger = logging.getLogger(__name__)

DEFAULT_MASTER_PORT = 29500
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")
START_METHODS = ("spawn", "fork", "forkserver")


@dataclass  # as torch's: mutable, no slots (and so cheaper to make at import)
class LaunchConfig:
    """What to launch on this node: torch's ``LaunchConfig`` fields and defaults, plus ours.

    After construction: ``rdzv_configs`` has ``"timeout"`` (``rdzv_timeout`` if not -1,
    else 900 unless given), ``shutdown_timeout`` is seconds ≥ 0, an int when whole (None →
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` or 30), ``exit_barrier_timeout`` is seconds ≥ 0 (None →
    ``TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT`` or 300).  The caller's ``rdzv_configs`` dict is
    copied, not changed.  ``logs_specs`` is kept for callers of torch's API; ``elastic
    run`` fills the plain fields below it instead, from which the launcher builds its
    logs specs.
    """

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    logs_specs: Any = None
    run_id: str = ""
    role: str = "default_role"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "etcd"
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    rdzv_timeout: int = -1
    max_restarts: int = 3
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_line_prefix_template: str | None = None
    metrics_cfg: dict[str, str] = field(default_factory=dict)
    local_addr: str | None = None
    event_log_handler: str = "null"
    #: torch's NumaOptions; here the ``--numa-binding`` mode name, or None.
    numa_options: str | None = None
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    duplicate_stdout_filters: list[str] | None = None
    duplicate_stderr_filters: list[str] | None = None
    virtual_local_rank: bool = False
    # seconds; fractions allowed (torch: whole seconds), e.g. for elastic real --time-scale
    shutdown_timeout: float | None = None
    #: seconds the exit barrier waits for the other nodes (newer torch's field; None →
    #: ``TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT`` or 300)
    exit_barrier_timeout: float | None = None
    # --- beyond torch --------------------------------------------------------------
    #: ``--log-dir`` (None: a temporary directory chosen by the launcher).
    log_dir: str | None = None
    redirects: Std | dict[int, Std] = Std.NONE
    tee: Std | dict[int, Std] = Std.NONE
    #: ``--local-ranks-filter``: local ranks shown on the console (None: all).
    local_ranks_filter: frozenset[int] | None = None
    #: ``--logs-specs``: an entry point name in group ``torchrun.logs_specs``.
    logs_specs_name: str | None = None
    #: ``--hang-timeout``: seconds without progress before a group counts as hung.
    hang_timeout: float | None = None
    #: ``--event-log``: file for the agent's JSON-lines events.
    event_log: str | None = None
    #: Variables to add to every worker's environment (e.g. OMP_NUM_THREADS=1).
    extra_env: dict[str, str] = field(default_factory=dict)
    #: ``--preload``: modules a zygote imports once; workers fork from it (warm restarts).
    preload: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        configs = dict(self.rdzv_configs)
        if self.rdzv_timeout != -1:
            configs["timeout"] = self.rdzv_timeout
        elif "timeout" not in configs:
            configs["timeout"] = 900
        self.rdzv_configs = configs
        if self.shutdown_timeout is None:
            raw = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
            try:
                value: float = float(raw)
            except ValueError:
                raise ConfigError(
                    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", f"got {raw!r}; expected seconds >= 0"
                ) from None
            where = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
        else:
            value, where = self.shutdown_timeout, "--shutdown-timeout"
        if value < 0:  # torch's words (LaunchConfig), which callers may match
            raise ConfigError(where, f"shutdown_timeout must be non-negative, got {value:g}")
        if not value < float("inf"):
            raise ConfigError(where, f"got {value:g}; expected a finite number of seconds >= 0")
        self.shutdown_timeout = int(value) if float(value).is_integer() else value
        from elastic.agent.server.api import resolve_exit_barrier_timeout

        self.exit_barrier_timeout = resolve_exit_barrier_timeout(
            self.exit_barrier_timeout, "--exit-barrier-timeout"
        )


# --- the parser ---------------------------------------------------------------------


class _BadEnv(Frozen):
    """A ``PET_`` value that could not be used; raised only if the flag is not given."""

    __slots__ = ("error",)
    error: ConfigError

    def __init__(self, error: ConfigError) -> None:
        set_fields(self, "error", error)


def _env_default(
    dest: str, default: Any, convert: Callable[[str], Any] | None, choices: Sequence[str] | None
) -> Any:
    name = f"PET_{dest.upper()}"
    raw = os.environ.get(name)
    if raw is None:
        return default
    if choices is not None and raw not in choices:
        return _BadEnv(ConfigError(name, f"got {raw!r}; expected one of {', '.join(choices)}"))
    if convert is None:
        return raw
    try:
        return convert(raw)
    except ValueError:
        kind = {int: "an integer", float: "a number"}.get(convert, "a valid value")  # type: ignore[call-overload]
        return _BadEnv(ConfigError(name, f"got {raw!r}; expected {kind}"))


class _Env(argparse.Action):
    """torch's ``env`` action: the default comes from ``PET_<DEST>`` when set."""

    def __init__(self, dest: str, default: Any = None, **kwargs: Any) -> None:
        default = _env_default(dest, default, kwargs.get("type"), kwargs.get("choices"))
        super().__init__(dest=dest, default=default, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)


def _switch(raw: str) -> bool:
    return bool(int(raw))


class _CheckEnv(argparse.Action):
    """torch's ``check_env``: a switch, on by default if ``PET_<DEST>`` is a non-zero int."""

    def __init__(self, dest: str, default: bool = False, **kwargs: Any) -> None:
        name = f"PET_{dest.upper()}"
        raw = os.environ.get(name)
        value: bool | _BadEnv = default
        if raw is not None:
            try:
                value = _switch(raw)
            except ValueError:
                value = _BadEnv(ConfigError(name, f"got {raw!r}; expected 0 (off) or 1 (on)"))
        super().__init__(dest=dest, const=True, default=value, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, self.const)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: the flag and what was wrong.
        self.exit(2, f"{self.prog}: error: {one_line(plain(message))} (see {self.prog} --help)\n")


def _comma_separated_list(value: str) -> list[str]:
    # torch's rule: ",," stands for a literal comma.
    placeholder = "\0"
    return [item.replace(placeholder, ",") for item in value.replace(",,", placeholder).split(",")]


def get_args_parser(prog: str = "elastic run") -> argparse.ArgumentParser:
    """The parser: torchrun 2.13's flags, defaults and ``PET_`` fallbacks, plus ours."""
    p = _Parser(prog=prog, description="Elastic training launcher (torchrun-compatible).")
    add = p.add_argument
    add("--nnodes", action=_Env, type=str, default="1:1", help="Number of nodes, or MIN:MAX.")
    add(
        "--nproc-per-node",
        "--nproc_per_node",
        action=_Env,
        type=str,
        default="1",
        help="Workers per node: an integer, cpu, gpu or auto.",
    )
    add(
        "--rdzv-backend",
        "--rdzv_backend",
        action=_Env,
        type=str,
        default="static",
        help="Rendezvous backend.",
    )
    add(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        action=_Env,
        type=str,
        default="",
        help="Rendezvous endpoint, <host>[:<port>].",
    )
    add(
        "--rdzv-id",
        "--rdzv_id",
        action=_Env,
        type=str,
        default="none",
        help="Job id shared by the nodes of one job.",
    )
    add(
        "--rdzv-conf",
        "--rdzv_conf",
        action=_Env,
        type=str,
        default="",
        help="Rendezvous options, <key1>=<value1>,<key2>=<value2>,...",
    )
    add(
        "--standalone",
        action=_CheckEnv,
        help="Single-node job: local c10d rendezvous on a free port; overrides --rdzv-*.",
    )
    add(
        "--max-restarts",
        "--max_restarts",
        action=_Env,
        type=int,
        default=0,
        help="Restarts of the worker group before the job fails.",
    )
    add(
        "--monitor-interval",
        "--monitor_interval",
        action=_Env,
        type=float,
        default=0.1,
        help="Seconds between checks that must be sampled (e.g. GPU health).",
    )
    add(
        "--start-method",
        "--start_method",
        action=_Env,
        type=str,
        default="spawn",
        choices=list(START_METHODS),
        help="How function workers are started.",
    )
    add(
        "--event-log-handler",
        "--event_log_handler",
        action=_Env,
        type=str,
        default="null",
        help="Name of a registered event handler.",
    )
    add("--role", action=_Env, type=str, default="default", help="Role of the workers.")
    add("-m", "--module", action=_CheckEnv, help="Run the script as a module, like python -m.")
    add(
        "--no-python",
        "--no_python",
        action=_CheckEnv,
        help="Run the script directly, without python.",
    )
    add(
        "--run-path",
        "--run_path",
        action=_CheckEnv,
        help="Run the script with runpy.run_path; takes precedence over --no-python.",
    )
    add(
        "--log-dir",
        "--log_dir",
        action=_Env,
        type=str,
        default=None,
        help="Base directory for log files.",
    )
    add(
        "-r",
        "--redirects",
        action=_Env,
        type=str,
        default="0",
        help="Redirect streams to files: 0-3, or per local rank like 0:1,1:2.",
    )
    add(
        "-t",
        "--tee",
        action=_Env,
        type=str,
        default="0",
        help="Tee streams to files and console (same syntax as --redirects).",
    )
    add(
        "--local-ranks-filter",
        "--local_ranks_filter",
        action=_Env,
        type=str,
        default="",
        help="Show only these local ranks on the console, e.g. 0,1,2.",
    )
    add(
        "--duplicate-stdout-filters",
        "--duplicate_stdout_filters",
        action=_Env,
        type=_comma_separated_list,
        default=[],
        help="Copy stdout lines containing any of these (comma list; ,, escapes).",
    )
    add(
        "--duplicate-stderr-filters",
        "--duplicate_stderr_filters",
        action=_Env,
        type=_comma_separated_list,
        default=[],
        help="Copy stderr lines containing any of these (comma list; ,, escapes).",
    )
    add(
        "--node-rank",
        "--node_rank",
        action=_Env,
        type=int,
        default=0,
        help="Rank of this node (static rendezvous only).",
    )
    add(
        "--master-addr",
        "--master_addr",
        action=_Env,
        type=str,
        default="127.0.0.1",
        help="Address of the rank-0 node (static rendezvous only).",
    )
    add(
        "--master-port",
        "--master_port",
        action=_Env,
        type=int,
        default=None,
        help="Port on the rank-0 node (static rendezvous only); default 29500.",
    )
    add(
        "--local-addr",
        "--local_addr",
        action=_Env,
        type=str,
        default=None,
        help="Address of this node (default: its FQDN).",
    )
    add(
        "--logs-specs",
        "--logs_specs",
        type=str,
        default=None,
        help="Entry point name in group torchrun.logs_specs.",
    )
    add(
        "--numa-binding",
        "--numa_binding",
        type=str,
        default=None,
        choices=list(NUMA_BINDINGS),
        help="Bind workers to CPUs near their GPU.",
    )
    add(
        "--signals-to-handle",
        "--signals_to_handle",
        action=_Env,
        type=str,
        default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        help="Signals the agent forwards to workers.",
    )
    add(
        "--shutdown-timeout",
        "--shutdown_timeout",
        action=_Env,
        type=float,
        default=None,
        help="Seconds between SIGTERM and SIGKILL when stopping workers "
        "(default: TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30).",
    )
    add(
        "--exit-barrier-timeout",
        "--exit_barrier_timeout",
        action=_Env,
        type=float,
        default=None,
        help="Seconds a node that finished waits at the exit barrier for the others "
        "(default: TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT or 300).",
    )
    add(
        "--virtual-local-rank",
        "--virtual_local_rank",
        action=_CheckEnv,
        help="LOCAL_RANK=0 in every worker, each seeing only its GPU.",
    )
    add(
        "--hang-timeout",
        "--hang_timeout",
        action=_Env,
        type=float,
        default=None,
        help="Seconds without worker progress before the group counts as hung.",
    )
    add(
        "--event-log",
        "--event_log",
        action=_Env,
        type=str,
        default=None,
        help="File for the agent's events, one JSON object per line.",
    )
    add(
        "--preload",
        action=_Env,
        type=str,
        default="",
        help="MODULE[,MODULE...]: imported once by a warm parent process from which every "
        "Python worker is forked, at launch and at each restart (e.g. torch).",
    )
    add("training_script", type=str, help="The training script (or module, or program).")
    add("training_script_args", nargs=argparse.REMAINDER)
    return p


def parse_args(args: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``args`` (torch's parameter name; default: ``sys.argv[1:]``).

    Raises :class:`ConfigError` for a bad ``PET_`` value of a flag not given; argparse's
    own errors exit with status 2 after one line on stderr.
    """
    ns = get_args_parser().parse_args(list(args) if args is not None else None)
    check_env_values(ns)
    return ns


def check_env_values(ns: argparse.Namespace) -> None:
    """Raise the :class:`ConfigError` of the first bad ``PET_`` value ``ns`` holds."""
    for value in vars(ns).values():
        if isinstance(value, _BadEnv):
            raise value.error


# --- from arguments to a launch config ----------------------------------------------


class NnodesError(ConfigError, RuntimeError):
    """A ``--nnodes`` of more than two parts: torch raises ``RuntimeError`` there."""


def parse_min_max_nnodes(nnodes: str) -> tuple[int, int]:
    """``"4"`` → (4, 4); ``"1:4"`` → (1, 4); checks 0 < MIN ≤ MAX.

    Raises :class:`~elastic.errors.ConfigError` (a ``ValueError``, as torch's ``int()``
    does for a non-number) and, for three or more parts, :class:`NnodesError` (also a
    ``RuntimeError``, torch's exception for that input).
    """
    expected = "expected N or MIN:MAX with 0 < MIN <= MAX (e.g. 2 or 1:4)"
    parts = nnodes.split(":")
    if len(parts) > 2:
        raise NnodesError("--nnodes", f"got {nnodes!r}; {expected}")
    try:
        if len(parts) == 1:
            lo = hi = int(parts[0])
        else:
            lo, hi = int(parts[0]), int(parts[1])
    except ValueError:
        raise ConfigError("--nnodes", f"got {nnodes!r}; {expected}") from None
    if not 0 < lo <= hi:
        raise ConfigError("--nnodes", f"got {nnodes!r}; {expected}")
    return lo, hi


def _cpu_count() -> int:
    # CPUs this process may run on (taskset, cgroup cpusets), as torch._utils.cpu_count.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def determine_local_world_size(
    nproc_per_node: str,
    gpu_count: Callable[[], int] | None = None,
    cpu_count: Callable[[], int] | None = None,
    torch_count: Callable[[str], Any] | None = None,
) -> int:
    """Workers per node from ``--nproc-per-node``: an integer ≥ 1, cpu, gpu, xpu or auto.

    ``gpu`` counts NVML's GPUs (:func:`elastic.gpu.visible_device_count`, no torch); where
    NVML finds none it asks torch (``torch.cuda``: ROCm's GPUs too).  ``xpu`` asks torch
    (``torch.xpu``).  ``auto`` is NVML's GPUs, else torch's current accelerator, else the
    CPUs.  torch is asked only where the answer needs it, and only if it is installed
    (:func:`elastic.gpu.torch_devices`).  ``gpu_count``/``cpu_count``/``torch_count``
    replace those sources (tests); a caller giving ``gpu_count`` and no ``torch_count``
    gets no answer from torch.
    """
    cpus = cpu_count or _cpu_count
    where = "--nproc-per-node"
    value = nproc_per_node.strip()
    try:
        n = int(value)
    except ValueError:
        pass
    else:
        if n < 1:
            raise ConfigError(where, f"got {n}; expected a number of workers >= 1")
        return n
    expected = "expected an integer >= 1, cpu, gpu, xpu or auto"
    if value not in ("cpu", "gpu", "xpu", "auto"):
        raise ConfigError(where, f"got {nproc_per_node!r}; {expected}")
    # imported only when asked for: a launch with a number needs none
    if gpu_count is None:
        from elastic.gpu import torch_devices, visible_device_count

        gpu_count = visible_device_count
        torch_count = torch_count or torch_devices

    def ask_torch(kind: str) -> tuple[int, str, str]:
        """(count, device type, why none) from torch, or 0 and why when it is not asked."""
        if torch_count is None:
            return 0, kind, "torch was not asked"
        found = torch_count(kind)
        if found is None:
            return 0, kind, "torch is not installed"
        return int(found.count), str(found.type), str(found.why)

    if value == "cpu":
        n, kind = cpus(), "CPUs"
    elif value == "gpu":
        n, kind = gpu_count(), "GPUs"
        if n == 0:
            n, _, why = ask_torch("cuda")
            if n == 0:
                raise ConfigError(
                    where,
                    f"got 'gpu' but no GPU is visible (NVML found none, or "
                    f"CUDA_VISIBLE_DEVICES hides them all; {why}); {expected}",
                )
    elif value == "xpu":
        n, _, why = ask_torch("xpu")
        kind = "XPUs"
        if n == 0:
            raise ConfigError(where, f"got 'xpu' but no XPU is visible ({why}); {expected}")
    else:  # auto
        n, kind = gpu_count(), "GPUs"
        if n == 0:
            n, kind, _ = ask_torch("accelerator")
        if n == 0:
            n, kind = cpus(), "CPUs"
    logger.info(
        "Using nproc_per_node=%s, setting nproc_per_node to %s since the instance has %s %s",
        value,
        n,
        n,
        kind,
    )
    return n


def _std(flag: str, value: str) -> Std | dict[int, Std]:
    try:
        return Std.from_str(value)
    except ValueError:
        raise ConfigError(
            flag,
            f"got {value!r}; expected 0, 1, 2 or 3 (none, stdout, stderr, both) "
            "or a per-local-rank map like 0:3,1:0,10:1",
        ) from None


def _local_ranks(value: str) -> frozenset[int] | None:
    if not value:
        return None
    try:
        ranks = frozenset(int(x) for x in value.split(","))
    except ValueError:
        raise ConfigError(
            "--local-ranks-filter",
            f"got {value!r}; expected a comma-separated list of integers, e.g. 0,1,2",
        ) from None
    return ranks


#: the entry point group of torchrun's ``--logs-specs`` plugins
LOGS_SPECS_GROUP = "torchrun.logs_specs"


def _get_logs_specs_class(logs_specs_name: str | None) -> type[LogsSpecs]:
    """torch's ``--logs-specs`` plugin lookup: the class named ``logs_specs_name`` in entry
    point group ``torchrun.logs_specs``; :class:`DefaultLogsSpecs` for None or
    ``"default"`` (torch registers its own class under that name, ours is used).

    A plugin subclasses :class:`elastic.multiprocessing.api.LogsSpecs`; one written for
    torch (a subclass of torch's ``LogsSpecs``) is run through an adapter that hands it
    torch's ``Std`` and reads its ``LogsDest`` back.  A missing name is a
    :class:`ConfigError` (a ``ValueError``, as torch's) in torch's words; a plugin that
    does not load, or is neither kind, is one too.
    """
    from elastic.multiprocessing.api import DefaultLogsSpecs, LogsSpecs

    if logs_specs_name in (None, "default"):
        return DefaultLogsSpecs
    from importlib import metadata

    found = metadata.entry_points(group=LOGS_SPECS_GROUP).select(name=logs_specs_name)
    ep = next(iter(found), None)
    if ep is None:
        raise ConfigError(
            "--logs-specs",
            f"Could not find entrypoint under '{LOGS_SPECS_GROUP}[{logs_specs_name}]' key",
        )
    try:
        cls = ep.load()
    except Exception as e:  # the plugin's own import error, shown in one line
        raise ConfigError(
            "--logs-specs", f"{logs_specs_name!r} ({ep.value}) failed to load: {one_line(str(e))}"
        ) from None
    if isinstance(cls, type) and issubclass(cls, LogsSpecs):
        logger.info("Using logs_spec '%s' mapped to %s", logs_specs_name, cls)
        return cls
    if isinstance(cls, type) and any(
        base.__module__ == "torch.distributed.elastic.multiprocessing.api"
        and base.__name__ == "LogsSpecs"
        for base in cls.__mro__
    ):
        logger.info("Using torch's logs_spec '%s' mapped to %s", logs_specs_name, cls)
        from elastic.multiprocessing.api import torch_logs_specs

        return torch_logs_specs(cls)
    raise ConfigError(
        "--logs-specs",
        f"{logs_specs_name!r} ({ep.value}) is {cls!r}; expected a subclass of "
        "elastic.multiprocessing.api.LogsSpecs (or of torch's)",
    )


def run_script_path(training_script: str, *training_script_args: str) -> None:
    """Run a script in this interpreter as ``__main__`` (``--run-path`` workers)."""
    import runpy

    sys.argv = [training_script, *training_script_args]
    runpy.run_path(sys.argv[0], run_name="__main__")


def _unquoted(raw: str) -> str:
    """``raw`` without one pair of quotes around the whole of it.

    A shell removes them; an exec-form command line (a container's ``args``, a job
    spec) passes them on, and torch's own launcher tests write
    ``--rdzv-conf='join_timeout=5,...'`` so.  No key or value of ours starts or ends
    with a quote, so the pair can only be quoting.
    """
    s = raw.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return raw


def config_from_args(
    args: argparse.Namespace,
    *,
    environ: Mapping[str, str] | None = None,
    gpu_count: Callable[[], int] | None = None,
    cpu_count: Callable[[], int] | None = None,
    new_run_id: Callable[[], str] = uuid4_str,
) -> tuple[LaunchConfig, Callable[..., Any] | str, list[str]]:
    """(config, command, command args) from parsed arguments, with torchrun's rules.

    Does what torchrun's ``run`` does to the arguments first (standalone and single-node
    rewrites, master port 29500) on a copy: ``args`` is not changed.  ``environ``
    (default ``os.environ``) is read for ``OMP_NUM_THREADS``, ``PYTHON_EXEC`` and
    ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``; it is never written.  Raises
    :class:`ConfigError` for any bad value.
    """
    env = os.environ if environ is None else environ
    a = argparse.Namespace(**vars(args))
    min_nodes, max_nodes = parse_min_max_nnodes(a.nnodes)
    if a.standalone:
        a.rdzv_backend, a.rdzv_endpoint, a.rdzv_id = "c10d", "localhost:0", new_run_id()
        logger.info(
            "Rendezvous info: --rdzv-backend=%s --rdzv-endpoint=%s --rdzv-id=%s",
            a.rdzv_backend,
            a.rdzv_endpoint,
            a.rdzv_id,
        )
    elif (
        a.rdzv_backend == "static"
        and not a.rdzv_endpoint
        and a.master_port is None
        and max_nodes == 1
    ):
        a.rdzv_backend, a.rdzv_endpoint, a.rdzv_id = "c10d", "localhost:0", new_run_id()
    if a.master_port is None:
        a.master_port = DEFAULT_MASTER_PORT

    if a.max_restarts < 0:
        raise ConfigError("--max-restarts", f"got {a.max_restarts}; expected an integer >= 0")
    if not a.monitor_interval > 0:
        raise ConfigError("--monitor-interval", f"got {a.monitor_interval}; expected seconds > 0")
    if a.hang_timeout is not None and not a.hang_timeout > 0:
        raise ConfigError(
            "--hang-timeout", f"got {a.hang_timeout}; expected seconds > 0 (or leave it out)"
        )
    if not 0 <= a.master_port <= 65535:
        raise ConfigError("--master-port", f"got {a.master_port}; expected a port 0..65535")
    if a.rdzv_backend != "static" and not a.rdzv_endpoint:
        logger.warning(
            "master_addr is only used for static rdzv_backend and when rdzv_endpoint "
            "is not specified."
        )
    if a.node_rank != 0 and a.rdzv_backend != "static":
        logger.warning(
            "node_rank is only used for static rdzv_backend. It will be ignored "
            "for rdzv_backend=%s.",
            a.rdzv_backend,
        )

    nproc = determine_local_world_size(a.nproc_per_node, gpu_count, cpu_count)
    extra_env: dict[str, str] = {}
    if "OMP_NUM_THREADS" not in env and nproc > 1:
        extra_env["OMP_NUM_THREADS"] = "1"
        # torch's words and banner, so that what people grep their logs for is there
        logger.warning(
            "\n*****************************************\n"
            "Setting OMP_NUM_THREADS environment variable for each process to be "
            "%s in default, to avoid your system being overloaded, "
            "please further tune the variable for optimal performance in "
            "your application as needed. \n"
            "*****************************************",
            extra_env["OMP_NUM_THREADS"],
        )

    try:
        rdzv_configs: dict[str, Any] = dict(parse_rendezvous_config(_unquoted(a.rdzv_conf)))
    except ValueError as e:
        raise ConfigError("--rdzv-conf", f"got {a.rdzv_conf!r}; {e}") from None
    why = check_rdzv_conf(a.rdzv_backend, rdzv_configs)
    if why is not None:
        raise ConfigError("--rdzv-conf", why)
    _check_endpoint(a.rdzv_backend, a.rdzv_endpoint)
    if a.rdzv_backend == "static":
        if not 0 <= a.node_rank < max_nodes:
            raise ConfigError(
                "--node-rank",
                f"got {a.node_rank}; expected 0..{max_nodes - 1} (one rank per node of --nnodes)",
            )
        rdzv_configs["rank"] = a.node_rank
    endpoint = get_rdzv_endpoint(a)
    _get_logs_specs_class(a.logs_specs)  # a plugin that is not there: one line, now

    config = LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        run_id=a.rdzv_id,
        role=a.role,
        rdzv_endpoint=endpoint,
        rdzv_backend=a.rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=a.max_restarts,
        monitor_interval=a.monitor_interval,
        start_method=a.start_method,
        log_line_prefix_template=env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        local_addr=a.local_addr,
        event_log_handler=a.event_log_handler,
        numa_options=a.numa_binding,
        signals_to_handle=a.signals_to_handle,
        duplicate_stdout_filters=a.duplicate_stdout_filters,
        duplicate_stderr_filters=a.duplicate_stderr_filters,
        virtual_local_rank=a.virtual_local_rank,
        shutdown_timeout=a.shutdown_timeout,
        exit_barrier_timeout=a.exit_barrier_timeout,
        log_dir=a.log_dir,
        redirects=_std("--redirects", a.redirects),
        tee=_std("--tee", a.tee),
        local_ranks_filter=_local_ranks(a.local_ranks_filter),
        logs_specs_name=a.logs_specs,
        hang_timeout=a.hang_timeout,
        event_log=a.event_log,
        extra_env=extra_env,
        preload=_preload(a.preload),
    )

    cmd: Callable[..., Any] | str
    cmd_args: list[str] = []
    if a.run_path:
        cmd = run_script_path
        cmd_args.append(a.training_script)
    elif not a.no_python:
        cmd = env.get("PYTHON_EXEC", sys.executable)
        cmd_args.append("-u")
        if a.module:
            cmd_args.append("-m")
        cmd_args.append(a.training_script)
    else:
        if a.module:
            raise ConfigError(
                "--no-python", "cannot be used with -m/--module; expected one or the other"
            )
        cmd = a.training_script
    if not get_use_env(a):
        # the legacy launcher without --use-env: each worker gets its rank as an argument
        # (the agent replaces the macro per worker), before the script's own arguments
        cmd_args.append("--local-rank=${local_rank}")
    cmd_args.extend(a.training_script_args)
    return config, cmd, cmd_args


def get_rdzv_endpoint(args: argparse.Namespace) -> str:
    """torch's rule: static rendezvous with no ``--rdzv-endpoint`` meets at the master's
    address and port (default 29500); otherwise the endpoint as given."""
    if args.rdzv_backend == "static" and not args.rdzv_endpoint:
        port = DEFAULT_MASTER_PORT if args.master_port is None else args.master_port
        return f"{args.master_addr}:{port}"
    return str(args.rdzv_endpoint)


def get_use_env(args: argparse.Namespace) -> bool:
    """torch's rule: a namespace without ``use_env`` (torchrun's) uses the environment;
    the legacy launcher's without ``--use-env`` passes ``--local-rank`` instead."""
    return bool(getattr(args, "use_env", True))


def _preload(raw: str) -> tuple[str, ...]:
    """``--preload a,b.c`` → ("a", "b.c"); ConfigError for a name that is no module path."""
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    for n in names:
        if not all(part.isidentifier() for part in n.split(".")):
            raise ConfigError(
                "--preload", f"got {n!r}; expected module names like torch,torch.nn.parallel"
            )
    return names


def _check_endpoint(backend: str, endpoint: str) -> None:
    """A malformed ``--rdzv-endpoint`` is refused, even where one node would not use it."""
    members = endpoint.split(",") if backend in ("etcd", "etcd-v2") else [endpoint]
    for m in members:
        if not m.strip() and endpoint:
            raise ConfigError("--rdzv-endpoint", f"got {endpoint!r}; an empty member")
        try:
            parse_rendezvous_endpoint(m, 0)
        except ValueError as e:
            raise ConfigError("--rdzv-endpoint", f"got {endpoint!r}; {e}") from None


def parse(
    argv: Sequence[str] | None = None,
) -> tuple[LaunchConfig, Callable[..., Any] | str, list[str]]:
    """``elastic run``'s arguments → (config, command, command args).

    Raises only :class:`ConfigError` (one line for the user); argparse's own errors exit
    with status 2 after one line.
    """
    return config_from_args(parse_args(argv))
