"""``elastic run``: torchrun's command line, launching one node's workers for real.

Exit status, as torchrun's: 0 when every worker succeeded; 1 when the job failed (the
failure report — torch's ``ChildFailedError`` layout, root cause last — goes to
stderr) or the agent was stopped by a signal (after its workers were stopped with
that signal); 2 for bad input (one line naming the flag, the value and what was
expected).  Like torchrun's ``@record``-decorated ``main``, a nested launch copies the
root cause's error file to its own ``TORCHELASTIC_ERROR_FILE``.

:func:`main` is torch's ``torch.distributed.run.main(args)``: it raises what torch
raises (``ValueError`` — our :class:`~elastic.errors.ConfigError` — for bad input,
``ChildFailedError`` when the job failed, ``SignalException`` when stopped) and returns
``None``.  :func:`run` is torch's ``run(args)``: the same, from an already parsed
namespace (:func:`parse_args`).  torch's other names here (``get_args_parser``,
``parse_args``, ``parse_min_max_nnodes``, ``determine_local_world_size``,
``config_from_args``, ``run_script_path``, ``get_rdzv_endpoint``, ``get_use_env``) are
:mod:`elastic.run_args`'s, loaded on first use.  :func:`cli_main` is the command
line's: it prints one line and returns the exit status above.

The import path is kept light (no torch, no simulator; the agent's modules are
imported only once the arguments are good): launch latency is a benchmark.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from elastic.real.reaper import ReaperSidecar
    from elastic.run_args import (
        config_from_args,
        determine_local_world_size,
        get_args_parser,
        get_rdzv_endpoint,
        get_use_env,
        parse_args,
        parse_min_max_nnodes,
        run_script_path,
    )

__all__ = [
    "cli_main",
    "config_from_args",
    "determine_local_world_size",
    "get_args_parser",
    "get_rdzv_endpoint",
    "get_use_env",
    "main",
    "parse_args",
    "parse_min_max_nnodes",
    "run",
    "run_script_path",
]

#: torch's names in torch.distributed.run that live in elastic.run_args (imported lazily:
#: the command line imports run_args itself only once it runs)
_RUN_ARGS_NAMES = frozenset(
    {
        "_get_logs_specs_class",
        "config_from_args",
        "determine_local_world_size",
        "get_args_parser",
        "get_rdzv_endpoint",
        "get_use_env",
        "parse_args",
        "parse_min_max_nnodes",
        "run_script_path",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _RUN_ARGS_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from elastic import run_args

    return getattr(run_args, name)


def run(args: argparse.Namespace) -> None:
    """torch's ``run(args)``: launch from parsed arguments (see :func:`parse_args`);
    raises as :func:`main` does.  ``args`` is not changed."""
    import argparse

    if not isinstance(args, argparse.Namespace):
        raise TypeError(
            f"run() takes the namespace parse_args() returns; got {type(args).__name__} "
            "(for a list of command-line arguments, call main(args))"
        )
    _run(None, raising=True, namespace=args)


_PROG = "elastic run"


def _configure_logging() -> None:
    # torch's rule: LOGLEVEL, default WARNING (torchrun's banners are warnings)
    level = os.environ.get("LOGLEVEL", "WARNING").upper()
    logging.basicConfig(
        level=level if level in logging.getLevelNamesMapping() else "WARNING",
        format="%(levelname)s:%(name)s:%(message)s",
    )


def main(args: Sequence[str] | None = None) -> None:
    """torch's ``run.main``: launch with ``args`` (default ``sys.argv[1:]``); raise on failure."""
    _run(args, raising=True)


