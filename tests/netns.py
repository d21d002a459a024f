"""Several hosts on one machine: Linux network namespaces on a private switch.

``Hosts(n)`` makes a switch namespace with a bridge, and ``n`` host namespaces, each
joined to the bridge by a veth pair and given its own address in 198.18.0.0/24 (the
block reserved for network benchmarks, RFC 2544; it never leaves the switch).  Every
namespace's loopback is up.  ``cut(i)`` takes host ``i``'s link down (its packets go
nowhere: a real partition, not a closed socket), ``heal(i)`` brings it back.
``prefix(i)`` is the command prefix that runs a program inside host ``i``.

Everything made is removed on exit, even after a failure.  Needs root and ``ip``
(iproute2); :func:`available` says whether this machine can, and why not::

    with Hosts(3) as hosts:
        p = subprocess.Popen([*hosts.prefix(0), "elastic", "run", ...])
        hosts.cut(2)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from types import TracebackType

__all__ = ["Hosts", "available"]

SUBNET = "198.18.0"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def available() -> str | None:
    """``None`` if namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    name = f"elchk{os.getpid() % 100000}"
    try:
        _ip("netns", "add", name)
    except (subprocess.CalledProcessError, OSError) as e:
        return f"ip netns add failed: {getattr(e, 'stderr', b'') or e!s}"
    _ip("netns", "del", name)
    return None


class Hosts:
    """``n`` hosts on one switch (see the module docstring)."""

    def __init__(self, n: int) -> None:
        self.n = n
        tag = f"{os.getpid() % 10000}{id(self) % 100}"
        self.switch = f"elsw{tag}"
        self.names = [f"elh{tag}_{i}" for i in range(n)]
        self._made: list[str] = []

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]

    def _veth(self, i: int) -> tuple[str, str]:
        # interface names are at most 15 characters
        return f"vh{i}x{os.getpid() % 100000}", f"vs{i}x{os.getpid() % 100000}"

    def __enter__(self) -> Hosts:
        try:
            _ip("netns", "add", self.switch)
            self._made.append(self.switch)
            sw = ["netns", "exec", self.switch, "ip"]
            _ip(*sw, "link", "add", "br0", "type", "bridge")
            _ip(*sw, "link", "set", "br0", "up")
            _ip(*sw, "link", "set", "lo", "up")
            for i, ns in enumerate(self.names):
                _ip("netns", "add", ns)
                self._made.append(ns)
                host_end, switch_end = self._veth(i)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", switch_end)
                _ip("link", "set", host_end, "netns", ns)
                _ip("link", "set", switch_end, "netns", self.switch)
                _ip(*sw, "link", "set", switch_end, "master", "br0")
                _ip(*sw, "link", "set", switch_end, "up")
                inside = ["netns", "exec", ns, "ip"]
                _ip(*inside, "link", "set", "lo", "up")
                _ip(*inside, "addr", "add", f"{self.addr(i)}/24", "dev", host_end)
                _ip(*inside, "link", "set", host_end, "up")
        except BaseException:
            self.close()
            raise
        return self

    def cut(self, i: int) -> None:
        """Take host ``i`` off the switch (its link goes down at the switch's end)."""
        _ip("netns", "exec", self.switch, "ip", "link", "set", self._veth(i)[1], "down")

    def heal(self, i: int) -> None:
        _ip("netns", "exec", self.switch, "ip", "link", "set", self._veth(i)[1], "up")

    def close(self) -> None:
        # deleting a namespace deletes the veth ends in it, and so their peers
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
