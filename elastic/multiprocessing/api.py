"""Where a worker's output goes: torch's ``Std``, ``LogsSpecs`` and log directory layout.

Theory of operation
-------------------
A :class:`LogsSpecs` turns the per-rank worker environments of one attempt into a
:class:`LogsDest`: for every local rank, the file (or the console, ``""``) its stdout and
stderr go to, which of them are also shown on the agent's console (tee), and the path of
its ``error.json``.  :class:`DefaultLogsSpecs` keeps torch's layout::

    <log_dir>/<run_id>_<random>/attempt_<k>/<local_rank>/{stdout.log,stderr.log,error.json}

where ``run_id`` is the worker env's ``TORCHELASTIC_RUN_ID`` and ``k`` its
``TORCHELASTIC_RESTART_COUNT``.  The run directory is made once per specs object, so the
logs of failed attempts stay next to the new ones (one ``attempt_<k>`` per restart).
``reify`` sets ``TORCHELASTIC_ERROR_FILE`` in every rank's env, like torch.

Semantics kept from torch: tee implies redirect (a tee'd stream is written to its file
*and* shown on the console); with ``local_ranks_filter``, ranks outside the filter lose
their console copy, and their streams that were not redirected go to ``os.devnull``;
``log_dir == os.devnull`` disables every file (error files become ``""``).

Where we differ: :meth:`Std.from_str` accepts local ranks of any number of digits
(torch's pattern takes one digit, so ``10:3`` was refused).

Signals.  :meth:`PContext.start` installs :func:`_terminate_process_handler` (torch's
name) for SIGTERM, SIGINT, SIGHUP and SIGQUIT, or the names in
``TORCHELASTIC_SIGNALS_TO_HANDLE``: it raises :class:`SignalException` in the main
thread, so ``try: pc.wait() except SignalException as e: pc.close(e.sigval)`` stops the
workers and ``finally`` blocks run.  While a context is stopping its processes
(:func:`_signals_held`) a signal is held and raised once they are gone, so a second
Ctrl-C cannot cut a stop short and leave processes behind (torch raises at once).

Also here, as in torch's ``api`` module, for code that imports them from it:
``ProcessFailure``, ``record``, ``TailLog``, ``SubprocessHandler``,
``get_subprocess_handler``, ``redirect_stdout``, ``redirect_stderr`` (imported on first
use, like the process contexts).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal as signal  # (re-exported: read as elastic.multiprocessing.api.signal)
import sys
import tempfile
import threading as threading  # (the same)
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntFlag
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from elastic.errors import ElasticError

if TYPE_CHECKING:
    # the names torch's api module re-exports ("X as X": a re-export, not in __all__,
    # as in torch)
    from elastic.multiprocessing.errors import ProcessFailure as ProcessFailure
    from elastic.multiprocessing.errors import record as record
    from elastic.multiprocessing.pcontext import (
        MultiprocessContext,
        PContext,
        RunProcsResult,
        SubprocessContext,
    )
    from elastic.multiprocessing.redirects import redirect_stderr as redirect_stderr
    from elastic.multiprocessing.redirects import redirect_stdout as redirect_stdout
    from elastic.multiprocessing.subprocess_handler import (
        SubprocessHandler as SubprocessHandler,
    )
    from elastic.multiprocessing.subprocess_handler import (
        get_subprocess_handler as get_subprocess_handler,
    )
    from elastic.multiprocessing.tail_log import TailLog as TailLog

__all__ = [
    "DefaultLogsSpecs",
    "LogsDest",
    "LogsSpecs",
    "MultiprocessContext",
    "PContext",
    "RunProcsResult",
    "SignalException",
    "Std",
    "SubprocessContext",
    "get_std_cm",
    "to_map",
]

# torch's process contexts live in .pcontext (they import the real launcher), and the
# names torch's api module re-exports in their own modules; all are imported on first
# use so that `elastic run`'s import of this module stays light (and no cycle forms)
_LAZY = {
    "MultiprocessContext": "elastic.multiprocessing.pcontext",
    "PContext": "elastic.multiprocessing.pcontext",
    "RunProcsResult": "elastic.multiprocessing.pcontext",
    "SubprocessContext": "elastic.multiprocessing.pcontext",
    "ProcessFailure": "elastic.multiprocessing.errors",
    "record": "elastic.multiprocessing.errors",
    "TailLog": "elastic.multiprocessing.tail_log",
    "SubprocessHandler": "elastic.multiprocessing.subprocess_handler",
    "get_subprocess_handler": "elastic.multiprocessing.subprocess_handler",
    "redirect_stdout": "elastic.multiprocessing.redirects",
    "redirect_stderr": "elastic.multiprocessing.redirects",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


class SignalException(ElasticError):
    """The agent received a termination signal (torch's name; ``sigval`` is the signal).

    Raised by :meth:`LocalElasticAgent.run` after the workers were stopped with the
    same signal; ``elastic run`` exits 1, as torchrun does.
    """

    def __init__(self, msg: str, sigval: signal.Signals) -> None:
        super().__init__(msg, sigval)
        self.msg = msg
        self.sigval = sigval

    def __str__(self) -> str:
        return self.msg


logger = logging.getLogger(__name__)

#: torch's platform flags; :meth:`PContext.start` reads ``threading``, ``signal``,
#: ``logger`` and ``IS_WINDOWS`` through this module, as torch's does (its tests patch them)
IS_WINDOWS = sys.platform == "win32"
IS_MACOS = sys.platform == "darwin"

#: how many stops are under way (:func:`_signals_held`), and the signals held meanwhile
_hold_depth = 0
_held: list[signal.Signals] = []


def _terminate_process_handler(signum: int, frame: FrameType | None) -> None:
    """The handler :meth:`PContext.start` installs: raise :class:`SignalException`.

    While processes are being stopped (:func:`_signals_held`) the signal is held instead
    and raised when the stop is over.
    """
    sigval = signal.Signals(signum)
    if _hold_depth:
        _held.append(sigval)
        return
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold the signals :func:`_terminate_process_handler` would raise for the block;
    raise :class:`SignalException` for the first one held when the outermost block ends
    (also when the block raised: the signal is the more urgent news)."""
    global _hold_depth
    _hold_depth += 1
    try:
        yield
    finally:
        _hold_depth -= 1
        if not _hold_depth and _held:
            sigval = _held[0]
            _held.clear()
            raise SignalException(
                f"Process {os.getpid()} got signal: {sigval} (held until its processes "
                "were stopped)",
                sigval=sigval,
            )


def _validate_full_rank(d: dict[int, Any], nprocs: int, what: str) -> None:
    """RuntimeError (torch's words) unless ``d``'s keys are exactly ``0..nprocs-1``."""
    if set(d) != set(range(nprocs)):
        raise RuntimeError(
            f"{what}, local rank mapping mismatch, expected: {set(range(nprocs))}, actual: {set(d)}"
        )


def get_std_cm(
    std_rd: str, redirect_fn: Callable[[str], contextlib.AbstractContextManager[Any]]
) -> contextlib.AbstractContextManager[Any]:
    """torch's helper: ``redirect_fn(std_rd)``, or a no-op context when ``std_rd`` is
    empty (the stream stays on the console)."""
    if not std_rd:
        return contextlib.nullcontext()
    return redirect_fn(std_rd)


def warn_numa_ignored(numa_options: Any, log: logging.Logger) -> None:
    """torch's ``numa_options`` are accepted and not applied: say so, when given."""
    if numa_options is not None:
        log.warning(
            "numa_options=%r is ignored: elastic does not bind workers to NUMA nodes",
            numa_options,
        )


class _ReturnQueue(Protocol):
    def put(self, obj: Any, /) -> None: ...


class _Waitable(Protocol):
    def wait(self, timeout: float | None = None, /) -> bool: ...


def _wrap(
    local_rank: int,
    fn: Callable[..., Any],
    args: dict[int, tuple[Any, ...]],
    envs: dict[int, dict[str, str]],
    stdout_redirects: dict[int, str],
    stderr_redirects: dict[int, str],
    ret_vals: dict[int, _ReturnQueue],
    queue_finished_reading_event: _Waitable,
    numa_options: Any = None,
) -> None:
    """torch's body of one rank of a function run, in the calling process.

    Looks up the rank's entries first (a missing one raises ``KeyError`` before anything
    changes), sets the rank's environment in ``os.environ``, runs ``fn(*args)`` under
    :func:`~elastic.multiprocessing.errors.record` with stdout/stderr redirected to the
    rank's files (``""``: left on the console), puts the return value on the rank's
    queue and waits until ``queue_finished_reading_event`` is set (the reader has it).

    Our :class:`MultiprocessContext` does not call it: it starts a function by name in a
    fresh interpreter and carries arguments and results as data, not pickles (see
    :mod:`elastic.multiprocessing.pcontext`).  It is here for code written against
    torch's helper; ``numa_options`` is accepted and ignored with a warning, as there.
    """
    args_ = args[local_rank]
    env_ = envs[local_rank]
    ret_val_ = ret_vals[local_rank]
    from elastic.multiprocessing.errors import record
    from elastic.multiprocessing.redirects import redirect_stderr, redirect_stdout

    stdout_cm = get_std_cm(stdout_redirects[local_rank], redirect_stdout)
    stderr_cm = get_std_cm(stderr_redirects[local_rank], redirect_stderr)
    warn_numa_ignored(numa_options, logger)
    os.environ.update(env_)
    with stdout_cm, stderr_cm:
        ret = record(fn)(*args_)
    ret_val_.put(ret)
    queue_finished_reading_event.wait()


_VALUE_REGEX = re.compile(r"^[0123]$")
_MAPPING_REGEX = re.compile(r"^(\d+:[0123],)*(\d+:[0123])$")


class Std(IntFlag):
    """Which standard streams: NONE=0, OUT=1, ERR=2, ALL=3 (flags, like torch's)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = OUT | ERR

    @classmethod
    def from_str(cls, vm: str) -> Std | dict[int, Std]:
        """Parse ``"3"`` into ``Std.ALL`` and ``"0:1,10:2"`` into ``{0: OUT, 10: ERR}``.

        Raises ``ValueError`` (one line: the value and what is expected) on anything else;
        the command line turns it into a ``ConfigError`` naming the flag.
        """
        text = vm.strip()
        if _VALUE_REGEX.match(text):
            return cls(int(text))
        if _MAPPING_REGEX.match(text):
            result: dict[int, Std] = {}
            for item in text.split(","):
                rank, value = item.split(":")
                result[int(rank)] = cls(int(value))
            return result
        raise ValueError(
            f"{vm!r} is not a stream selection: expected one of 0,1,2,3 (none, stdout, "
            "stderr, both) or a per-local-rank map like 0:3,1:0,10:1"
        )


def to_map(val_or_map: Std | dict[int, Std], local_world_size: int) -> dict[int, Std]:
    """A full ``{local_rank: Std}`` for ranks ``0..n-1``; ranks missing from a map get NONE.

    Any int-valued flag is accepted (torch's own ``Std``, or another module's copy) and
    converted, so values from other parsers cannot be mistaken for a map.
    """
    if isinstance(val_or_map, int):
        return dict.fromkeys(range(local_world_size), Std(int(val_or_map)))
    return {i: Std(int(val_or_map.get(i, Std.NONE))) for i in range(local_world_size)}


@dataclass
class LogsDest:
    """Per local rank: stdout/stderr destination ("" = console), tee'd files, error files."""

    stdouts: dict[int, str] = field(default_factory=dict)
    stderrs: dict[int, str] = field(default_factory=dict)
    tee_stdouts: dict[int, str] = field(default_factory=dict)
    tee_stderrs: dict[int, str] = field(default_factory=dict)
    error_files: dict[int, str] = field(default_factory=dict)
    filtered_stdout: str = ""
    filtered_stderr: str = ""
    #: The attempt's directory (every rank's error file is under it), unique to this
    #: agent's run; None when there is none (``/dev/null`` logs).  Not in torch's
    #: ``LogsDest``: the launcher tags the workers' process trees with it.
    attempt_dir: str | None = None


class LogsSpecs(ABC):
    """How worker output is logged: base directory, redirects, tee, console rank filter."""

    def __init__(
        self,
        log_dir: str | None = None,
        redirects: Std | dict[int, Std] = Std.NONE,
        tee: Std | dict[int, Std] = Std.NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        self._root_log_dir = log_dir
        self._redirects = redirects
        self._tee = tee
        self._local_ranks_filter = local_ranks_filter

    @abstractmethod
    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Make the destinations for one attempt; may add variables to ``envs``."""

    @property
    @abstractmethod
    def root_log_dir(self) -> str:
        """The base directory given (or made) for the logs."""


def torch_logs_specs(plugin: type[Any]) -> type[LogsSpecs]:
    """A :class:`LogsSpecs` class that runs ``plugin``, a subclass of torch's
    ``LogsSpecs`` (a ``--logs-specs`` plugin written for torchrun), under elastic.

    The plugin is made with torch's ``Std`` values (same numbers as ours) and its
    ``LogsDest`` is read back field by field into ours; ``root_log_dir`` is its own.
    Needs torch importable (the plugin imports it anyway).
    """
    from torch.distributed.elastic.multiprocessing.api import Std as TorchStd

    def to_torch(v: Std | dict[int, Std]) -> Any:
        if isinstance(v, dict):
            return {int(k): TorchStd(int(x)) for k, x in v.items()}
        return TorchStd(int(v))

    class TorchLogsSpecs(LogsSpecs):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)  # (LogsSpecs's parameters, torch's)
            self.plugin = plugin(
                log_dir=self._root_log_dir,
                redirects=to_torch(self._redirects),
                tee=to_torch(self._tee),
                local_ranks_filter=self._local_ranks_filter,
            )

        def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
            d = self.plugin.reify(envs)
            return LogsDest(
                stdouts=dict(d.stdouts),
                stderrs=dict(d.stderrs),
                tee_stdouts=dict(d.tee_stdouts),
                tee_stderrs=dict(d.tee_stderrs),
                error_files=dict(d.error_files),
                filtered_stdout=str(getattr(d, "filtered_stdout", "") or ""),
                filtered_stderr=str(getattr(d, "filtered_stderr", "") or ""),
            )

        @property
        def root_log_dir(self) -> str:
            return str(self.plugin.root_log_dir)

    TorchLogsSpecs.__name__ = TorchLogsSpecs.__qualname__ = f"TorchLogsSpecs[{plugin.__name__}]"
    return TorchLogsSpecs


class DefaultLogsSpecs(LogsSpecs):
    """torch's layout; ``log_dir`` None/"" → a fresh ``torchelastic_*`` temp directory.

    Raises ``NotADirectoryError`` if ``log_dir`` names an existing file (as torch does).
    """

    def __init__(
        self,
        log_dir: str | None = None,
        redirects: Std | dict[int, Std] = Std.NONE,
        tee: Std | dict[int, Std] = Std.NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        if log_dir != os.devnull:
            if not log_dir:
                log_dir = tempfile.mkdtemp(prefix="torchelastic_")
            elif os.path.isfile(log_dir):
                raise NotADirectoryError(f"log_dir: {log_dir} is a file")
            else:
                os.makedirs(log_dir, exist_ok=True)
        super().__init__(log_dir, redirects, tee, local_ranks_filter)
        self._run_log_dir: str | None = None

    @property
    def root_log_dir(self) -> str:
        return str(self._root_log_dir)

    @property
    def run_log_dir(self) -> str | None:
        """``<log_dir>/<run_id>_<random>`` once the first attempt was reified, else None."""
        return self._run_log_dir

    def _make_run_dir(self, run_id: str) -> str:
        base = self._root_log_dir or tempfile.mkdtemp(prefix="torchelastic_")
        os.makedirs(base, exist_ok=True)
        run_dir = tempfile.mkdtemp(prefix=f"{run_id}_", dir=base)
        logger.info("log directory set to: %s", run_dir)
        return run_dir

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Create ``attempt_<k>/<local_rank>/`` and return where each stream goes."""
        nprocs = len(envs)
        first = envs[0] if nprocs else {}
        if not nprocs:
            logger.warning("Empty envs map provided when defining logging destinations.")
        run_id = first.get("TORCHELASTIC_RUN_ID", "test_run_id")
        restart_count = first.get("TORCHELASTIC_RESTART_COUNT", "0")

        if self._root_log_dir == os.devnull:
            attempt_dir = os.devnull
        else:
            if self._run_log_dir is None:
                self._run_log_dir = self._make_run_dir(run_id)
            attempt_dir = os.path.join(self._run_log_dir, f"attempt_{restart_count}")
            # the same attempt number twice (a re-reify) starts from a clean directory
            shutil.rmtree(attempt_dir, ignore_errors=True)
            os.makedirs(attempt_dir)

        redirs = to_map(self._redirects, nprocs)
        tees = to_map(self._tee, nprocs)
        for rank, tee_std in tees.items():
            redirs[rank] |= tee_std  # to tee a stream we first write it to its file

        console = ""
        dest = LogsDest(
            stdouts=dict.fromkeys(range(nprocs), console),
            stderrs=dict.fromkeys(range(nprocs), console),
            filtered_stdout=os.path.join(attempt_dir, "filtered_stdout.log"),
            filtered_stderr=os.path.join(attempt_dir, "filtered_stderr.log"),
            attempt_dir=None if attempt_dir == os.devnull else attempt_dir,
        )
        for rank in range(nprocs):
            if attempt_dir == os.devnull:
                dest.tee_stdouts[rank] = os.devnull
                dest.tee_stderrs[rank] = os.devnull
                dest.error_files[rank] = os.devnull
                envs[rank]["TORCHELASTIC_ERROR_FILE"] = ""
                continue
            rank_dir = os.path.join(attempt_dir, str(rank))
            os.mkdir(rank_dir)
            if redirs[rank] & Std.OUT:
                dest.stdouts[rank] = os.path.join(rank_dir, "stdout.log")
            if redirs[rank] & Std.ERR:
                dest.stderrs[rank] = os.path.join(rank_dir, "stderr.log")
            if tees[rank] & Std.OUT:
                dest.tee_stdouts[rank] = dest.stdouts[rank]
            if tees[rank] & Std.ERR:
                dest.tee_stderrs[rank] = dest.stderrs[rank]
            if self._local_ranks_filter and rank not in self._local_ranks_filter:
                dest.tee_stdouts.pop(rank, None)
                dest.tee_stderrs.pop(rank, None)
                if dest.stdouts[rank] == console:
                    dest.stdouts[rank] = os.devnull
                if dest.stderrs[rank] == console:
                    dest.stderrs[rank] = os.devnull
            error_file = os.path.join(rank_dir, "error.json")
            dest.error_files[rank] = error_file
            envs[rank]["TORCHELASTIC_ERROR_FILE"] = error_file
        return dest

    def __repr__(self) -> str:
        return (
            f"DefaultLogsSpecs(root_log_dir={self._root_log_dir}, redirects={self._redirects}, "
            f"tee={self._tee}, local_ranks_filter={self._local_ranks_filter})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DefaultLogsSpecs):
            return NotImplemented
        return (
            self._root_log_dir == other._root_log_dir
            and self._redirects == other._redirects
            and self._tee == other._tee
            and self._local_ranks_filter == other._local_ranks_filter
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value like torch's
