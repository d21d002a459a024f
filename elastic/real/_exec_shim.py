"""Exec shim: tie a worker's life to its agent, then become the worker.

The fallback start path: workers normally start through the C extension
:mod:`elastic.real._spawn`, which does all of the below between ``vfork`` and ``exec``
without a second interpreter.  Where that extension was not built (no C compiler when
the package was installed), the launcher runs this file as
``python -I -S <this file> [--cgroup <dir>] <agent_pid> <executable> <argv0> [args...]``
(isolated, without site-packages: it starts in ~15 ms and imports only the standard
library).  It

0. with ``--cgroup``, moves itself into that cgroup v2 (writes ``0`` to its
   ``cgroup.procs``; see :mod:`elastic.real.cgroup`), so all the worker forks is born there;
1. sets ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel SIGKILLs this process when the
   thread that started it (the agent's event-loop thread) dies, whatever the cause;
2. checks ``getppid()`` is still the agent — if the agent died between the spawn and
   step 1, the death signal would never come, so the shim kills itself;
3. puts SIGPIPE and SIGXFSZ back to their defaults (Python ignores them and ignored
   signals survive ``exec``; ``subprocess`` restores them the same way);
4. ``execv``'s the worker, keeping the pid, the environment and the open descriptors.
   The death signal setting survives ``exec`` (not for set-user-ID programs).

A shim rather than ``preexec_fn``: running Python code between ``fork`` and ``exec`` in a
process with threads can deadlock, and ``os.posix_spawn`` has no hook for ``prctl``.
"""

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main() -> None:
    if sys.argv[1] == "--cgroup":
        try:
            fd = os.open(os.path.join(sys.argv[2], "cgroup.procs"), os.O_WRONLY)
            os.write(fd, b"0")
            os.close(fd)
        except OSError as e:
            sys.stderr.write(f"elastic: cannot join the cgroup {sys.argv[2]}: {e.strerror}\n")
            os._exit(126)
        del sys.argv[1:3]
    agent_pid = int(sys.argv[1])
    executable, argv = sys.argv[2], sys.argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        sys.stderr.write(f"elastic: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}\n")
        os._exit(126)
    if os.getppid() != agent_pid:
        os.kill(os.getpid(), signal.SIGKILL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    try:
        os.execv(executable, argv)
    except OSError as e:
        sys.stderr.write(f"elastic: cannot execute {executable}: {e.strerror}\n")
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


if __name__ == "__main__":
    main()
