"""What a bad or unauthenticated peer can do to the store server: cost its own connection.

Authentication (no token, wrong token, operations before hello, no hello at all) and the
limits (frame size, connections, waits per connection, slow readers, silent peers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any, TypeVar

import psutil
import pytest

from elastic.errors import StoreError
from elastic.real.clock import AsyncioClock
from elastic.real.netstore import NetStoreClient, StoreServer
from elastic.real.netstore_protocol import (
    FrameDecoder,
    Response,
    decode_response,
    encode_request,
)
from tests.test_netstore import run, serving

T = TypeVar("T")
pytestmark = pytest.mark.timeout(60)
TOKEN = "correct-horse-battery-staple"


async def client(server: StoreServer, **kw: Any) -> NetStoreClient:
    kw.setdefault("connect_timeout", 5.0)
    return await NetStoreClient.connect(
        "127.0.0.1", server.port, clock=AsyncioClock(), read_timeout=5.0, **kw
    )


class Raw:
    """A hand-driven connection: send any bytes, read the replies until the server closes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, server: StoreServer) -> Raw:
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        return cls(r, w)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def replies_until_closed(self, timeout: float = 10.0) -> list[Response]:
        dec, out = FrameDecoder(), []
        async with asyncio.timeout(timeout):
            while data := await self.reader.read(65536):
                out += [decode_response(b) for b in dec.feed(data)]
        self.writer.close()
        return out

    async def reply(self) -> Response:
        dec = FrameDecoder()
        async with asyncio.timeout(10):
            while True:
                data = await self.reader.read(65536)
                assert data, "the server closed the connection"
                frames = dec.feed(data)
                if frames:
                    return decode_response(frames[0])


# -- authentication -------------------------------------------------------------------


@pytest.mark.parametrize("given", [None, "wrong", TOKEN + "x", ""])
def test_a_missing_or_wrong_token_gets_one_clear_error(given: str | None) -> None:
    async def body() -> None:
        async with serving(token=TOKEN) as server:
            with pytest.raises(StoreError, match="refused us: wrong or missing token") as e:
                await client(server, token=given)
            assert TOKEN not in str(e.value)
            good = await client(server, token=TOKEN)  # the server is unharmed
            await good.set("k", b"v")
            await good.aclose()

    run(body)


def test_operations_before_hello_are_refused_and_the_connection_closed() -> None:
    async def body() -> None:
        async with serving(token=TOKEN) as server:
            raw = await Raw.open(server)
            await raw.send(encode_request(1, "set", "k", b"v", None))
            await raw.send(encode_request(2, "try_get", "k"))
            replies = await raw.replies_until_closed()
            assert [(r.id, r.ok, r.kind) for r in replies] == [(0, False, "auth")]
            assert "first request must be hello" in replies[0].message
            good = await client(server, token=TOKEN)
            assert await good.try_get("k") is None  # nothing was applied
            await good.aclose()

    run(body)


def test_a_server_without_token_accepts_a_client_with_one() -> None:
    async def body() -> None:
        async with serving() as server:
            c = await client(server, token="anything")
            await c.set("k", b"v")
            await c.aclose()

    run(body)


def test_a_connection_that_never_says_hello_is_closed_after_the_handshake_timeout() -> None:
    async def body() -> None:
        async with serving(token=TOKEN, handshake_timeout=0.3) as server:
            raw = await Raw.open(server)
            replies = await raw.replies_until_closed(timeout=5)
            assert [(r.id, r.kind) for r in replies] == [(0, "auth")]
            assert "no hello within 0.3s" in replies[0].message

    run(body)


def test_a_peer_trickling_a_partial_hello_is_still_cut_at_the_handshake_deadline() -> None:
    async def body() -> None:
        async with serving(token=TOKEN, handshake_timeout=0.5) as server:
            raw = await Raw.open(server)
            hello = encode_request(1, "hello", TOKEN)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            reading = asyncio.create_task(raw.replies_until_closed(timeout=5))
            with contextlib.suppress(ConnectionError):
                for b in hello[:-1]:  # one byte every 0.1 s: never a whole frame in time
                    if reading.done():
                        break
                    await raw.send(bytes([b]))
                    await asyncio.sleep(0.1)
            replies = await reading
            assert [(r.id, r.kind) for r in replies] == [(0, "auth")]
            assert len(hello) * 0.1 > 3.5  # a per-read timeout would let it go on this long
            assert loop.time() - t0 < 2.5
            assert server.connections == 0

    run(body)


