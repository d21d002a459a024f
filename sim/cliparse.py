"""The argument parser of every ``elastic`` plugin command: one line per bad input.

argparse answers a bad flag or value with its usage block and then the error (two lines
or more, and "invalid int value" rather than what was expected).  Every ``elastic``
command answers bad input in one line instead, as ``elastic run`` does: the command, the
flag, the value and what was expected, then where to read more, and exit status 2::

    elastic sweep: --seeds: got 'abc'; expected an integer (see elastic sweep --help)

:func:`seed` is the ``--seed`` type every command shares (0 to 2**63-1, as the
scenario's ``seed:`` key).
"""

from __future__ import annotations

import argparse
import re
from typing import NoReturn

from elastic.errors import one_line

__all__ = ["OneLineParser", "plain", "seed"]

# argparse's own message for a value its ``type`` refused (ValueError/TypeError):
# "argument --seeds: invalid int value: 'abc'" ("-o/--output" for a flag with aliases)
_INVALID = re.compile(r"argument (?P<names>[^:\s]+): invalid (?P<type>\w+) value: (?P<v>.*)")
_EXPECTED = {"int": "an integer", "float": "a number"}
# an ArgumentTypeError's message or any other about one argument: "argument --x: ..."
_ARGUMENT = re.compile(r"argument (?P<names>[^:\s]+): (?P<rest>.*)", re.DOTALL)


def _flag(names: str) -> str:
    """The flag to name among its aliases: the first long one (``--output``, not ``-o``)."""
    aliases = names.split("/")
    return next((a for a in aliases if a.startswith("--")), aliases[0])


def plain(message: str) -> str:
    """argparse's ``message`` as the flag, the value and what was expected."""
    if m := _INVALID.fullmatch(message):
        expected = _EXPECTED.get(m["type"], f"a {m['type']}")
        return f"{_flag(m['names'])}: got {m['v']}; expected {expected}"
    if m := _ARGUMENT.fullmatch(message):
        return f"{_flag(m['names'])}: {m['rest']}"
    return message


class OneLineParser(argparse.ArgumentParser):
    """argparse, whose errors are one line (the flag, the value, what was expected)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {one_line(plain(message))} (see {self.prog} --help)\n")


def seed(text: str) -> int:
    """A ``--seed`` value: an integer from 0 to 2**63-1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected an integer ≥ 0") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"got {text}; expected an integer from 0 to 2**63-1")
    return value
