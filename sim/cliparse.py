"""The argument parser of every ``elastic`` plugin command: one line per bad input.

argparse answers a bad flag or value with its usage block and then the error (two lines
or more, and "invalid int value" rather than what was expected).  Every ``elastic``
command answers bad input in one line instead, as ``elastic run`` does: the command, the
flag, the value and what was expected, then where to read more, and exit status 2 (the
parser is elastic/cliparse.py's, which ``elastic run`` shares)::

    elastic sweep: --seeds: got 'abc'; expected an integer (see elastic sweep --help)

:func:`seed` is the ``--seed`` type every command shares (0 to 2**63-1, as the
scenario's ``seed:`` key).
"""

from __future__ import annotations

import argparse

from elastic.cliparse import OneLineParser, plain

__all__ = ["OneLineParser", "plain", "seed"]


def seed(text: str) -> int:
    """A ``--seed`` value: an integer from 0 to 2**63-1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected an integer ≥ 0") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"got {text}; expected an integer from 0 to 2**63-1")
    return value
