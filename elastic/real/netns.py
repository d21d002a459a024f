"""Several hosts on one machine: Linux network namespaces on a switch this process runs.

``Hosts(n)`` makes ``n`` network namespaces, each with its loopback up and one Ethernet
interface (``el0``, a TAP device) holding its own address in 198.18.0.0/24 (the block
reserved for network benchmarks, RFC 2544).  The other end of every TAP device is a file
descriptor of this process: a learning switch (a thread, :class:`_Switch`) forwards the
hosts' frames between them, so no frame leaves the namespaces made here.  ``prefix(i)``
is the command prefix that runs a program inside host ``i``.

A partition, as the simulator models it (``sim/store.py``): ``cut(i)`` takes host ``i``
off the switch; every frame it sends, and every frame sent to it, is *held* by the
switch (up to :data:`HELD_BYTES`), and ``heal(i)`` delivers them, in order, and forwards
again.  So a message in flight is neither lost nor answered while the link is down (a
TCP sender retransmits into the hold; nothing it sent is lost), a cut-off agent's lease
renewals stop reaching the store, which expires the lease on its own clock, and when the
link heals the connections carry on at once.  Why not a kernel link cut: a link taken
down drops frames, and TCP then resends with exponential back-off (up to 2 min), so the
first message after a heal would go through at a random time up to that back-off later;
the kernels this project runs on have neither the ``plug`` nor the ``netem`` qdisc, and
a token-bucket qdisc at a near-zero rate leaks a frame every few seconds.  Neighbour
(ARP) entries are permanent, so no resolution times out during a cut.

Everything made is removed on exit, even after a failure or Ctrl-C: the TAP devices
vanish with their descriptors, the namespaces are deleted.  Needs root, ``ip``
(iproute2) and ``/dev/net/tun``; :func:`available` says whether this machine can, and
why not::

    with Hosts(3) as hosts:
        p = subprocess.Popen([*hosts.prefix(0), "elastic", "run", ...])
        hosts.cut(2)
        ...
        hosts.heal(2)
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import selectors
import shutil
import struct
import subprocess
import threading
from types import TracebackType

__all__ = ["HELD_BYTES", "SUBNET", "Hosts", "available", "sweep_stale"]

SUBNET = "198.18.0"
# How much a cut link holds, both directions together; beyond it frames are dropped (a
# switch's buffer is finite too).  A cut agent sends a few renewals and pings a second.
HELD_BYTES = 64 << 20
IFACE = "el0"
_PREFIX = "elns"  # namespaces made here: elns<pid>_<tag>_<i>

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_MAX_FRAME = 65536
_serial = itertools.count()


def _ip(*args: str, stdin: str | None = None) -> None:
    subprocess.run(
        ["ip", *args], check=True, capture_output=True, timeout=10, input=stdin, text=True
    )


def available() -> str | None:
    """``None`` if namespaces can be made here, else the reason they cannot (one line)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (no TAP devices)"
    name = f"{_PREFIX}{os.getpid()}_chk"
    try:
        _ip("netns", "add", name)
    except (subprocess.CalledProcessError, OSError) as e:
        err = getattr(e, "stderr", "") or str(e)
        return f"ip netns add failed: {err.strip().splitlines()[-1] if err.strip() else e}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return None