def test_a_large_frame_before_authentication_is_refused_from_its_header() -> None:
    async def body() -> None:
        async with serving(token=TOKEN) as server:
            raw = await Raw.open(server)
            await raw.send((100_000).to_bytes(4, "big"))  # no body needed: refused at once
            replies = await raw.replies_until_closed(timeout=5)
            assert [(r.id, r.kind) for r in replies] == [(0, "protocol")]
            assert "exceeds the limit of 4096" in replies[0].message

    run(body)


def test_the_token_is_never_logged_or_shown(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with serving(token=TOKEN) as server:
            assert TOKEN not in repr(server)
            c = await client(server, token=TOKEN)
            assert TOKEN not in repr(c)
            with pytest.raises(StoreError):
                await client(server, token="bad-" + TOKEN)
            await c.aclose()

    with caplog.at_level(logging.DEBUG, logger="elastic"):
        run(body)
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


# -- limits ---------------------------------------------------------------------------


def test_an_oversized_frame_costs_only_its_connection() -> None:
    async def body() -> None:
        async with serving(max_frame=64 * 1024) as server:
            good = await client(server)
            raw = await Raw.open(server)
            await raw.send(encode_request(1, "hello", None))
            assert (await raw.reply()).ok
            await raw.send((64 * 1024 + 1).to_bytes(4, "big") + b"x" * 100)
            replies = await raw.replies_until_closed()
            assert [(r.id, r.kind) for r in replies] == [(0, "protocol")]
            await good.set("still", b"served")
            assert await good.get("still") == b"served"
            with pytest.raises(StoreError, match="frame limit"):
                await good.set("big", b"x" * (4 * 1024 * 1024))  # refused by the client
            await good.aclose()

    run(body)


def test_too_many_connections_get_one_clear_error() -> None:
    async def body() -> None:
        async with serving(max_connections=2) as server:
            a, b = await client(server), await client(server)
            with pytest.raises(StoreError, match="serves at most 2 connections"):
                await client(server, connect_timeout=1.0)
            await a.aclose()
            async with asyncio.timeout(10):  # the server sees the close
                while server.connections > 1:
                    await asyncio.sleep(0.01)
            c = await client(server)  # a slot is free again
            await c.set("k", b"v")
            assert await b.get("k") == b"v"
            await b.aclose()
            await c.aclose()

    run(body)


def test_too_many_waits_on_one_connection_are_refused_one_by_one() -> None:
    async def body() -> None:
        async with serving(max_watches_per_connection=2) as server:
            c = await client(server)
            w1 = asyncio.create_task(c.watch("p/", 0, timeout=10))
            w2 = asyncio.create_task(c.get("later", timeout=10))
            await asyncio.sleep(0.1)
            with pytest.raises(StoreError, match="already waits on 2 operations"):
                await c.watch("q/", 0, timeout=10)
            await c.set("later", b"1")  # plain ops still pass
            assert await w2 == b"1"
            await c.set("p/x", b"1")
            assert await w1 == 2
            await c.aclose()

    run(body)


def test_a_reader_too_slow_for_its_replies_is_dropped_and_others_are_served() -> None:
    async def body() -> None:
        async with serving(max_write_buffer=256 * 1024) as server:
            good = await client(server)
            await good.set("big", b"x" * 60_000)
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
            _, w = await asyncio.open_connection(sock=sock)
            w.write(encode_request(1, "hello", None))
            for i in range(2, 400):  # ~24 MB of replies that are never read
                w.write(encode_request(i, "try_get", "big"))
            await w.drain()
            async with asyncio.timeout(20):
                while server.connections > 1:
                    await good.set("tick", b"1")
                    await asyncio.sleep(0.05)
            assert await good.get("big") == b"x" * 60_000
            w.close()
            await good.aclose()

    run(body)


def test_a_silent_peer_is_dropped_but_a_pinging_client_is_kept() -> None:
    async def body() -> None:
        async with serving(idle_timeout=1.0) as server:
            c = await client(server)
            raw = await Raw.open(server)
            await raw.send(encode_request(1, "hello", None))
            assert (await raw.reply()).ok
            assert await raw.replies_until_closed(timeout=10) == []  # dropped after 1 s
            pending = asyncio.create_task(c.get("later", timeout=20))
            await asyncio.sleep(3.0)  # only a long wait outstanding: pings keep it
            await c.set("later", b"v")
            assert await pending == b"v"
            assert c.reconnects == 0
            await c.aclose()

    run(body)


def test_too_many_leases_on_one_connection_are_refused_until_some_go() -> None:
    async def body() -> None:
        async with serving(max_leases_per_connection=3) as server:
            c = await client(server)
            leases = [await c.grant_lease(30.0) for _ in range(3)]
            with pytest.raises(StoreError, match="holds 3 leases"):
                await c.grant_lease(30.0)
            await leases[0].revoke()
            extra = await c.grant_lease(30.0)
            assert extra.alive()
            await c.aclose()

    run(body)


def test_server_resources_are_flat_after_many_good_and_bad_connections() -> None:
    proc = psutil.Process()

    async def cycle(server: StoreServer, i: int) -> None:
        c = await client(server, token=TOKEN)
        lease = await c.grant_lease(0.05)
        await c.set(f"k{i % 10}", b"v", lease=lease)
        waiting = asyncio.create_task(c.get("never", timeout=30))
        await asyncio.sleep(0)
        await c.aclose()
        with contextlib.suppress(StoreError):
            await waiting
        raw = await Raw.open(server)
        await raw.send(b"\xff\xff\xff\xff")
        await raw.replies_until_closed()

    async def body() -> tuple[int, int, int, int]:
        async with serving(token=TOKEN) as server:
            for i in range(20):
                await cycle(server, i)
            await asyncio.sleep(0.2)
            fds, tasks = proc.num_fds(), len(asyncio.all_tasks())
            for i in range(200):
                await cycle(server, i)
            await asyncio.sleep(0.2)  # the last leases expire (ttl 0.05 after the drop)
            assert server.connections == 0
            return fds, proc.num_fds(), tasks, len(asyncio.all_tasks())

    fds0, fds1, tasks0, tasks1 = run(body)
    assert fds1 <= fds0 + 2, (fds0, fds1)
    assert tasks1 <= tasks0 + 2, (tasks0, tasks1)


def test_expired_leases_are_forgotten_so_a_long_lived_client_can_keep_granting() -> None:
    async def body() -> None:
        async with serving() as server:
            c = await client(server)
            for i in range(1500):  # more than max_leases_per_connection (1024) in all
                lease = await c.grant_lease(0.01)
                lease.abandon()
                if i % 100 == 99:
                    await asyncio.sleep(0.05)  # let the last hundred expire
            assert len(server.hosted.leases) < 1500
            await c.aclose()

    run(body)


def test_incomplete_frames_of_all_connections_together_are_bounded() -> None:
    async def body() -> None:
        async with serving(max_frame=64 * 1024, max_buffered=100_000) as server:
            good = await client(server)
            raws = []
            for _ in range(2):  # each holds most of a 60 kB frame; two exceed 100 kB
                raw = await Raw.open(server)
                await raw.send(encode_request(1, "hello", None))
                assert (await raw.reply()).ok
                await raw.send((60_000).to_bytes(4, "big") + b"\x00" * 59_000)
                raws.append(raw)
            replies = await raws[1].replies_until_closed()
            assert [(r.id, r.kind) for r in replies] == [(0, "limit")]
            assert "max_buffered 100000" in replies[0].message
            assert server.connections == 2  # the first is still served
            await good.set("k", b"v")
            raws[0].writer.close()
            await good.aclose()

    run(body)
