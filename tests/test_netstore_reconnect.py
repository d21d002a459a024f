"""The network store across failures: a store host that restarts, a client that is killed.

A client rides out a short outage (reconnect, resend what is safe to resend, resume
watches, renew leases the server still has); it says so clearly when the outage lasts
longer than its ``read_timeout`` or when an ``add``'s outcome is unknown.  A lease whose
owner process is SIGKILLed expires ``ttl`` after the kill, and not before.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from elastic.errors import StoreError
from elastic.real.clock import AsyncioClock
from elastic.real.netstore import HostedStore, NetStoreClient, StoreServer
from elastic.real.netstore_protocol import (
    FrameDecoder,
    decode_request,
    encode_ok,
)

T = TypeVar("T")
pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parent.parent


def run(body: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await body()

    return asyncio.run(main())


async def connect(port: int, **kw: float | str | None) -> NetStoreClient:
    kw.setdefault("read_timeout", 10.0)
    return await NetStoreClient.connect(
        "127.0.0.1",
        port,
        clock=AsyncioClock(),
        **kw,  # type: ignore[arg-type]
    )


def test_ops_during_a_restart_succeed_after_it_watches_resume_and_leases_survive() -> None:
    async def body() -> None:
        s1 = StoreServer("127.0.0.1", 0)
        await s1.start()
        port = s1.port
        c = await connect(port)
        lease = await c.grant_lease(1.0)
        await c.set("alive/c", b"1", lease=lease)
        rev, _ = await c.snapshot("w/")
        watch = asyncio.create_task(c.watch("w/", rev, timeout=30))
        get = asyncio.create_task(c.get("late", timeout=30))
        await asyncio.sleep(0.1)

        await s1.aclose()  # the store host goes away (its data stays in s1.hosted)
        in_gap = asyncio.create_task(c.set("gap", b"1"))
        added = asyncio.create_task(c.add("n", 1))  # not sent yet: safe to send later
        await asyncio.sleep(0.5)
        assert not in_gap.done() and not watch.done() and not get.done()

        s2 = StoreServer("127.0.0.1", port, hosted=s1.hosted)
        await s2.start()
        await asyncio.wait_for(in_gap, 10)
        assert await asyncio.wait_for(added, 10) == 1
        other = await connect(port)
        assert await other.get("gap") == b"1"
        await other.set("w/x", b"1")
        await other.set("late", b"L")
        assert await asyncio.wait_for(watch, 10) > rev
        assert await asyncio.wait_for(get, 10) == b"L"
        await asyncio.sleep(2.0)  # two ttls: renewals go on over the new connection
        assert lease.alive()
        assert await other.try_get("alive/c") == b"1"
        assert c.reconnects == 1
        await c.aclose()
        await other.aclose()
        await s2.aclose()

    run(body)


def test_a_store_restarted_with_fresh_data_ends_watches_and_leases() -> None:
    async def body() -> None:
        s1 = StoreServer("127.0.0.1", 0)
        await s1.start()
        port = s1.port
        c = await connect(port)
        for i in range(5):
            await c.set(f"k{i}", b"1")
        lease = await c.grant_lease(30.0)
        await c.set("alive/c", b"1", lease=lease)
        rev, _ = await c.snapshot("w/")
        watch = asyncio.create_task(c.watch("w/", rev, timeout=30))
        await asyncio.sleep(0.1)
        await s1.aclose()
        s2 = StoreServer("127.0.0.1", port, hosted=HostedStore())  # a new instance
        await s2.start()
        # the old revision means nothing to the new store: the watcher re-reads now
        assert await asyncio.wait_for(watch, 10) == 0
        assert not lease.alive()
        with pytest.raises(StoreError, match="expired"):
            await c.set("alive/c", b"1", lease=lease)
        assert await c.try_get("k0") is None
        await c.aclose()
        await s2.aclose()

    run(body)


def test_a_lease_is_neither_renewed_nor_revoked_on_a_new_instance_at_its_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal (or revoke) held over a restart goes only to the instance that granted the
    lease: another host later on the same address never sees it, and the lease ends here."""
    from elastic.real import netstore

    seen: list[str] = []
    decode = netstore.decode_request
    here = threading.get_ident()

    def recording(body: bytes, *a: int) -> object:
        req = decode(body, *a)
        if threading.get_ident() == here:  # not a host another test left in a thread
            seen.append(req.op)
        return req

    async def body() -> None:
        s1 = StoreServer("127.0.0.1", 0)
        await s1.start()
        port = s1.port
        c = await connect(port)
        lease = await c.grant_lease(0.6)  # renewed every 0.2 s
        gone = await c.grant_lease(30.0)
        await s1.aclose()
        await asyncio.sleep(0.5)  # renewals pile up against the closed port
        monkeypatch.setattr(netstore, "decode_request", recording)
        s2 = StoreServer("127.0.0.1", port, hosted=HostedStore())  # a new instance
        await s2.start()
        await c.set("k", b"1")  # reconnects
        await asyncio.sleep(0.6)
        await gone.revoke()
        assert not lease.alive() and not gone.alive()
        assert "keepalive" not in seen and "revoke" not in seen, seen
        assert "set" in seen
        await c.aclose()
        await s2.aclose()

    run(body)


