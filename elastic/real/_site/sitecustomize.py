"""Run at the start of every Python worker ``elastic run`` starts (this directory is put
first on the workers' ``PYTHONPATH``); plain standard library, no import of ``elastic``.

What it does: a worker that leaves its torch.distributed process group initialised and
ends normally has it destroyed at exit (``atexit``, after the program's own handlers).
Why: with torchrun the workers' store is the agent's, but here worker rank 0 hosts it
(``TORCHELASTIC_USE_AGENT_STORE`` is False), and torch's TCPStore server, destroyed by
the interpreter's teardown while peers are still connected, often aborts the process
(SIGABRT, "terminate called without an active exception") after its work is done.
Destroying the group first is what torch's documentation asks programs to do; a
program that does it itself is unaffected (the group is then no longer initialised).
A worker that ends by an unhandled exception is left as it is (its exit code reports
the failure either way, and a destroy could wait on peers that are gone).

The ``sitecustomize`` this one shadows (a distribution's or the user's, later on
``sys.path``) is then run as Python would have run it, and this directory is taken out of
``PYTHONPATH`` and ``sys.path`` again (the worker's environment is torchrun's).
``ELASTIC_DESTROY_AT_EXIT=0`` in the workers' environment turns the hook off.
"""

from __future__ import annotations

import atexit
import os
import sys


def _install() -> None:
    failed: list[bool] = []
    previous_hook = sys.excepthook

    def excepthook(*exc: object) -> None:
        failed.append(True)
        previous_hook(*exc)  # type: ignore[arg-type]

    sys.excepthook = excepthook

    def destroy() -> None:
        dist = sys.modules.get("torch.distributed")
        if dist is None or failed:
            return
        try:
            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # the program's exit status is what matters now
            pass

    atexit.register(destroy)


def _chain() -> None:
    """Run the ``sitecustomize`` later on ``sys.path``, if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _leave_no_trace() -> None:
    """Take this directory out of ``PYTHONPATH`` and ``sys.path`` again: the worker sees the
    environment torchrun would give it, and its own subprocesses do not get the hook."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if p != here]
    path = os.environ.get("PYTHONPATH")
    if path == here:
        del os.environ["PYTHONPATH"]
    elif path is not None and path.startswith(here + os.pathsep):
        os.environ["PYTHONPATH"] = path[len(here) + 1 :]


if os.environ.get("ELASTIC_DESTROY_AT_EXIT", "1") != "0":
    _install()
_chain()
_leave_no_trace()
