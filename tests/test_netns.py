"""The namespaces' switch (elastic.real.netns): a cut holds frames both ways and the heal
delivers them, so a TCP exchange cut in the middle completes at the heal, not later; and
nothing is left behind (namespaces, devices) however the block is left."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from elastic.real import netns

pytestmark = pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))

SERVER = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 5555))
s.listen()
print("up", flush=True)
c, _ = s.accept()
while (d := c.recv(100)):
    c.sendall(d)
"""
CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5555), timeout=30)
for line in sys.stdin:
    t = time.monotonic()
    c.sendall(b"x")
    c.recv(10)
    print(f"{time.monotonic() - t:.4f}", flush=True)
"""


def leftovers() -> list[str]:
    """Namespaces and devices this process's Hosts made that still exist."""
    tag = f"{netns._PREFIX}{os.getpid()}_"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    dev = f"elt{os.getpid() % 100000}x"
    return [w for w in names.split() if w.startswith(tag)] + [
        ln for ln in links.splitlines() if dev in ln
    ]


@pytest.mark.timeout(60)
def test_a_cut_holds_a_request_and_the_heal_delivers_it_at_once() -> None:
    with netns.Hosts(2) as hosts:
        server = subprocess.Popen(
            [*hosts.prefix(0), sys.executable, "-c", SERVER, hosts.addr(0)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        client = None
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "up"
            client = subprocess.Popen(
                [*hosts.prefix(1), sys.executable, "-c", CLIENT, hosts.addr(0)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert client.stdin is not None and client.stdout is not None
            client.stdin.write("go\n")
            client.stdin.flush()
            assert float(client.stdout.readline()) < 5  # through the switch
            hosts.cut(1)
            client.stdin.write("go\n")
            client.stdin.flush()
            time.sleep(3)  # TCP resends into the hold: its back-off passes 1.6 s by now
            t_heal = time.monotonic()
            hosts.heal(1)
            took = float(client.stdout.readline())
            answered = time.monotonic()
            # held, not lost: answered at the heal, not at TCP's next resend after it
            assert took >= 3 - 0.5  # the client's clock starts when it reads "go"
            assert answered - t_heal < 1.5, answered - t_heal  # TCP would resend at ~6 s
            assert hosts.dropped == 0
        finally:
            for p in (client, server):
                if p is not None:
                    p.kill()
                    p.communicate(timeout=10)
    assert leftovers() == []


@pytest.mark.timeout(30)
def test_nothing_is_left_when_the_block_ends_with_an_error() -> None:
    with pytest.raises(RuntimeError), netns.Hosts(3) as hosts:
        assert len(subprocess.run(["ip", "netns", "list"], capture_output=True,
                                  text=True).stdout.split()) >= 3  # fmt: skip
        hosts.cut(0)
        raise RuntimeError("boom")
    assert leftovers() == []


def test_stale_namespaces_of_a_dead_owner_are_swept() -> None:
    dead = f"{netns._PREFIX}999999999_0_0"  # no pid is that large
    subprocess.run(["ip", "netns", "add", dead], check=True, capture_output=True)
    try:
        assert dead in netns.sweep_stale()
    finally:
        subprocess.run(["ip", "netns", "del", dead], capture_output=True)
    assert dead not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True).stdout  # fmt: skip
