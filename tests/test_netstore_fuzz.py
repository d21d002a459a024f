"""Random and mutated bytes thrown at a live store server cost it only those connections.

While hypothesis-generated payloads (garbage, truncated frames, huge lengths, valid
msgpack of the wrong shape, deep nesting, bit-flipped valid requests) arrive on fresh
connections, a good client keeps working, the server closes every bad connection, and
nothing escapes a connection handler (the loop's exception handler stays silent).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic.real.clock import AsyncioClock
from elastic.real.netstore import NetStoreClient, StoreServer
from elastic.real.netstore_protocol import MAX_FRAME, OPS, encode_request

pytestmark = pytest.mark.timeout(300)
TOKEN = "fuzz-token"


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=40),
)
objects = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=20,
)
valid = st.builds(
    lambda i, op, args: encode_request(i, op, *args),
    st.integers(0, 2**31),
    st.sampled_from(sorted(OPS)),
    st.lists(objects, max_size=4),
).filter(lambda f: len(f) < 10_000)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    good = bytearray(encode_request(draw(st.integers(1, 99)), "set", "k", b"value", None))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(good) - 1))
        good[i] = draw(st.integers(0, 255))
    return bytes(good)


payloads = st.one_of(
    st.binary(max_size=300),  # garbage
    valid.flatmap(lambda f: st.integers(0, len(f) - 1).map(lambda n: f[:n])),  # truncated
    st.integers(MAX_FRAME + 1, 2**32 - 1).map(lambda n: n.to_bytes(4, "big") + b"\0" * 8),
    objects.map(lambda o: frame(msgpack.packb(o))),  # wrong schema
    valid,  # right envelope, random arguments
    st.integers(100, 5000).map(lambda n: frame(b"\x91" * n + b"\xc0")),  # deep nesting
    mutated(),
)


async def throw(port: int, hello: bool, data: bytes, linger: bool) -> None:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        if hello:
            w.write(encode_request(1, "hello", TOKEN))
        w.write(data)
        await w.drain()
        if linger:  # read whatever comes back until the server closes or a moment passes
            try:
                async with asyncio.timeout(0.2):
                    while await r.read(65536):
                        pass
            except TimeoutError:
                pass
    except ConnectionError:
        pass
    finally:
        w.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(st.tuples(st.booleans(), payloads, st.booleans()), min_size=1, max_size=6))
def test_bad_frames_never_hurt_the_server_or_a_good_client(
    batch: list[tuple[bool, bytes, bool]],
) -> None:
    errors: list[dict[str, Any]] = []

    async def body() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
        server = StoreServer("127.0.0.1", 0, token=TOKEN, handshake_timeout=5, idle_timeout=5)
        await server.start()
        good = await NetStoreClient.connect(
            "127.0.0.1", server.port, token=TOKEN, clock=AsyncioClock(), read_timeout=10
        )
        try:
            waiting = asyncio.create_task(good.get("good/late", timeout=30))
            for i, (hello, data, linger) in enumerate(batch):
                await throw(server.port, hello, data, linger)
                await good.set(f"good/{i}", str(i).encode())
                assert await good.get(f"good/{i}") == str(i).encode()
            await good.set("good/late", b"ok")
            assert await waiting == b"ok"
            async with asyncio.timeout(10):  # every bad connection is gone
                while server.connections > 1:
                    await asyncio.sleep(0.01)
            assert good.reconnects == 0
        finally:
            await good.aclose()
            await server.aclose()

    asyncio.run(body())
    assert errors == []
