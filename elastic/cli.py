"""The ``elastic`` command.

``elastic run`` is built in (torchrun's drop-in, :mod:`elastic.run`).  Other
subcommands are plugins found through the ``elastic.commands`` entry-point group —
``elastic sim`` comes from the simulator package this way, so the agent package never
imports the simulator.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

__all__ = ["entry", "main"]

USAGE = """usage: elastic {sim,run,report,real,compare,calibrate} ...

  elastic sim SCENARIO.yaml [--seed N] [--json]   run a failure scenario in the simulator
  elastic run [torchrun flags] SCRIPT [ARGS...]    launch real workers, like torchrun
  elastic report EVENTS.jsonl [--json]             the report of a real or simulated run
  elastic real SCENARIO.yaml [--time-scale K]      run a scenario on real processes
  elastic compare SCENARIO.yaml [--time-scale K]   the same scenario in both worlds
  elastic calibrate [-o FILE]                      measure this machine for the simulator
"""


def _plugins() -> dict[str, Callable[[Sequence[str]], int]]:
    # imported here: importlib.metadata costs ~15 ms that `elastic run` should not pay
    from importlib.metadata import entry_points

    return {ep.name: ep.load() for ep in entry_points(group="elastic.commands")}


def run_main(argv: Sequence[str]) -> int:
    launcher = importlib.import_module("elastic.run")
    code: int = launcher.main(list(argv))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "run":
        return run_main(rest)
    plugins = _plugins()
    if cmd in plugins:
        return plugins[cmd](rest)
    known = ", ".join(sorted({"run", *plugins}))
    print(f"elastic: unknown command {cmd!r}; expected one of {known}", file=sys.stderr)
    return 2


def entry() -> None:
    """The ``elastic`` command as a process: :func:`main`, then exit.

    ``elastic run`` leaves without the interpreter's teardown (``os._exit`` once its
    output is flushed): by then its workers are stopped, its files closed and its
    sidecar told to go, and walking a few hundred modules and their objects to free
    them would only delay the exit status a launcher waits for (≈3 ms).  Other commands
    (and an exception, which prints its traceback) exit the ordinary way.
    """
    code = main()
    if sys.argv[1:2] == ["run"]:
        logging = sys.modules.get("logging")
        if logging is not None:
            logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
