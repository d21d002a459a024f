"""The network store over loopback: the wire protocol, the server and the client together.

The Store port's own promises are pinned by the conformance suite
(tests/test_store_conformance.py); these tests pin what only a network store has:
framing, concurrency on one connection, authentication, limits, reconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest

from elastic.errors import StoreClosedError, StoreError
from elastic.real.clock import AsyncioClock
from elastic.real.netstore import NetStoreClient, StoreServer
from elastic.real.netstore_protocol import (
    MAX_FRAME,
    FrameDecoder,
    ProtocolError,
    decode_request,
    decode_response,
    encode_error,
    encode_ok,
    encode_request,
)
from elastic.rendezvous.dynamic import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)

T = TypeVar("T")
pytestmark = pytest.mark.timeout(60)


def run(body: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await body()

    return asyncio.run(main())


@asynccontextmanager
async def serving(**kw: Any) -> AsyncIterator[StoreServer]:
    server = StoreServer("127.0.0.1", 0, **kw)
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()


async def client(server: StoreServer, **kw: Any) -> NetStoreClient:
    return await NetStoreClient.connect(
        "127.0.0.1", server.port, clock=AsyncioClock(), read_timeout=5.0, **kw
    )


# -- the protocol, without sockets ----------------------------------------------------


def test_frames_split_anywhere_decode_to_the_same_requests() -> None:
    frames = [encode_request(i, "set", f"k{i}", b"v" * i, None) for i in range(1, 20)]
    wire = b"".join(frames)
    for step in (1, 3, 7, 64, len(wire)):
        dec = FrameDecoder()
        got = []
        for i in range(0, len(wire), step):
            got += [decode_request(b) for b in dec.feed(wire[i : i + step])]
        assert [(r.id, r.args[0]) for r in got] == [(i, f"k{i}") for i in range(1, 20)]
        assert dec.buffered == 0


def test_an_oversized_length_is_refused_from_the_header_alone() -> None:
    dec = FrameDecoder(max_frame=1024)
    with pytest.raises(ProtocolError, match="1025 bytes exceeds the limit of 1024"):
        dec.feed((1025).to_bytes(4, "big"))


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"\xc1", "malformed"),
        (b"\x92\x01", "malformed"),
        (encode_request(1, "nope")[4:], "unknown operation"),
        (encode_request(1, "get", 5, None)[4:], "get: expected a key"),
        (encode_request(1, "set", "k", "not bytes", None)[4:], "set: expected a value"),
        (encode_request(1, "get", "k")[4:], "get takes 2 arguments, got 1"),
        (encode_request(1, "watch", "p", 0, float("nan"))[4:], "expected a duration"),
        (encode_request(1, "grant_lease", 0)[4:], "lease ttl"),
        (encode_request(-1, "ping")[4:], "request id"),
        (b"\x91" * 5000 + b"\x90", "malformed"),
        (b"\x81\x90\x01", "malformed"),
    ],
)
def test_bad_request_bodies_raise_protocolerror_only(body: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_request(body)


def test_responses_round_trip_and_errors_carry_kind_and_message() -> None:
    ok = decode_response(encode_ok(7, [1, {"a": b"x"}])[4:])
    assert (ok.id, ok.ok, ok.value) == (7, True, [1, {"a": b"x"}])
    err = decode_response(encode_error(8, "timeout", "too slow")[4:])
    assert (err.id, err.ok, err.kind, err.message) == (8, False, "timeout", "too slow")
    with pytest.raises(ProtocolError):
        encode_ok(1, b"x" * (MAX_FRAME + 1))


# -- basic operations over loopback ---------------------------------------------------


def test_basic_operations_over_loopback() -> None:
    async def body() -> None:
        async with serving() as server:
            a, b = await client(server), await client(server)
            await a.set("k", b"v")
            assert await b.get("k") == b"v"
            assert await b.try_get("nope") is None
            assert await a.add("n", 2) == 2
            assert await b.add("n", -5) == -3
            assert await a.compare_set("c", None, b"1") == b"1"
            assert await b.compare_set("c", b"0", b"2") == b"1"
            await a.multi_set({"m/1": b"a", "m/2": b"b"})
            assert await b.multi_get(["m/1", "m/2"]) == [b"a", b"b"]
            rev, snap = await b.snapshot("m/")
            assert snap == {"m/1": b"a", "m/2": b"b"}
            assert await a.delete("m/1") and not await a.delete("m/1")
            assert await b.watch("m/", rev, timeout=1) == rev + 1
            with pytest.raises(StoreError, match="not an integer"):
                await a.add("k", 1)
            with pytest.raises(TypeError, match="bytes"):
                await a.set("k", "str")  # type: ignore[arg-type]
            await a.aclose()
            await b.aclose()
            with pytest.raises(StoreClosedError):
                await a.get("k")

    run(body)


def test_a_blocking_get_does_not_block_other_ops_on_the_same_connection() -> None:
    async def body() -> None:
        async with serving() as server:
            c = await client(server)
            waiting = [asyncio.create_task(c.get(f"w{i}", timeout=10)) for i in range(5)]
            watch = asyncio.create_task(c.watch("w", (await c.snapshot(""))[0], timeout=10))
            await asyncio.sleep(0.05)
            for i in range(50):  # many round trips while six waits are outstanding
                await c.set(f"x{i}", b"1")
                assert await c.try_get(f"x{i}") == b"1"
            assert not any(t.done() for t in waiting) and not watch.done()
            for i in range(5):
                await c.set(f"w{i}", str(i).encode())
            assert await asyncio.gather(*waiting) == [str(i).encode() for i in range(5)]
            assert await watch > 0
            await c.aclose()

    run(body)


def test_a_cancelled_wait_is_dropped_by_the_server() -> None:
    async def body() -> None:
        async with serving(max_watches_per_connection=3) as server:
            c = await client(server)
            for _ in range(10):  # more than the limit, one at a time: each is cancelled
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(c.get("never"), 0.02)
            await asyncio.sleep(0.05)
            conn = next(iter(server._conns))
            assert conn.pending == {}
            await c.aclose()

    run(body)


# -- the dynamic rendezvous over the network store ------------------------------------


def test_a_dynamic_rendezvous_of_three_agents_each_on_its_own_connection() -> None:
    async def body() -> None:
        async with serving(token="tok") as server:
            clock = AsyncioClock()
            ids = ["n2", "n0", "n1"]
            clients = [await client(server, token="tok") for _ in ids]
            settings = RendezvousSettings("job", 3, 3, RendezvousTimeout(20.0, 0.2, 5.0))
            handlers = [
                DynamicRendezvousHandler(n, f"host-{n}", settings, "c10d", c, clock, lease_ttl=2.0)
                for n, c in zip(ids, clients, strict=True)
            ]
            infos = await asyncio.gather(*(h.next_rendezvous_async() for h in handlers))
            assert [i.rank for i in infos] == [2, 0, 1]
            assert {i.world_size for i in infos} == {3}
            assert {i.round for i in infos} == {infos[0].round}
            assert {i.bootstrap_store_info.master_addr for i in infos} == {"host-n0"}
            for h in handlers:
                await h.shutdown_async()
            for c in clients:
                await c.aclose()

    run(body)


def test_a_lease_the_server_expired_is_refused_by_name_and_marked_dead() -> None:
    async def body() -> None:
        async with serving() as server:
            c = await client(server)
            lease = await c.grant_lease(0.2)
            lease.abandon()
            await asyncio.sleep(0.5)
            with pytest.raises(StoreError, match=f"lease {lease.id} is unknown to this store"):
                await c.set("k", b"v", lease=lease)
            assert not lease.alive()
            with pytest.raises(StoreError, match="has expired"):  # refused locally now
                await c.set("k", b"v", lease=lease)
            await c.aclose()

    run(body)


@pytest.mark.parametrize("peer", ["silent", "hangs-up"])
def test_a_program_that_does_not_speak_the_protocol_is_named_as_such(peer: str) -> None:
    """A torch TCPStore at the endpoint (torchrun's c10d rendezvous, a mixed job) takes the
    connection and then waits for more bytes, or hangs up: the error says so, instead of
    a bare timeout that reads as a network fault."""

    async def body() -> str:
        conns: list[asyncio.StreamWriter] = []

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if peer == "hangs-up":
                await reader.read(1)
                writer.close()
            else:
                conns.append(writer)  # holds it open, says nothing

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(StoreError) as info:
                await NetStoreClient.connect(
                    "127.0.0.1", port, clock=AsyncioClock(), connect_timeout=0.5
                )
            return str(info.value)
        finally:
            for w in conns:
                w.close()
            server.close()
            await server.wait_closed()

    msg = run(body)
    assert "is unreachable" in msg and "does not answer the store's handshake" in msg, msg
    assert "TCPStore" in msg and "\n" not in msg, msg


def test_a_host_that_is_not_there_is_not_taken_for_another_program() -> None:
    async def body() -> str:
        s = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = s.sockets[0].getsockname()[1]
        s.close()
        await s.wait_closed()  # nobody listens on the port now
        with pytest.raises(StoreError) as info:
            await NetStoreClient.connect(
                "127.0.0.1", port, clock=AsyncioClock(), connect_timeout=0.3
            )
        return str(info.value)

    msg = run(body)
    assert "is unreachable" in msg and "handshake" not in msg, msg


def test_the_host_warns_once_per_peer_of_connections_in_another_protocol(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A torchrun node's TCPStore client at an elastic store host: the host's log says
    what it is, once per peer host however often the client retries."""

    async def body() -> None:
        async with serving() as server:
            for _ in range(3):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(b"\x0f\x00\x00\x00\x00\x00\x00\x4e\x5e")  # not a frame of ours
                await writer.drain()
                assert await reader.read() != b""  # the protocol error frame, then EOF
                writer.close()
            c = await client(server)  # a real client is served as ever
            await c.set("k", b"v")
            await c.aclose()

    with caplog.at_level("WARNING", logger="elastic.real.netstore"):
        run(body)
    warned = [
        r.getMessage() for r in caplog.records if "does not speak its protocol" in r.getMessage()
    ]
    assert len(warned) == 1, warned
    assert "from 127.0.0.1" in warned[0] and "torch TCPStore" in warned[0], warned
