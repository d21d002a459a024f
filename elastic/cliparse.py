"""argparse's messages as one line: the flag, the value and what was expected.

argparse answers a bad flag or value with its usage block and then the error (two lines or
more, and "invalid int value" rather than what was expected).  ``elastic run`` and every
``elastic`` plugin command (sim/cliparse.py) answer in one line instead::

    elastic sweep: --seeds: got 'abc'; expected an integer (see elastic sweep --help)
"""

from __future__ import annotations

import argparse
import re
from typing import NoReturn

from elastic.errors import one_line

__all__ = ["OneLineParser", "plain"]

# argparse's own message for a value its ``type`` refused (ValueError/TypeError):
# "argument --seeds: invalid int value: 'abc'" ("-o/--output" for a flag with aliases)
_INVALID = re.compile(r"argument (?P<names>[^:\s]+): invalid (?P<type>\w+) value: (?P<v>.*)")
_EXPECTED = {"int": "an integer", "float": "a number"}
# a value outside ``choices``: "argument --x: invalid choice: 'v' (choose from 'a', 'b')"
_CHOICE = re.compile(
    r"argument (?P<names>[^:\s]+): invalid choice: (?P<v>.*) \(choose from (?P<choices>.*)\)",
    re.DOTALL,
)
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
    if m := _CHOICE.fullmatch(message):
        return f"{_flag(m['names'])}: got {m['v']}; expected one of {m['choices']}"
    if m := _ARGUMENT.fullmatch(message):
        return f"{_flag(m['names'])}: {m['rest']}"
    return message


class OneLineParser(argparse.ArgumentParser):
    """argparse, whose errors are one line (the flag, the value, what was expected)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {one_line(plain(message))} (see {self.prog} --help)\n")
