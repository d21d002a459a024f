"""``python -m elastic.launch``: torch's legacy launcher (``torch.distributed.launch``).

Deprecated in torch in favour of torchrun (``elastic run``), and kept because older
training scripts are still started with it.  It is ``elastic run`` with one more flag,
``--use-env``/``--use_env`` (default off): without it each worker's command line gets
``--local-rank=<its local rank>`` before the script's own arguments, as the old launcher
did; with it the rank is only in the environment (``LOCAL_RANK``), as with torchrun.
``--no-python`` needs ``--use-env`` (a program that is not Python cannot be assumed to
take ``--local-rank``).  :func:`main` warns (``FutureWarning``) with torch's text, then
launches as :func:`elastic.run.run` does.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

__all__ = ["get_args_parser", "launch", "main", "parse_args"]

_DEPRECATED = (
    "The module torch.distributed.launch is deprecated\n"
    "and will be removed in future. Use torchrun.\n"
    "Note that --use-env is set by default in torchrun.\n"
    "If your script expects `--local-rank` argument to be set, please\n"
    "change it to read from `os.environ['LOCAL_RANK']` instead. See \n"
    "https://pytorch.org/docs/stable/distributed.html#launch-utility for \n"
    "further instructions\n"
)


def get_args_parser() -> argparse.ArgumentParser:
    """``elastic run``'s parser plus ``--use-env``."""
    from elastic.run_args import get_args_parser as run_parser

    parser = run_parser(prog="python -m elastic.launch")
    parser.add_argument(
        "--use-env",
        "--use_env",
        default=False,
        action="store_true",
        help="Pass the local rank in the LOCAL_RANK environment variable only; without "
        "this flag each worker also gets --local-rank=<rank> as its first argument.",
    )
    return parser


def parse_args(args: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``args`` (default ``sys.argv[1:]``) with :func:`get_args_parser`."""
    from elastic.run_args import check_env_values

    ns = get_args_parser().parse_args(list(args) if args is not None else None)
    check_env_values(ns)
    return ns


def launch(args: argparse.Namespace) -> None:
    """Launch from parsed arguments; ``ValueError`` for ``--no-python`` without
    ``--use-env``; raises what :func:`elastic.run.run` raises."""
    if args.no_python and not args.use_env:
        raise ValueError(
            "When using the '--no-python' flag, you must also set the '--use-env' flag."
        )
    from elastic.run import run

    run(args)


def main(args: Sequence[str] | None = None) -> None:
    """Warn that the launcher is deprecated, then parse and launch."""
    warnings.warn(_DEPRECATED, FutureWarning, stacklevel=2)
    launch(parse_args(args))


def _cli() -> int:
    """``python -m elastic.launch``: as ``elastic run``, one line for bad input."""
    from elastic.errors import ConfigError
    from elastic.run import _run

    prog = "python -m elastic.launch"
    warnings.warn(_DEPRECATED, FutureWarning, stacklevel=1)
    try:
        ns = parse_args(sys.argv[1:])
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if ns.no_python and not ns.use_env:
        print(
            f"{prog}: error: --no-python: needs --use-env as well (a program that is not "
            "Python is not given --local-rank)",
            file=sys.stderr,
        )
        return 2
    return _run(None, raising=False, namespace=ns)


if __name__ == "__main__":
    sys.exit(_cli())