def sweep_stale() -> list[str]:
    """Delete the namespaces a killed process of this module left (its pid is gone);
    returns their names.  A SIGKILLed owner cannot clean up; its successor can."""
    try:
        names = os.listdir("/run/netns")
    except OSError:
        return []
    gone = []
    for name in sorted(names):
        if not name.startswith(_PREFIX):
            continue
        pid = name[len(_PREFIX) :].split("_", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
            gone.append(name)
    return gone


def _mac(i: int) -> bytes:
    # locally administered, unicast: 02:00:c6:12:00:<i+1>
    return bytes([0x02, 0x00, 0xC6, 0x12, (i + 1) >> 8, (i + 1) & 0xFF])


def _mac_str(b: bytes) -> str:
    return ":".join(f"{x:02x}" for x in b)


class _Switch:
    """A learning switch over TAP descriptors, in a thread, with links that can be cut.

    Every frame is handled under one lock, by the switch's thread (frames arriving) or
    by :meth:`cut`/:meth:`heal`'s caller, so a heal's held frames reach their host
    before anything that arrives after the heal.
    """

    def __init__(self, fds: list[int]) -> None:
        self.fds = fds
        self.lock = threading.Lock()
        self.where: dict[bytes, int] = {}  # MAC -> port
        self.cut_ports: set[int] = set()
        self.held_out: dict[int, list[bytes]] = {}  # sent by a cut port
        self.held_in: dict[int, list[bytes]] = {}  # for a cut port
        self.held_bytes = 0
        self.dropped = 0
        self.forwarded = 0
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="netns-switch", daemon=True)
        self._stop = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=10)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        for port, fd in enumerate(self.fds):
            sel.register(fd, selectors.EVENT_READ, port)
        sel.register(self._wake_r, selectors.EVENT_READ, -1)
        try:
            while not self._stop:
                for key, _ in sel.select():
                    port = key.data
                    if port < 0:
                        continue
                    while True:
                        try:
                            frame = os.read(self.fds[port], _MAX_FRAME)
                        except (BlockingIOError, InterruptedError):
                            break
                        except OSError:  # the device is gone (closing)
                            sel.unregister(self.fds[port])
                            break
                        if not frame:
                            break
                        with self.lock:
                            self._from(port, frame)
        finally:
            sel.close()

    # -- under self.lock ---------------------------------------------------------------
    def _hold(self, queue: dict[int, list[bytes]], port: int, frame: bytes) -> None:
        if self.held_bytes + len(frame) > HELD_BYTES:
            self.dropped += 1
            return
        self.held_bytes += len(frame)
        queue.setdefault(port, []).append(frame)

    def _from(self, port: int, frame: bytes) -> None:
        if len(frame) < 14:
            return
        src = frame[6:12]
        if not src[0] & 1:
            self.where[src] = port
        if port in self.cut_ports:
            self._hold(self.held_out, port, frame)
            return
        dst = frame[0:6]
        to = self.where.get(dst) if not dst[0] & 1 else None
        targets = [to] if to is not None else [p for p in range(len(self.fds)) if p != port]
        for p in targets:
            if p == port:
                continue
            if p in self.cut_ports:
                self._hold(self.held_in, p, frame)
            else:
                self._write(p, frame)

    def _write(self, port: int, frame: bytes) -> None:
        try:
            os.write(self.fds[port], frame)
            self.forwarded += 1
        except OSError:
            self.dropped += 1

    # -- faults --------------------------------------------------------------------------
    def cut(self, port: int) -> None:
        with self.lock:
            self.cut_ports.add(port)

    def heal(self, port: int) -> None:
        with self.lock:
            if port not in self.cut_ports:
                return
            self.cut_ports.discard(port)
            inbound = self.held_in.pop(port, [])
            outbound = self.held_out.pop(port, [])
            self.held_bytes -= sum(map(len, inbound)) + sum(map(len, outbound))
            for frame in inbound:
                self._write(port, frame)
            for frame in outbound:
                self._from(port, frame)


class Hosts:
    """``n`` hosts on one switch (see the module docstring)."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"Hosts: n: got {n}; expected at least 1")
        self.n = n
        tag = f"{os.getpid()}_{id(self) % 10000}"
        self.names = [f"{_PREFIX}{tag}_{i}" for i in range(n)]
        self._made: list[str] = []
        self._fds: list[int] = []
        self._switch: _Switch | None = None

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]

    def _tap(self, i: int) -> int:
        """A TAP device made here (in this process's namespace), moved into host ``i``'s
        as ``el0``; the descriptor stays this process's end of the link."""
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._fds.append(fd)
        tmp = f"elt{os.getpid() % 100000}x{next(_serial) % 10000}"
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", tmp.encode(), _IFF_TAP | _IFF_NO_PI))
        _ip("link", "set", tmp, "address", _mac_str(_mac(i)), "netns", self.names[i], "name", IFACE)
        return fd

    def __enter__(self) -> Hosts:
        try:
            for i, ns in enumerate(self.names):
                _ip("netns", "add", ns)
                self._made.append(ns)
                self._tap(i)
                lines = [
                    "link set lo up",
                    f"addr add {self.addr(i)}/24 dev {IFACE}",
                    f"link set {IFACE} up",
                ] + [
                    f"neigh replace {self.addr(j)} lladdr {_mac_str(_mac(j))} dev {IFACE} "
                    "nud permanent"
                    for j in range(self.n)
                    if j != i
                ]
                _ip("-n", ns, "-batch", "-", stdin="\n".join(lines) + "\n")
            self._switch = _Switch(list(self._fds))
            self._switch.start()
        except BaseException:
            self.close()
            raise
        return self

    def cut(self, i: int) -> None:
        """Take host ``i`` off the switch: what it sends and what is sent to it is held."""
        assert self._switch is not None, "Hosts.cut outside its with block"
        self._switch.cut(i)

    def heal(self, i: int) -> None:
        """Put host ``i`` back: the held frames are delivered, in order, at once."""
        assert self._switch is not None, "Hosts.heal outside its with block"
        self._switch.heal(i)

    @property
    def dropped(self) -> int:
        """Frames the switch could not hold or deliver."""
        return self._switch.dropped if self._switch is not None else 0

    def close(self) -> None:
        if self._switch is not None:
            self._switch.stop()
            self._switch = None
        # a TAP device vanishes with its descriptor; then the namespaces go
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self._made.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
