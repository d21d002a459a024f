"""Warm workers: a zygote that has imported ``--preload`` modules once and forks workers.

Theory of operation
-------------------
``elastic run --preload torch`` makes the agent start one extra process, the *zygote*:
this file run as ``python -u zygote.py <agent pid> <sys.path[0]> <modules>`` with the
agent's environment (plus the variables the agent adds to every worker), started by the
same C path as a worker (:func:`elastic.real.workers._spawn`: its own process group,
``PR_SET_PDEATHSIG=SIGKILL`` tied to the agent).  It is started as the agent's run
begins, so its imports overlap the rendezvous.  It imports the modules, checks it may
fork (below), and says ``ready`` (or why not) on a ``SOCK_SEQPACKET`` socket pair.

A launch of a Python worker (``python -u SCRIPT ARGS`` or ``python -u -m MODULE ARGS``,
the command ``elastic run`` builds) then goes to the zygote instead of ``exec``: the
agent sends the worker's argv and environment, and its stdin/stdout/stderr (the log
files or tee pipes; the agent's own streams otherwise) as descriptors (``SCM_RIGHTS``).
The zygote forks with ``clone(CLONE_PARENT)``: the worker is the **agent's** child, not
the zygote's, so everything the real workers port does for a started worker holds
unchanged: its pidfd, its exit from ``waitid`` (the kernel), its process group, the
whole-tree stop, its parent-death signal (set by the worker to SIGKILL, the agent
checked to be its parent after).  The fork is wrapped in CPython's own
``PyOS_BeforeFork``/``PyOS_AfterFork_*`` (the ``os.register_at_fork`` handlers run:
``random`` is reseeded, ``threading`` and ``logging`` re-initialise), and glibc's
thread id of the child is set by ``CLONE_CHILD_SETTID`` as glibc's ``fork`` does.

The forked worker then becomes what ``python -u SCRIPT ARGS`` would have been: its
environment is the worker's (``os.environ`` and the C ``environ``), and so is what
``/proc/<pid>/environ`` shows (the agent's process-tree markers live there, see
:mod:`elastic.real.proctree`; rewritten in place, in room the agent reserved in the
zygote's environment, as no privilege is needed for that) and ``/proc/<pid>/cmdline``
(``setproctitle``'s way: one space-separated string); its streams are
the worker's; its signal dispositions are those the zygote had before it imported
anything (a fresh interpreter's); ``sys.argv``, ``sys.orig_argv`` and ``sys.path[0]``
are the script's; the script runs in a fresh ``__main__`` module (``__file__``,
``__loader__``, ``__spec__`` as Python sets them; ``-m`` through
``runpy._run_module_as_main``, as Python does); an uncaught exception prints its
traceback and exits 1, ``KeyboardInterrupt`` ends the process by SIGINT, and the
interpreter shuts down as usual (non-daemon threads joined, ``atexit``).

Safe by construction.  The zygote forks only while it has one thread (checked after the
preload and before every fork), no CUDA context (``torch.cuda.is_initialized()``, and
no CUDA driver library mapped), on x86-64 or arm64 Linux with glibc.  Otherwise (or
when a module cannot be imported, or the zygote dies) the
agent logs one line saying why and starts its workers cold, as without ``--preload``.
A launch that is not a Python worker of the zygote's interpreter (``--no-python``, a
function entrypoint, other interpreter options) or whose import-time variables
(``PYTHON*``, ``LD_*``, ``OMP_*``, ``MKL_*``, ``KMP_*``) differ from the zygote's is
started cold too.

What a preloaded module must not do at import time: start a thread or a process, open
a CUDA context (``torch.cuda.init()``, a tensor on a GPU), open a connection or a file it
keeps, or read a per-worker variable (``RANK``, ``LOCAL_RANK``, ``CUDA_VISIBLE_DEVICES``,
``MASTER_PORT``, …): every worker shares what the zygote saw.  ``import torch`` does none
of these.  The zygote's ``PYTHONHASHSEED``-derived string hash seed is shared by the
workers it forks.

No orphans: the zygote dies with the agent (its death signal), exits when the agent
closes the socket, and is SIGKILLed and reaped by :meth:`Zygote.close`.  A forked worker
joins its group's cgroup (:mod:`elastic.real.cgroup`) before anything else; the zygote
stays outside it, so a group's stop, which kills that cgroup, leaves the zygote be.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Zygote", "python_command"]

logger = logging.getLogger(__name__)

_FILE = os.path.abspath(__file__)
_SOCK_FD = 3  # the zygote's end of the socket pair
_MAX_MESSAGE = 1 << 20  # bytes: a request (argv + environment) or a reply
_REPLY_TIMEOUT = 30.0  # seconds for a fork to be answered before the zygote counts as hung
_READY_TIMEOUT = 300.0  # seconds for the preload (an import that hangs must not hang the job)
# variables read when modules are imported or libraries loaded: a worker whose values
# differ from the zygote's would not get what a cold start gives it
_IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "GOMP_")
#: the last variable of the zygote's environment: room for a worker's own entries in
#: what ``/proc/<pid>/environ`` shows (see ``_Forker.rewrite_environ``); and the size of
#: the room in its argv for the worker's command line
ROOM_VAR = "ELASTIC_ZYGOTE_ROOM"
_ENV_ROOM = 64 * 1024
_ARGV_ROOM = 4096


def python_command(
    argv: Sequence[str], interpreter: str | None = None
) -> tuple[str, str, list[str]] | None:
    """``("script"|"module", target, args)`` if ``argv`` is ``[exe, argv0, "-u", …]`` for
    a script or ``-m`` module run by ``interpreter`` (default: this one); else None.

    ``argv`` is as :meth:`ProcessWorkers._start_one` builds it: the resolved executable,
    then the worker's own argv.
    """
    interpreter = interpreter or sys.executable
    if len(argv) < 4 or argv[2] != "-u":
        return None
    if os.path.realpath(argv[0]) != os.path.realpath(interpreter):
        return None
    if argv[3] == "-m":
        if len(argv) < 5 or not argv[4] or argv[4].startswith("-"):
            return None
        return "module", argv[4], list(argv[5:])
    if argv[3].startswith("-") or not argv[3]:
        return None
    return "script", argv[3], list(argv[4:])


def _path0(kind: str, target: str) -> str:
    """``sys.path[0]`` of ``python SCRIPT`` (the script's real directory) or ``python -m``."""
    if kind == "module":
        return os.getcwd()
    return os.path.dirname(os.path.realpath(target))


def _import_time_vars(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_IMPORT_TIME_PREFIXES)}