def cli_main(argv: Sequence[str] | None = None) -> int:
    """Run ``elastic run`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    return _run(argv, raising=False)


def _run(
    argv: Sequence[str] | None, raising: bool, namespace: argparse.Namespace | None = None
) -> int:
    # The reaper sidecar first (no orphans even if the agent is SIGKILLed; see
    # elastic.real.reaper): its interpreter starts on the CPU that the agent's
    # single-threaded imports below leave idle, instead of next to the workers later.
    from elastic.real.reaper import ReaperSidecar

    reaper = ReaperSidecar()
    try:
        reaper.start()
    except OSError as e:  # no process can be started here: neither could the workers
        if raising:
            raise
        print(f"{_PROG}: error: cannot start the reaper sidecar: {e}", file=sys.stderr)
        return 1
    try:
        code = _main(argv, reaper, raising, namespace)
    except BaseException:
        # the agent dies of its own exception (or torch's API raises a failure): the
        # sidecar sweeps everything marked before it goes (a no-op when the agent
        # already let it go)
        reaper.close(sweep=True)
        raise
    reaper.close()  # a no-op when the agent already let it go
    return code


def _main(
    argv: Sequence[str] | None,
    reaper: ReaperSidecar,
    raising: bool,
    namespace: argparse.Namespace | None = None,
) -> int:
    from elastic.errors import ConfigError

    _configure_logging()
    # The agent's modules make tens of thousands of objects that live as long as the
    # process.  Collecting while they are made finds nothing; freezing them afterwards
    # keeps every later collection (and the one at exit) from walking them again.
    # Together ≈15 ms of each launch.  Only objects that exist now are frozen: a caller's
    # garbage made before this call is kept, not freed (one-off, small).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            if namespace is not None:
                from elastic.run_args import config_from_args

                config, cmd, cmd_args = config_from_args(namespace)
            else:
                from elastic.run_args import parse

                config, cmd, cmd_args = parse(sys.argv[1:] if argv is None else list(argv))
        except ConfigError as e:
            if raising:
                raise
            print(f"{_PROG}: error: {e}", file=sys.stderr)
            return 2
        except SystemExit as e:  # argparse: --help (0) or a bad flag (2, one line printed)
            if raising:
                raise
            return e.code if isinstance(e.code, int) else 2

        from elastic.agent.server.local_elastic_agent import SignalException
        from elastic.errors import ElasticError
        from elastic.launcher.api import LaunchError, elastic_launch

        _import_agent_modules()
        gc.freeze()
    finally:
        if gc_was_enabled:
            gc.enable()

    try:
        elastic_launch(config, cmd, reaper=reaper)(*cmd_args)
    except ConfigError as e:
        if raising:
            raise
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    except SignalException as e:
        if raising:
            raise
        print(f"{_PROG}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except LaunchError as e:
        if raising:
            raise
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 1
    except ElasticError as e:
        # ChildFailedError: its module (the error-file machinery) is imported by the
        # launcher only when there is a failure to report, so it is not named above
        from elastic.multiprocessing.errors import ChildFailedError

        if isinstance(e, ChildFailedError):
            _pass_root_cause_up(e)
        if raising:
            raise
        # the rest (the store or the rendezvous failed): one line, as torchrun's last
        print(f"{_PROG}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except (TimeoutError, ConnectionError) as e:
        # a store that could not be reached within read_timeout
        if raising:
            raise
        print(f"{_PROG}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


def _import_agent_modules() -> None:
    """What the agent imports once running, imported now so that it is frozen too."""
    import elastic.memstore
    import elastic.real.clock
    import elastic.real.workers
    import elastic.rendezvous.dynamic_rendezvous  # noqa: F401  # --standalone and c10d


def _pass_root_cause_up(e: object) -> None:
    """A nested launch: copy the root cause's error file to our own (torch's ``@record``)."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    from elastic.multiprocessing.errors import ChildFailedError, get_error_handler

    assert isinstance(e, ChildFailedError)
    _, failure = e.get_first_failure()
    if failure.error_file != "<N/A>":
        get_error_handler().dump_error_file(failure.error_file, failure.exitcode)


if __name__ == "__main__":
    sys.exit(cli_main())
