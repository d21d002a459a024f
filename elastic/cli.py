"""The ``elastic`` command.

``elastic run`` is built in (torchrun's drop-in, :mod:`elastic.run`).  Other
subcommands are plugins found through the ``elastic.commands`` entry-point group —
``elastic sim`` comes from the simulator package this way, so the agent package never
imports the simulator.  ``elastic --help`` lists every command found, with the first
line of its function's docstring; ``elastic --version`` prints the version.

A plugin command never ends in a traceback for the two things a user does to any
command: a closed output pipe (``elastic sim … | head``) ends it quietly with 141, as a
tool killed by SIGPIPE; Ctrl-C prints one line and exits 130.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from types import FrameType

__all__ = ["entry", "main"]

DIST_NAME = "elastic-sim-agent"
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended
RUN_HELP = "Launch real workers and restart them on failure, like torchrun (its flags)."


def _plugins() -> dict[str, Callable[[Sequence[str]], int]]:
    # imported here: importlib.metadata costs ~15 ms that `elastic run` should not pay
    from importlib.metadata import entry_points

    return {ep.name: ep.load() for ep in entry_points(group="elastic.commands")}


def run_main(argv: Sequence[str]) -> int:
    launcher = importlib.import_module("elastic.run")
    code: int = launcher.cli_main(list(argv))
    return code


def usage(plugins: dict[str, Callable[[Sequence[str]], int]]) -> str:
    """``elastic --help``: every command, built in or plugin, with one line each."""
    helps = {"run": RUN_HELP}
    for name, fn in plugins.items():
        doc = (fn.__doc__ or "").strip().splitlines()
        helps.setdefault(name, doc[0] if doc else "")
    names = sorted(helps)
    width = max(len(n) for n in names)
    lines = [
        f"usage: elastic {{{','.join(names)}}} ...",
        "",
        "commands:",
        *(f"  {n:<{width}}  {helps[n]}" for n in names),
        "",
        "options:",
        "  -h, --help  show this and exit",
        "  --version   print the version and exit",
        "",
        "`elastic COMMAND --help` shows a command's flags.",
    ]
    return "\n".join(lines) + "\n"


def version() -> str:
    from elastic import __version__

    return f"{DIST_NAME} {__version__} (import package: elastic)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--version"]:
        print(version())
        return 0
    if not args or args[0] in ("-h", "--help"):
        text = usage(_plugins())
        print(text, end="", file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "run":
        return run_main(rest)
    try:
        # loading a plugin imports its package (the simulator: most of a second on a busy
        # machine), where a Ctrl-C must end it the same way as later
        plugins = _plugins()
    except KeyboardInterrupt:
        print(f"\nelastic {cmd}: interrupted", file=sys.stderr)
        return INTERRUPTED
    if cmd in plugins:
        return _guarded(cmd, plugins[cmd], rest)
    known = ", ".join(sorted({"run", *plugins}))
    print(f"elastic: unknown command {cmd!r}; expected one of {known}", file=sys.stderr)
    return 2


def _guarded(name: str, command: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """Run a plugin command; a closed output pipe or Ctrl-C ends it without a traceback.

    Ctrl-C can land between the creation of a coroutine and its first step (a simulated
    store operation, say); unwinding then drops it un-awaited and Python would warn about
    it on stderr before the one line below.  The interrupt handler silences exactly that
    warning, and only once an interrupt has happened.
    """
    previous = signal.getsignal(signal.SIGINT)
    ours = (
        previous is signal.default_int_handler
        and threading.current_thread() is threading.main_thread()
    )
    if ours:
        signal.signal(signal.SIGINT, _interrupt)
    try:
        code = command(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _silence_stdout()
        return 141  # 128 + SIGPIPE: what the shell shows for a tool SIGPIPE killed
    except KeyboardInterrupt:
        print(f"\nelastic {name}: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        if ours:
            signal.signal(signal.SIGINT, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    warnings.filterwarnings(
        "ignore", message="coroutine .* was never awaited", category=RuntimeWarning
    )
    raise KeyboardInterrupt


def _silence_stdout() -> None:
    # the reader is gone: stdout's buffered rest would fail again at exit ("Exception
    # ignored ... BrokenPipeError"), so it goes to /dev/null instead
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def entry() -> None:
    """The ``elastic`` command as a process: :func:`main`, then exit.

    ``elastic run`` leaves without the interpreter's teardown (``os._exit`` once its
    output is flushed): by then its workers are stopped, its files closed and its
    sidecar told to go, and walking a few hundred modules and their objects to free
    them would only delay the exit status a launcher waits for (≈3 ms).  An interrupted
    plugin command (130) leaves the same way: its half-run work (a simulation's suspended
    coroutines) has nothing to close, and collecting it at exit would print warnings
    after the one line said.  Other commands exit the ordinary way.
    """
    code = main()
    if sys.argv[1:2] == ["run"] or code == INTERRUPTED:
        logging = sys.modules.get("logging")
        if logging is not None:
            logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