class Zygote:
    """The agent's handle on its zygote (one per agent; see the module docstring).

    :meth:`start` (on the agent's event loop, non-blocking), :meth:`ready` (await the
    preload's verdict), :meth:`spawn` (per worker), :meth:`close` (at the end).
    """

    def __init__(
        self,
        modules: Sequence[str],
        entrypoint: str,
        args: Sequence[str],
        env: Mapping[str, str],
    ) -> None:
        self.modules = list(modules)
        self._command = python_command([entrypoint, entrypoint, *map(str, args)])
        self._env = dict(env)
        self._import_vars = _import_time_vars(self._env)
        self._sock: socket.socket | None = None
        self._pidfd = -1
        self.pid: int | None = None
        #: why workers start cold (None while usable or before :meth:`ready`)
        self.unusable: str | None = None
        self.ready_info: dict[str, Any] = {}
        self._hello: Any = None  # asyncio.Future[None] once started
        self._warned: set[str] = set()

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the zygote; its imports run while the caller goes on (the rendezvous)."""
        import asyncio

        from elastic.real.workers import _spawn

        loop = asyncio.get_running_loop()
        self._hello = loop.create_future()
        if self._command is None:
            self._give_up("the command is not `python -u SCRIPT|-m MODULE ...`")
            return
        kind, target, _ = self._command
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [
            sys.executable,
            sys.executable,
            "-u",
            _FILE,
            str(os.getpid()),
            _path0(kind, target),
            ",".join(self.modules),
            "." * _ARGV_ROOM,
        ]
        env = {k: v for k, v in self._env.items() if k != ROOM_VAR}
        env[ROOM_VAR] = "." * _ENV_ROOM  # last
        try:
            self.pid = _spawn(argv, env, [(theirs.fileno(), _SOCK_FD)])
        except Exception as e:
            mine.close()
            self._give_up(f"cannot start the zygote: {e}")
            return
        finally:
            theirs.close()
        self._sock = mine
        self._pidfd = os.pidfd_open(self.pid)
        loop.add_reader(self._pidfd, self._on_zygote_exit)
        loop.add_reader(mine.fileno(), self._on_hello)

    def _on_hello(self) -> None:
        import asyncio

        assert self._sock is not None
        asyncio.get_running_loop().remove_reader(self._sock.fileno())
        try:
            data = self._sock.recv(_MAX_MESSAGE)
            msg = json.loads(data) if data else {}
        except (OSError, ValueError) as e:
            msg = {"unsafe": f"unreadable answer: {e}"}
        if not isinstance(msg, dict) or msg.get("ready") is not True:
            why = msg.get("unsafe") if isinstance(msg, dict) else None
            self._give_up(str(why or "the zygote exited during the preload"))
        else:
            self.ready_info = msg
            self._sock.settimeout(_REPLY_TIMEOUT)
        if not self._hello.done():
            self._hello.set_result(None)

    def _on_zygote_exit(self) -> None:
        import asyncio

        asyncio.get_running_loop().remove_reader(self._pidfd)
        self._reap()
        if self.unusable is None:
            self._give_up("the zygote exited")
        if self._hello is not None and not self._hello.done():
            self._hello.set_result(None)

    async def ready(self) -> bool:
        """Wait for the preload's end; True if workers can be forked from now on."""
        if self._hello is not None and not self._hello.done():
            import asyncio

            try:
                await asyncio.wait_for(asyncio.shield(self._hello), _READY_TIMEOUT)
            except TimeoutError:
                self._give_up(f"the preload took longer than {_READY_TIMEOUT:g}s")
                self.close()
        return self.unusable is None and self._sock is not None

    def _give_up(self, why: str) -> None:
        if self.unusable is None:
            self.unusable = why
            logger.warning("--preload %s: workers start cold: %s", ",".join(self.modules), why)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._hello is not None and not self._hello.done():
            self._hello.set_result(None)

    def _exited_within(self, seconds: float) -> bool:
        """Whether the zygote has exited, waiting at most ``seconds`` for it (its pidfd
        becomes readable at its exit); only on the path where a fork already failed."""
        import select

        if self._pidfd < 0:
            return True
        readable, _, _ = select.select([self._pidfd], [], [], seconds)
        return bool(readable)

    def _reap(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED)
            os.close(self._pidfd)
            self._pidfd = -1

    def close(self) -> None:
        """Stop the zygote and reap it (idempotent).  Its forked workers are not touched."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._pidfd >= 0:
            import asyncio
            import signal

            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            self._reap()
        if self.unusable is None:
            self.unusable = "closed"

    # -- workers ---------------------------------------------------------------------------

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        dups: Sequence[tuple[int, int]],
        cgroup: str | None = None,
    ) -> int | None:
        """Fork one worker (``argv``, ``dups`` and ``cgroup`` as for ``workers._spawn``);
        its pid, or None when this launch must start cold (the reason is logged once).
        The forked worker joins ``cgroup`` first thing, before it can fork; the zygote
        stays outside it (a group's stop kills the cgroup)."""
        sock = self._sock
        if sock is None or self.unusable is not None:
            return None
        if python_command(argv) is None:
            self._once("command", "a worker command that is not `python -u SCRIPT|-m MODULE`")
            return None
        ours = _import_time_vars(env)
        if ours != self._import_vars:
            diff = sorted(set(ours.items()) ^ set(self._import_vars.items()))
            self._once("env", f"the worker's {diff[0][0]} differs from the zygote's")
            return None
        fds = {0: 0, 1: 1, 2: 2}
        for source, target in dups:
            if target in fds:
                fds[target] = source
        request = json.dumps(
            {"argv": list(argv[1:]), "env": dict(env), "agent": os.getpid(), "cgroup": cgroup}
        ).encode()
        if len(request) > _MAX_MESSAGE:
            self._once("size", f"a request of {len(request)} bytes (limit {_MAX_MESSAGE})")
            return None
        try:
            socket.send_fds(sock, [request], [fds[0], fds[1], fds[2]])
            data = sock.recv(_MAX_MESSAGE)
            reply = json.loads(data) if data else None
        except (OSError, ValueError) as e:
            # a zygote killed meanwhile resets the connection a moment before its exit is
            # seen: say what happened, as when the exit is seen first
            gone = self._exited_within(0.5)
            self._give_up("the zygote exited" if gone else f"the zygote did not answer a fork: {e}")
            self.close()
            return None
        if isinstance(reply, dict) and isinstance(reply.get("cold"), str):
            self._once("cold", reply["cold"])
            return None
        if not isinstance(reply, dict) or not isinstance(reply.get("pid"), int):
            why = reply.get("error") if isinstance(reply, dict) else None
            self._give_up(str(why or "the zygote closed its socket"))
            self.close()
            return None
        pid: int = reply["pid"]
        with contextlib.suppress(OSError):  # the child does it too: the first one wins
            os.setpgid(pid, pid)
        return pid

    def _once(self, key: str, why: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("--preload: this worker starts cold: %s", why)


# ==========================================================================================
# The zygote process (this file run as a script).  Standard library only, imported lazily
# where it can be, so that a worker's sys.modules is close to a cold interpreter's.
# ==========================================================================================

_PR_SET_PDEATHSIG = 1
_CLONE_PARENT = 0x00008000
_CLONE_CHILD_SETTID = 0x01000000
_SIGCHLD = 17
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}


class _Forker:
    """``clone(CLONE_PARENT)`` wrapped as CPython wraps ``fork``; checks it is safe."""

    def __init__(self) -> None:
        import ctypes
        import platform

        self.ctypes = ctypes
        self.machine = platform.machine()
        self.api = ctypes.pythonapi
        self.libc = ctypes.CDLL(None, use_errno=True)  # releases the GIL: prctl only
        self.libc_gil = ctypes.PyDLL(None, use_errno=True)  # keeps it: the clone itself
        self.libc_gil.syscall.restype = ctypes.c_long
        self.libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong] + [
            ctypes.c_ulong
        ] * 2
        self.ctid = 0

    def unsafe_platform(self) -> str | None:
        import platform

        if self.machine not in _SYS_CLONE:
            return f"forking workers is not supported on {self.machine}"
        if platform.libc_ver()[0] != "glibc":
            return "forking workers needs glibc"
        self.ctid = self._tid_address()
        env_start, env_end = _mm_fields()[2:4]
        block = self.ctypes.string_at(env_start, env_end - env_start)
        if b"\0" + ROOM_VAR.encode() + b"=" not in b"\0" + block:
            return f"the zygote's environment has no {ROOM_VAR} (started by hand?)"
        return None

    def _tid_address(self) -> int:
        """The address of glibc's ``struct pthread.tid`` of this thread (0: not found)."""
        ctypes = self.ctypes
        self.libc.pthread_self.restype = ctypes.c_void_p
        base = self.libc.pthread_self()
        if not base:
            return 0
        tid = os.getpid()  # one thread: its tid is the pid
        hits = [
            off for off in range(0, 2048, 4) if ctypes.c_int.from_address(base + off).value == tid
        ]
        return base + hits[0] if len(hits) == 1 else 0

    def _prctl(self, *args: int) -> int:
        return int(self.libc.prctl(*args, *([0] * (5 - len(args)))))

    def fork(self) -> int:
        ctypes = self.ctypes
        flags = _CLONE_PARENT | _SIGCHLD | (_CLONE_CHILD_SETTID if self.ctid else 0)
        c = ctypes.c_long
        if self.machine == "x86_64":  # clone(flags, stack, parent_tid, child_tid, tls)
            args = (c(flags), c(0), c(0), c(self.ctid), c(0))
        else:  # arm64: clone(flags, stack, parent_tid, tls, child_tid)
            args = (c(flags), c(0), c(0), c(0), c(self.ctid))
        self.api.PyOS_BeforeFork()
        pid = int(self.libc_gil.syscall(c(_SYS_CLONE[self.machine]), *args))
        if pid == 0:
            self.api.PyOS_AfterFork_Child()
            return 0
        err = ctypes.get_errno()
        self.api.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(err, os.strerror(err))
        return pid

    def environ_block(self, env: Mapping[str, str]) -> bytes:
        """What to write over the environment block so ``/proc`` shows ``env`` (in place:
        no privilege needed; ``prctl(PR_SET_MM)`` would need ``CAP_SYS_RESOURCE``).

        The kernel shows the memory that held the environment at ``exec``: the zygote's.
        Entries the worker has unchanged stay where they are (a library that kept a
        pointer into one still reads the same string); the others are zeroed, and the
        worker's new or changed entries are written into the room the agent reserved at
        the end (:data:`ROOM_VAR`).  Empty entries between NULs are skipped by every
        reader (``proctree`` looks for ``\\0NAME=value``).
        """
        start, end = _mm_fields()[2:4]
        old = self.ctypes.string_at(start, end - start)
        new = bytearray(len(old))
        want = {os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()}
        kept: set[bytes] = set()
        room = -1
        offset = 0
        for entry in old.split(b"\0"):
            if entry.startswith(ROOM_VAR.encode() + b"="):
                room = offset
            elif entry in want and entry not in kept:
                kept.add(entry)
                new[offset : offset + len(entry)] = entry
            offset += len(entry) + 1
        extra = b"".join(e + b"\0" for e in sorted(want - kept))
        if room < 0 or room + len(extra) > len(new):
            raise ValueError(
                f"the worker's environment needs {len(extra)} more bytes than the "
                f"{len(new) - max(room, 0)} the zygote reserved"
            )
        new[room : room + len(extra)] = extra
        return bytes(new)

    def rewrite_environ(self, block: bytes) -> None:
        """Write :meth:`environ_block`'s result (in the forked worker)."""
        start, end = _mm_fields()[2:4]
        assert end - start == len(block)
        self.ctypes.memmove(start, block, len(block))

    def retitle(self, argv: Sequence[str]) -> None:
        """Make ``/proc/self/cmdline`` read ``argv`` (setproctitle's way, in place).

        Written space-separated, as ``setproctitle`` does, over the zygote's argv and its
        room; the last byte non-NUL tells the kernel to show the title up to its NUL.
        Left as it is when the title does not fit.
        """
        start, end = _mm_fields()[0:2]
        title = " ".join(argv).encode(errors="replace") + b"\0"
        size = end - start
        if len(title) >= size:
            return
        block = title + b"\0" * (size - len(title) - 1) + b"."
        self.ctypes.memmove(start, block, size)

    def set_pdeathsig(self, sig: int) -> None:
        self._prctl(_PR_SET_PDEATHSIG, sig)