def test_a_store_down_longer_than_read_timeout_is_a_clear_error_naming_it() -> None:
    async def body() -> None:
        s = StoreServer("127.0.0.1", 0)
        await s.start()
        c = await connect(s.port, read_timeout=0.5)
        await s.aclose()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(StoreError, match=f"127.0.0.1:{s.port} is unreachable"):
            await c.get("k")
        assert loop.time() - t0 < 5
        await c.aclose()

    run(body)


def test_an_add_whose_reply_is_lost_fails_as_unknown_while_get_and_grant_are_resent() -> None:
    """A server that drops the connection on the first add, get and grant_lease it sees."""
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = FrameDecoder()
        try:
            while data := await reader.read(65536):
                for body in dec.feed(data):
                    req = decode_request(body)
                    if req.op == "hello":
                        hello = {"instance": "x", "idle_timeout": 60.0, "revision": 0}
                        writer.write(encode_ok(req.id, hello))
                    elif req.op in ("add", "get", "grant_lease") and req.op not in seen:
                        seen.append(req.op)
                        writer.transport.abort()  # the request may or may not have applied
                        return
                    elif req.op == "get":
                        writer.write(encode_ok(req.id, b"v"))
                    elif req.op == "grant_lease":
                        writer.write(encode_ok(req.id, 7))
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def body() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = await connect(port)
        with pytest.raises(StoreError, match=r"add on the store .* whether it took effect is"):
            await c.add("n", 1)
        assert await c.get("k") == b"v"
        lease = await c.grant_lease(60.0)  # resent: a lost grant's lease expires unseen
        assert lease.id == 7
        assert seen == ["add", "get", "grant_lease"]
        await c.aclose()
        server.close()
        await server.wait_closed()

    run(body)


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from elastic.real.clock import AsyncioClock
    from elastic.real.netstore import NetStoreClient

    async def main() -> None:
        port, token, ttl = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
        c = await NetStoreClient.connect("127.0.0.1", port, token=token, clock=AsyncioClock())
        lease = await c.grant_lease(ttl)
        await c.set("alive/child", b"1", lease=lease)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_the_lease_of_a_sigkilled_client_expires_ttl_later_and_not_before() -> None:
    ttl = 1.5
    pids: list[int] = []

    async def body() -> float:
        server = StoreServer("127.0.0.1", 0, token="t0k")
        await server.start()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            str(server.port),
            "t0k",
            str(ttl),
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        pids.append(proc.pid)
        watcher = await connect(server.port, token="t0k")
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line == b"ready\n"
            await asyncio.sleep(2 * ttl)  # the child renews from its own process
            assert await watcher.try_get("alive/child") == b"1"
            rev, _ = await watcher.snapshot("alive/")
            loop = asyncio.get_running_loop()
            proc.send_signal(signal.SIGKILL)
            killed = loop.time()
            await proc.wait()
            await asyncio.sleep(ttl / 2)
            assert await watcher.try_get("alive/child") == b"1", "expired before ttl"
            await watcher.watch("alive/", rev, timeout=ttl + 20)
            took = loop.time() - killed
            assert await watcher.try_get("alive/child") is None
            return took
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await watcher.aclose()
            await server.aclose()

    took = run(body)
    assert ttl - 0.05 <= took <= ttl + 1.5, took
    # this test's own child is gone (other tests' dead children are not this test's)
    (pid,) = pids
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