def _mm_fields() -> tuple[int, int, int, int]:
    """(arg_start, arg_end, env_start, env_end) of this process, from /proc/self/stat."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    # fields[0] is the state (field 3); arg_start is field 48
    a, b, c, d = (int(x) for x in fields[45:49])
    return a, b, c, d


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _cuda_in_use() -> str | None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_init = getattr(cuda, "is_initialized", None)
    if callable(is_init) and is_init():
        return "a preloaded module initialised CUDA (torch.cuda.is_initialized())"
    with open("/proc/self/maps", "rb") as f:
        if b"/libcuda.so" in f.read():
            return "a preloaded module loaded the CUDA driver (libcuda.so)"
    return None


def _check(forker: _Forker) -> str | None:
    n = _threads()
    if n != 1:
        hint = ""
        if "numpy" in sys.modules and not os.environ.get("OMP_NUM_THREADS"):
            hint = " (numpy's BLAS starts threads at import unless OMP_NUM_THREADS=1 is set)"
        return f"the preloaded modules started {n - 1} thread(s); forking would lose them{hint}"
    return _cuda_in_use() or forker.unsafe_platform()


def _zygote_main() -> dict[str, Any] | None:
    """Preload, say ready, fork on request.  Returns only in a forked worker (its job)."""
    import importlib
    import signal
    import time

    t0 = time.monotonic()
    import atexit

    atexit.register(_exit_by_sigint)
    agent = int(sys.argv[1])
    sys.path[0] = sys.argv[2]
    modules = [m for m in sys.argv[3].split(",") if m]
    dispositions = {s: signal.getsignal(s) for s in signal.valid_signals()}
    sock = socket.socket(fileno=_SOCK_FD)
    unsafe = None
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # any failure: the agent starts cold
            unsafe = f"cannot import {name}: {type(e).__name__}: {e}"
            break
    forker = _Forker()
    forker.retitle(["elastic-zygote", "--preload", ",".join(modules), "agent", str(agent)])
    if unsafe is None:
        unsafe = _check(forker)
    if unsafe is not None:
        sock.send(json.dumps({"unsafe": unsafe}).encode())
        return None
    import gc

    gc.collect()
    gc.freeze()  # the preloaded objects are never scanned again: fewer copied pages
    sock.send(
        json.dumps(
            {"ready": True, "seconds": time.monotonic() - t0, "modules": len(sys.modules)}
        ).encode()
    )
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
        except OSError:
            return None
        if not data:
            return None  # the agent closed the socket
        try:
            req = json.loads(data)
            if len(fds) != 3:
                raise ValueError(f"{len(fds)} descriptors, expected 3")
            block = forker.environ_block(req["env"])
        except (KeyError, TypeError, ValueError) as e:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"cold": str(e)}).encode())
            continue
        try:
            n = _threads()
            if n != 1:
                raise ValueError(f"the zygote has {n} threads now; it cannot fork safely")
            pid = forker.fork()
        except (OSError, ValueError) as e:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": f"cannot fork: {e}"}).encode())
            continue
        if pid == 0:
            sock.close()
            return {
                "req": req,
                "environ": block,
                "fds": fds,
                "forker": forker,
                "dispositions": dispositions,
                "agent": agent,
            }
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())


def _become_worker(job: dict[str, Any]) -> tuple[str, str, list[str]]:
    """In the forked child: the worker's process state, as ``exec`` would have left it."""
    import signal

    forker: _Forker = job["forker"]
    cgroup = job["req"].get("cgroup")
    if isinstance(cgroup, str):  # first: nothing this process forks may be born outside
        try:
            fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError as e:
            os.write(2, f"elastic: cannot join the cgroup {cgroup}: {e.strerror}\n".encode())
            os._exit(126)
    forker.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != job["agent"]:  # the agent died before the death signal was set
        os.kill(os.getpid(), signal.SIGKILL)
    os.setpgid(0, 0)
    req = job["req"]
    argv: list[str] = list(req["argv"])  # the worker's own argv: [python, -u, ...]
    env: dict[str, str] = dict(req["env"])
    for target, fd in enumerate(job["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    for sig, handler in job["dispositions"].items():
        if handler is not None and signal.getsignal(sig) != handler:
            signal.signal(sig, handler)
    os.environ.clear()  # first: then no pointer of glibc's leads into the old strings
    os.environ.update(env)
    forker.rewrite_environ(job["environ"])
    forker.retitle(argv)
    sys.orig_argv = argv
    command = python_command([sys.executable, *argv])
    assert command is not None  # the agent sent only such commands
    return command


def _run_worker(kind: str, target: str, args: list[str]) -> None:
    """Run the script or module in a fresh ``__main__``, as ``python -u`` would."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.path[0] = _path0(kind, target)
    try:
        if kind == "module":
            import runpy

            sys.argv = ["-m", *args]
            runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]
            return
        sys.argv = [target, *args]
        path = os.path.abspath(target)
        try:
            with open(path, "rb") as f:
                source = f.read()
        except OSError as e:
            sys.stderr.write(
                f"{sys.executable}: can't open file {path!r}: [Errno {e.errno}] {e.strerror}\n"
            )
            raise SystemExit(2) from None
        from importlib.machinery import SourceFileLoader

        main.__file__ = path
        main.__cached__ = None  # type: ignore[attr-defined]
        main.__loader__ = SourceFileLoader("__main__", path)
        # dont_inherit: not this file's ``from __future__`` flags
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:  # what the interpreter does with it
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # without this function's frame
        if isinstance(e, KeyboardInterrupt):
            _interrupted.append(True)
        raise SystemExit(1) from None


_interrupted: list[bool] = []


def _exit_by_sigint() -> None:
    """Registered before the preload, so the last ``atexit`` function: Python ends a run
    that a ``KeyboardInterrupt`` ended by SIGINT, after its orderly shutdown."""
    if not _interrupted:
        return
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    _job = _zygote_main()
    if _job is None:
        os._exit(0)  # the zygote's end: nothing of it needs an orderly shutdown
    _command = _become_worker(_job)
    del _job
    _run_worker(*_command)
