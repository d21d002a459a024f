"""The network store: one agent hosts a :class:`StoreServer`, every agent talks to it
through a :class:`NetStoreClient` (the Store port over TCP; torch's ``c10d`` backend).
``watch_snapshot`` is one wire op, answered by the host at the wake with the read
(:class:`~elastic.store.WatchSnapshotStore`; a host that predates it is detected at
``hello`` and the client falls back to ``watch`` then ``snapshot``).

Theory of operation
-------------------
The server keeps its data in a :class:`~elastic.memstore.MemoryStore` on an
:class:`~elastic.real.clock.AsyncioClock` (a :class:`HostedStore`), so revisions, waits,
watches, ``compare_set`` and lease expiry mean exactly what they mean in memory and in
the simulator.  The wire format is :mod:`elastic.real.netstore_protocol` (msgpack frames,
a request id per request: a blocking ``get`` or ``watch`` runs as its own task and holds
up nothing else on its connection).

Leases: the server decides expiry.  A lease granted over the wire starts its one expiry
timer at once; every ``keepalive`` from its client pushes the deadline to ``ttl`` from
now (:meth:`~elastic.memstore._Lease.refresh`: no new timer).  When the owning connection
drops, the deadline is pushed to ``ttl`` from the drop, so a killed owner's keys vanish
``ttl`` after it died and not before.  The client renews every ``ttl/3`` in the
background; :meth:`NetLease.abandon` sends one last renewal and stops.

Authentication: with a ``token`` the first request on a connection must be ``hello``
carrying it (compared in constant time); anything else gets one ``auth`` error and the
connection is closed.  The token is never logged.

What a bad peer costs the server: only its own connection.  Malformed, truncated or
oversized frames, a failed handshake, a reader too slow to drain its replies (the write
buffer is bounded) and a silent peer (idle timeout; good clients ping) each end that
connection and nothing else.  Memory is bounded too: before authentication a frame may
hold 4 KiB; incomplete frames of all connections together hold at most ``max_buffered``
bytes; connections, waits and leases per connection are capped.

The client rides out a store host that is briefly unreachable: it reconnects with
back-off for at most ``read_timeout`` seconds, then raises a :class:`StoreError` naming
``host:port``.  Idempotent operations are re-sent on the new connection (a blocking one
with what is left of its timeout); ``add`` and ``compare_set`` are not: if the connection
broke before their reply, they raise :class:`StoreError` saying the outcome is unknown.
(A resent ``delete`` whose first attempt did apply returns False: the key is gone either
way.)  ``grant_lease`` is resent too: a lease granted by a lost attempt has no keys and
is never renewed, so it expires unseen.  A watch resumes from its revision; if the
server came back with fresh data (another *instance*), the watch returns at once with
the new revision and the caller re-reads, as after an etcd compaction.  Leases are
renewed on the new connection if the server still has them, and are dead otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from elastic.errors import StoreClosedError, StoreError, StoreUnsupportedError
from elastic.memstore import MemoryStore
from elastic.real.clock import AsyncioClock
from elastic.real.netstore_protocol import (
    FEATURES,
    MAX_FRAME,
    FrameDecoder,
    ProtocolError,
    Request,
    check_result,
    decode_request,
    decode_response,
    encode_error,
    encode_ok,
    encode_request,
)
from elastic.store import Lease

__all__ = [
    "DEFAULT_PORT",
    "HostedStore",
    "NetLease",
    "NetStoreClient",
    "StoreServer",
    "WireStats",
]

logger = logging.getLogger(__name__)

DEFAULT_PORT = 29400  # torch's c10d rendezvous backend's default
_READ_CHUNK = 256 * 1024
_MAX_FOREIGN_WARNED = 64  # peer hosts a store host warns of, at most (bounded memory)
_PRE_AUTH_FRAME = 4096  # before authentication a frame can only be a small hello
_BLOCKING = frozenset({"get", "wait", "multi_get", "watch", "watch_snapshot"})


class _ServerLease(Lease, Protocol):
    def refresh(self) -> None: ...


class HostedStore:
    """What a server serves: the data, its leases and its instance id.

    Kept apart from :class:`StoreServer` so a server restarted in the same process (a new
    listening socket, every connection dropped) can serve the same data; a new
    ``HostedStore`` is a new *instance* and clients treat its data as fresh.
    """

    def __init__(self, clock: AsyncioClock | None = None) -> None:
        self.clock = clock or AsyncioClock()
        self.store = MemoryStore(self.clock)
        self.instance = secrets.token_hex(8)
        self.leases: dict[int, _ServerLease] = {}
        self._prune_at = 1024

    def add(self, lease: _ServerLease) -> None:
        """Track a granted lease; expired ones are dropped in amortised O(1) per grant."""
        self.leases[lease.id] = lease
        if len(self.leases) >= self._prune_at:
            self.prune()
            self._prune_at = max(1024, 2 * len(self.leases))

    def prune(self) -> None:
        """Forget leases that have expired (their keys are already gone)."""
        for lease_id in [i for i, x in self.leases.items() if not x.alive()]:
            del self.leases[lease_id]

    def lease(self, lease_id: int) -> _ServerLease:
        lease = self.leases.get(lease_id)
        if lease is None or not lease.alive():
            self.leases.pop(lease_id, None)
            raise _LeaseGone(
                f"lease {lease_id} is unknown to this store: it expired, was revoked, "
                "or was granted before the store restarted"
            )
        return lease


class _LeaseGone(StoreError):
    pass


class _Limit(StoreError):
    pass


def _error_kind(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "timeout"
    if isinstance(e, StoreClosedError):
        return "closed"
    if isinstance(e, _LeaseGone):
        return "lease"
    if isinstance(e, _Limit):
        return "limit"
    return "store"


class StoreServer:
    """Serves a :class:`HostedStore` on ``host:port`` (``port=0`` picks a free port)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token: str | None = None,
        max_connections: int = 1024,
        max_watches_per_connection: int = 1024,
        max_leases_per_connection: int = 1024,
        max_frame: int = MAX_FRAME,
        max_write_buffer: int = 2 * MAX_FRAME,
        max_buffered: int = 8 * MAX_FRAME,
        handshake_timeout: float = 10.0,
        idle_timeout: float = 60.0,
        hosted: HostedStore | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._token = token
        self.max_connections = max_connections
        self.max_watches_per_connection = max_watches_per_connection
        self.max_leases_per_connection = max_leases_per_connection
        self.max_frame = max_frame
        self.max_write_buffer = max_write_buffer
        self.max_buffered = max_buffered
        self.buffered = 0  # bytes of incomplete frames held, all connections together
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.hosted = hosted or HostedStore()
        self._server: asyncio.Server | None = None
        self._conns: set[_ServerConn] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._foreign: set[str] = set()  # peers already warned of (not this protocol)

    def __repr__(self) -> str:  # never shows the token
        return f"StoreServer({self.address!r}, auth={self._token is not None})"

    @property
    def address(self) -> str:
        """``host:port`` as bound (the real port once started)."""
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections currently served."""
        return len(self._conns)

    async def start(self) -> None:
        """Bind and listen on the running loop; ``.port`` is then the bound port."""
        self._server = await asyncio.start_server(self._on_connect, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        """Stop listening and drop every connection (the hosted data stays in ``hosted``)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.abort()  # its handler reads EOF and ends
        if self._handlers:
            _, late = await asyncio.wait(list(self._handlers), timeout=5.0)
            for task in late:
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no client is connected, at most ``timeout`` s; True if none is.

        A store host calls it before it closes, so the other agents' last writes (the
        exit barrier, closing the rendezvous) are not cut off by the first to finish.
        """
        if not self._conns:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return False
        return True

    def _warn_foreign(self, peer: str, why: str) -> None:
        """A connection's first bytes were not this protocol: say so once per peer host
        (a torchrun node's TCPStore client retries for its whole timeout)."""
        if peer in self._foreign or len(self._foreign) >= _MAX_FOREIGN_WARNED:
            return
        self._foreign.add(peer)
        logger.warning(
            "the store at %s closed a connection from %s that does not speak its protocol "
            "(%s): is a torch TCPStore client (a torchrun node) pointed at this job? Every "
            "node of the job must run elastic's agent",
            self.address,
            peer,
            why,
        )

    def _token_ok(self, given: str | None) -> bool:
        if self._token is None:
            return True
        return given is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), self._token.encode("utf-8", "surrogatepass")
        )

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        conn = _ServerConn(self, reader, writer)
        try:
            if len(self._conns) >= self.max_connections:
                conn.fail(
                    "limit",
                    f"the store at {self.address} serves at most {self.max_connections} "
                    "connections; raise max_connections or use fewer clients",
                )
                return
            self._conns.add(conn)
            await conn.run()
        except Exception as e:  # a bad peer costs its connection, never the server
            logger.debug("store connection from %s ended: %r", conn.peer, e)
        except asyncio.CancelledError:
            pass  # the server is closing; asyncio's streams would log a cancelled handler
        finally:
            self._conns.discard(conn)
            conn.teardown()
            self._handlers.discard(task)
            if not self._conns:
                for fut in self._idle_waiters:
                    if not fut.done():
                        fut.set_result(None)
                self._idle_waiters.clear()


class _ServerConn:
    """One client connection on the server."""

    def __init__(
        self, server: StoreServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.hosted = server.hosted
        self.store = server.hosted.store
        self.reader = reader
        self.writer = writer
        self.peer = str(writer.get_extra_info("peername"))
        self.decoder = FrameDecoder(min(_PRE_AUTH_FRAME, server.max_frame))
        self.authed = False
        self.dead = False
        self.pending: dict[int, asyncio.Task[None]] = {}
        self.owned: set[int] = set()
        self.started = self.last_rx = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.held = 0  # this connection's share of server.buffered

    # -- writing ----------------------------------------------------------------------
    def send(self, frame: bytes) -> None:
        if self.dead:
            return
        self.writer.write(frame)
        if self.writer.transport.get_write_buffer_size() > self.server.max_write_buffer:
            logger.debug("store client %s reads too slowly; dropping it", self.peer)
            self.abort()

    def fail(self, kind: str, message: str) -> None:
        """One error for the connection as a whole, then close it (after flushing)."""
        self.send(encode_error(0, kind, message))
        self.dead = True
        self.writer.close()

    def abort(self) -> None:
        self.dead = True
        self.writer.transport.abort()

    def reply(self, req_id: int, value: Any) -> None:
        try:
            frame = encode_ok(req_id, value, self.server.max_frame)
        except ProtocolError as e:
            frame = encode_error(req_id, "store", str(e))
        self.send(frame)

    def reply_error(self, req_id: int, e: BaseException) -> None:
        self.send(encode_error(req_id, _error_kind(e), str(e) or type(e).__name__))

    # -- reading ----------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.started = self.last_rx = loop.time()
        self.timer = loop.call_later(self.server.handshake_timeout, self.watchdog)
        while not self.dead:
            data = await self.reader.read(_READ_CHUNK)
            if not data:
                return
            self.last_rx = loop.time()
            try:
                frames = self.decoder.feed(data)
                held = self.decoder.buffered
                self.server.buffered += held - self.held
                self.held = held
                if held and self.server.buffered > self.server.max_buffered:
                    # many peers each sending most of a large frame: refuse the one that
                    # pushed the total over, so memory stays bounded whatever they do
                    self.fail(
                        "limit",
                        f"the store holds {self.server.buffered} bytes of incomplete frames "
                        f"(max_buffered {self.server.max_buffered}); send whole frames",
                    )
                    return
                for body in frames:
                    req = decode_request(body, self.decoder.max_frame)
                    if not self.authed and not self.handshake(req):
                        return
                    await self.dispatch(req)
                    if self.dead:
                        return
            except ProtocolError as e:
                if not self.authed:
                    peer = self.writer.get_extra_info("peername")
                    self.server._warn_foreign(str(peer[0]) if peer else "?", str(e))
                self.fail("protocol", str(e))
                return

    def watchdog(self) -> None:
        """One timer per connection, re-armed to the next deadline (cheaper than a timeout
        around every read).  The handshake deadline runs from the connection's start, so
        a peer trickling a partial hello is still cut off."""
        if self.dead:
            return
        loop = asyncio.get_running_loop()
        if self.authed:
            left = self.last_rx + self.server.idle_timeout - loop.time()
        else:
            left = self.started + self.server.handshake_timeout - loop.time()
        if left > 0:
            self.timer = loop.call_later(left, self.watchdog)
        elif not self.authed:
            limit = self.server.handshake_timeout
            self.fail("auth", f"no hello within {limit:g}s; closing the connection")
        else:
            self.abort()  # a silent peer: good clients ping well within this

    def handshake(self, req: Request) -> bool:
        if req.op != "hello":
            self.fail(
                "auth",
                f"the first request must be hello (with the token, if the store has one); "
                f"got {req.op}",
            )
            return False
        if not self.server._token_ok(req.args[0]):
            self.fail(
                "auth",
                "wrong or missing token: the store demands the job's token "
                "(--rdzv-conf token=... or ELASTIC_RDZV_TOKEN)",
            )
            return False
        self.authed = True
        self.decoder.max_frame = self.server.max_frame
        if self.timer is not None:  # from now on the idle deadline applies
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(self.server.idle_timeout, self.watchdog)
        return True

    async def dispatch(self, req: Request) -> None:
        op, args = req.op, req.args
        if op == "cancel":
            task = self.pending.pop(args[0], None)
            if task is not None:
                task.cancel()
            return
        if op in _BLOCKING:
            if len(self.pending) >= self.server.max_watches_per_connection:
                self.send(
                    encode_error(
                        req.id,
                        "limit",
                        f"{op}: this connection already waits on "
                        f"{self.server.max_watches_per_connection} operations "
                        "(max_watches_per_connection)",
                    )
                )
                return
            self.pending[req.id] = asyncio.get_running_loop().create_task(self.blocking(req))
            return
        try:
            # These never suspend on a MemoryStore, so running them inline keeps their order
            value = await self.immediate(op, args)
        except (StoreError, TimeoutError, TypeError, ValueError) as e:
            self.reply_error(req.id, e)
            return
        self.reply(req.id, value)

    async def blocking(self, req: Request) -> None:
        try:
            store, a = self.store, req.args
            value: Any
            if req.op == "get":
                value = await store.get(a[0], a[1])
            elif req.op == "wait":
                await store.wait(a[0], a[1])
                value = None
            elif req.op == "multi_get":
                value = await store.multi_get(a[0], a[1])
            elif req.op == "watch_snapshot":
                # read at the wake, in the same step, and sent with the wake-up
                rev, data = await store.watch_snapshot(a[0], a[1], a[2], a[3])
                value = [rev, data]
            else:
                value = await store.watch(a[0], a[1], a[2])
        except (StoreError, TimeoutError) as e:
            self.reply_error(req.id, e)
        except Exception as e:  # never out of a connection's task
            logger.debug("store %s failed: %r", req.op, e)
            self.reply_error(req.id, StoreError(f"{req.op} failed on the store: {e}"))
        else:
            self.reply(req.id, value)
        finally:
            self.pending.pop(req.id, None)

    async def immediate(self, op: str, a: tuple[Any, ...]) -> Any:
        store, hosted = self.store, self.hosted
        if op == "set":
            await store.set(a[0], a[1], lease=None if a[2] is None else hosted.lease(a[2]))
            return None
        if op == "try_get":
            return await store.try_get(a[0])
        if op == "add":
            return await store.add(a[0], a[1])
        if op == "arrive":
            lease = None if a[4] is None else hosted.lease(a[4])
            return list(await store.arrive(a[0], a[1], a[2], a[3], lease=lease))
        if op == "compare_set":
            lease = None if a[3] is None else hosted.lease(a[3])
            return await store.compare_set(a[0], a[1], a[2], lease=lease)
        if op == "delete":
            return await store.delete(a[0])
        if op == "multi_set":
            await store.multi_set(a[0])
            return None
        if op == "snapshot":
            rev, data = await store.snapshot(a[0])
            return [rev, data]
        if op == "grant_lease":
            if len(self.owned) >= self.server.max_leases_per_connection:
                self.owned = {i for i in self.owned if i in hosted.leases}
                hosted.prune()
                if len(self.owned) >= self.server.max_leases_per_connection:
                    raise _Limit(
                        f"grant_lease: this connection holds "
                        f"{self.server.max_leases_per_connection} leases "
                        "(max_leases_per_connection); revoke some first"
                    )
            lease = cast(_ServerLease, await store.grant_lease(a[0]))
            lease.abandon()  # the expiry timer runs from now; keepalives push it back
            hosted.add(lease)
            self.owned.add(lease.id)
            return lease.id
        if op == "keepalive":
            hosted.lease(a[0]).refresh()
            self.owned.add(a[0])
            return None
        if op == "revoke":
            gone = hosted.leases.pop(a[0], None)
            self.owned.discard(a[0])
            if gone is not None:
                await gone.revoke()
            return None
        if op == "ping":
            return None
        if op == "hello":
            if not self.server._token_ok(a[0]):
                raise StoreError("wrong token in a repeated hello")
            return {
                "instance": hosted.instance,
                "idle_timeout": self.server.idle_timeout,
                "revision": store.revision,
                "max_frame": self.server.max_frame,
                "ops": list(FEATURES),
            }
        raise ProtocolError(f"unknown operation {op!r}")  # pragma: no cover - OPS is closed

    def teardown(self) -> None:
        """The connection is gone: stop its waits; its leases expire ``ttl`` from now."""
        self.dead = True
        self.server.buffered -= self.held
        self.held = 0
        if self.timer is not None:
            self.timer.cancel()
        for task in self.pending.values():
            task.cancel()
        self.pending.clear()
        for lease_id in self.owned:
            lease = self.hosted.leases.get(lease_id)
            if lease is None:
                continue
            if lease.alive():
                lease.refresh()
            else:
                del self.hosted.leases[lease_id]
        self.owned.clear()
        if not self.writer.is_closing():
            self.writer.close()


# -- the client ---------------------------------------------------------------------
class _Lost(Exception):
    """The connection broke before the reply came."""


class _Refused(StoreError):
    """The server refused the connection for good (authentication, limits)."""


class _NoHello(Exception):
    """The server took the TCP connection but did not answer the handshake's ``hello``
    (silent, or closing the connection): a program that does not speak this protocol (a
    torch ``TCPStore`` waits for more bytes or hangs up), or a host too busy or shutting
    down."""


NO_HELLO_HINT = (
    "it accepts TCP connections but does not answer the store's handshake: is the program "
    "listening there elastic's store? A torch TCPStore (torchrun's c10d rendezvous) does "
    "not speak it: every node of the job must run elastic's agent"
)


class WireStats:
    """Bytes a client sent and received (frames, headers included) over all its connections."""

    __slots__ = ("received", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0


class _Link:
    """One TCP connection of a client, with its outstanding requests."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        read_timeout: float,
        stats: WireStats,
    ) -> None:
        self.stats = stats
        self.reader = reader
        self.writer = writer
        self.read_timeout = read_timeout
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.lost = False
        self.why = "connection closed"
        self.fatal: tuple[str, str] | None = None
        self.instance = ""
        self.revision = 0
        self.max_frame = MAX_FRAME
        self.ops: frozenset[str] = frozenset()  # the host's later ops (hello's "ops")
        self.tasks: list[asyncio.Task[None]] = []
        self.last_rx = 0.0
        self.timer: asyncio.TimerHandle | None = None

    def start(self, ping_every: float) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._read()), loop.create_task(self._ping(ping_every))]

    async def _read(self) -> None:
        decoder = FrameDecoder()
        loop = asyncio.get_running_loop()
        self.last_rx = loop.time()
        self.timer = loop.call_later(self.read_timeout, self._watchdog)
        try:
            while True:
                data = await self.reader.read(_READ_CHUNK)
                if not data:
                    break
                self.last_rx = loop.time()
                self.stats.received += len(data)
                for body in decoder.feed(data):
                    resp = decode_response(body)
                    if resp.id == 0 and not resp.ok:
                        self.fatal = (resp.kind, resp.message)
                        self.why = resp.message
                        continue
                    fut = self.pending.pop(resp.id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(resp)
        except (OSError, ProtocolError) as e:
            self.why = str(e) or type(e).__name__
        finally:
            self.drop()

    def _watchdog(self) -> None:
        # one timer per link, re-armed to the next deadline: cheaper than a timeout per read
        if self.lost:
            return
        loop = asyncio.get_running_loop()
        left = self.last_rx + self.read_timeout - loop.time()
        if left > 0:
            self.timer = loop.call_later(left, self._watchdog)
            return
        self.why = f"no reply from the store for {self.read_timeout:g}s"
        self.drop()

    async def _ping(self, every: float) -> None:
        # Keeps the server's idle timer and our read timeout fed while only long waits are
        # outstanding.  Id 0 is never a request's: the reply is read and dropped.
        while not self.lost:
            await asyncio.sleep(every)
            self.send(encode_request(0, "ping"))

    def send(self, frame: bytes) -> None:
        if self.lost:
            raise _Lost(self.why)
        self.writer.write(frame)
        self.stats.sent += len(frame)

    def drop(self) -> None:
        if self.lost:
            return
        self.lost = True
        if self.timer is not None:
            self.timer.cancel()
        err = _Lost(self.why)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()
        self.writer.transport.abort()
        current = asyncio.current_task()
        for t in self.tasks:
            if t is not current:
                t.cancel()


def _raise_for(kind: str, message: str) -> None:
    if kind == "timeout":
        raise TimeoutError(message)
    if kind == "closed":
        raise StoreClosedError(message)
    if kind == "lease":
        raise _LeaseGone(message)
    raise StoreError(message)


class NetLease(Lease):
    """A lease held through a :class:`NetStoreClient`, renewed every ``ttl/3``."""

    def __init__(self, client: NetStoreClient, lease_id: int, ttl: float, instance: str) -> None:
        self._client = client
        self.id = lease_id
        self.ttl = ttl
        self.instance = instance
        self.state = "alive"  # alive | abandoned | expired
        self._renewed_at = client._clock.now()
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"NetLease(id={self.id}, ttl={self.ttl:g}, state={self.state})"

    def alive(self) -> bool:
        if self.state == "expired":
            return False
        # the server expires it ttl after the last renewal it saw
        return self._client._clock.now() < self._renewed_at + self.ttl

    def abandon(self) -> None:
        if self.state != "alive":
            return
        self.state = "abandoned"
        self._stop_renewing()
        # One last renewal, so the server's ttl runs from now, as the port promises.
        loop = asyncio.get_running_loop()
        self._client._spawn(loop.create_task(self._renew_once()))

    async def revoke(self) -> None:
        if self.state == "expired":
            return
        self.state = "expired"
        self._stop_renewing()
        self._client._leases.pop(self.id, None)
        with contextlib.suppress(_NewInstance):  # a new instance never had it
            await self._client._request(
                "revoke", lambda: (self.id,), retry=True, instance=self.instance
            )

    def _expired(self) -> None:
        self.state = "expired"
        self._stop_renewing()
        self._client._leases.pop(self.id, None)

    def _stop_renewing(self) -> None:
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self._task = None

    async def _renew_once(self) -> None:
        try:
            # Only to the instance that granted it: a renewal resent after a reconnect to a
            # new instance (a restarted host, or another host on the same address) would
            # only be refused there, and is not that host's business.
            await self._client._request(
                "keepalive", lambda: (self.id,), retry=True, instance=self.instance
            )
        except StoreClosedError:
            return
        except (_LeaseGone, _NewInstance):
            self._expired()
            return
        except StoreError as e:  # unreachable for now: the next renewal tries again
            logger.debug("renewing lease %d failed: %s", self.id, e)
            return
        self._renewed_at = self._client._clock.now()

    async def _renew_forever(self) -> None:
        # On a fixed schedule from the grant, not ttl/3 after each answer: the renewals
        # do not drift by a round trip (and the loop's lag) each, so when the last one
        # before a cut reached the store is known from the grant (the simulator computes
        # it so, sim/store.py).  A renewal held past the next one's time (an outage, a
        # cut) restarts the schedule at its answer rather than firing the missed ones.
        loop = asyncio.get_running_loop()
        period = self.ttl / 3
        due = loop.time()
        while self.state == "alive":
            due += period
            await asyncio.sleep(max(0.0, due - loop.time()))
            await self._renew_once()
            if loop.time() >= due + period:
                due = loop.time()


class NetStoreClient:
    """The Store port over TCP to a :class:`StoreServer` (use :meth:`connect`)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token: str | None,
        clock: AsyncioClock,
        connect_timeout: float,
        read_timeout: float,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.host = host
        self.port = port
        self._token = token
        self._clock = clock
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_frame = max_frame
        self._link: _Link | None = None
        self._reconnecting: asyncio.Lock | None = None
        self._next_id = 0
        self._closed = False
        self._instance = ""
        self._leases: dict[int, NetLease] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.reconnects = 0
        self.wire = WireStats()

    def __repr__(self) -> str:  # never shows the token
        return f"NetStoreClient({self.address!r})"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        token: str | None = None,
        clock: AsyncioClock,
        connect_timeout: float = 30.0,
        read_timeout: float = 30.0,
    ) -> NetStoreClient:
        """Connect (retrying for up to ``connect_timeout``: the host may not be up yet)."""
        client = cls(
            host,
            port,
            token=token,
            clock=clock,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        await client._ensure_link(connect_timeout)
        return client

    async def aclose(self) -> None:
        """Close the connection; later operations raise :class:`StoreClosedError`.

        Leases are not revoked: like a dead owner's, they expire ``ttl`` from now.
        """
        if self._closed:
            return
        self._closed = True
        for lease in list(self._leases.values()):
            lease._stop_renewing()
        for t in list(self._background):
            t.cancel()
        link, self._link = self._link, None
        if link is not None:
            link.why = "the store client was closed"
            link.drop()
            await asyncio.gather(*link.tasks, return_exceptions=True)

    # -- connection ---------------------------------------------------------------------
    def _spawn(self, task: asyncio.Task[None]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _open(self, timeout: float) -> _Link:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(self.host, self.port)
        link = _Link(reader, writer, self.read_timeout, self.wire)
        link.start(ping_every=self.read_timeout / 3)
        try:
            async with asyncio.timeout(timeout):
                hello = await self._roundtrip(link, "hello", (self._token,))
        except _Lost as e:
            if link.fatal is not None:
                raise _Refused(f"the store at {self.address} refused us: {link.fatal[1]}") from None
            raise _NoHello(
                f"connected, then {e or 'connection closed'} before the handshake's answer"
            ) from None
        except TimeoutError:
            link.drop()
            raise _NoHello(f"connected, no answer to the handshake within {timeout:g}s") from None
        except BaseException:
            link.drop()
            raise
        link.instance = hello["instance"]
        link.max_frame = min(self.max_frame, int(hello.get("max_frame", self.max_frame)))
        link.revision = int(hello.get("revision", 0))
        link.ops = frozenset(hello.get("ops", ()))
        idle = float(hello["idle_timeout"])
        if idle > 0 and idle / 4 < self.read_timeout / 3:
            link.tasks[1].cancel()
            link.tasks[1] = asyncio.get_running_loop().create_task(link._ping(idle / 4))
        return link

    async def _ensure_link(self, budget: float) -> _Link:
        if self._closed:
            raise StoreClosedError(f"the client of the store at {self.address} is closed")
        link = self._link
        if link is not None and not link.lost:
            return link
        if self._reconnecting is None:
            self._reconnecting = asyncio.Lock()
        async with self._reconnecting:
            link = self._link
            if link is not None and not link.lost:
                return link
            if self._closed:
                raise StoreClosedError(f"the client of the store at {self.address} is closed")
            clock = self._clock
            deadline = clock.now() + budget
            delay = 0.02
            while True:
                try:
                    link = await self._open(max(0.01, min(self.connect_timeout, budget)))
                    break
                except _Refused:
                    raise
                except (OSError, TimeoutError, _Lost, _NoHello, ProtocolError) as e:
                    last = NO_HELLO_HINT if isinstance(e, _NoHello) else str(e) or type(e).__name__
                left = deadline - clock.now()
                if left <= 0:
                    raise StoreError(
                        f"the store at {self.address} is unreachable: no connection "
                        f"within {budget:g}s ({last})"
                    )
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 1.0)
            first = self._link is None
            self._link = link
            if not first:
                self.reconnects += 1
            self._on_new_link(link)
            return link

    def _on_new_link(self, link: _Link) -> None:
        changed = bool(self._instance) and link.instance != self._instance
        self._instance = link.instance
        loop = asyncio.get_running_loop()
        for lease in list(self._leases.values()):
            if changed or lease.instance != link.instance:
                lease._expired()  # a new store instance has none of the old leases
            elif lease.state != "expired":
                self._spawn(loop.create_task(lease._renew_once()))

    async def _roundtrip(self, link: _Link, op: str, args: tuple[Any, ...]) -> Any:
        self._next_id += 1
        rid = self._next_id
        frame = encode_request(rid, op, *args, max_frame=link.max_frame)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.send(frame)
        link.pending[rid] = fut
        try:
            resp = await fut
        except asyncio.CancelledError:
            link.pending.pop(rid, None)
            if op in _BLOCKING and not link.lost:
                with contextlib.suppress(_Lost):
                    link.send(encode_request(0, "cancel", rid))
            raise
        if not resp.ok:
            if resp.kind == "auth":
                raise _Refused(f"the store at {self.address} refused us: {resp.message}")
            _raise_for(resp.kind, resp.message)
        return check_result(op, resp.value)

    async def _request(
        self, op: str, args: Callable[[], tuple[Any, ...]], *, retry: bool, instance: str = ""
    ) -> Any:
        """Send ``op`` and return its checked result; resend after a reconnect if ``retry``.

        Resending stops ``read_timeout`` after the first broken connection (a server that
        accepts and then drops every request must not hold a caller forever).
        """
        lost_since: float | None = None
        backoff = 0.02
        while True:
            link = self._link  # the common case costs no extra coroutine
            if link is None or link.lost:
                link = await self._ensure_link(self.read_timeout)
            if instance and link.instance != instance:
                raise _NewInstance(link.revision)
            try:
                return await self._roundtrip(link, op, args())
            except _Lost as e:
                if link.fatal is not None:  # the server refused this request for good
                    raise StoreError(
                        f"{op}: the store at {self.address} closed the connection: {link.fatal[1]}"
                    ) from None
                if not retry:
                    raise StoreError(
                        f"{op} on the store at {self.address}: the connection broke before "
                        f"the reply ({e}); whether it took effect is unknown — re-read the key"
                    ) from None
                now = self._clock.now()
                if lost_since is None:
                    lost_since = now
                elif now - lost_since > self.read_timeout:
                    raise StoreError(
                        f"{op} on the store at {self.address}: the connection kept breaking "
                        f"for {self.read_timeout:g}s ({e})"
                    ) from None
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, 1.0)

    def _deadline(self, timeout: float | None) -> Callable[[], float | None]:
        if timeout is None:
            return lambda: None
        end = self._clock.now() + timeout

        def left() -> float:
            rest = end - self._clock.now()
            if rest <= 0 and timeout > 0:
                raise TimeoutError(f"no reply from the store within {timeout:g}s")
            return max(0.0, rest)

        return left

    # -- the port -----------------------------------------------------------------------
    async def set(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        v = _bytes(key, value)
        lid = self._lease_id(lease)
        await self._leased(lease, self._request("set", lambda: (key, v, lid), retry=True))

    @staticmethod
    async def _leased(lease: Lease | None, request: Awaitable[Any]) -> Any:
        """``request`` attaches a key to ``lease``: if the server says it is gone, so is it."""
        try:
            return await request
        except _LeaseGone:
            if isinstance(lease, NetLease):
                lease._expired()
            raise

    def _lease_id(self, lease: Lease | None) -> int | None:
        if lease is None:
            return None
        if not isinstance(lease, NetLease) or lease._client is not self:
            raise StoreError("that lease was granted by another store")
        if lease.state == "expired":
            raise StoreError(f"lease {lease.id} has expired; cannot attach keys to it")
        return lease.id

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        left = self._deadline(timeout)
        return cast(bytes, await self._request("get", lambda: (key, left()), retry=True))

    async def try_get(self, key: str) -> bytes | None:
        return cast(bytes | None, await self._request("try_get", lambda: (key,), retry=True))

    async def add(self, key: str, amount: int) -> int:
        return cast(int, await self._request("add", lambda: (key, amount), retry=False))

    async def arrive(
        self, counter: str, key: str, value: bytes, under: str, *, lease: Lease | None = None
    ) -> tuple[int, int, int, bool]:
        """An arrival in one wire op (:class:`~elastic.store.ArriveStore`), not resent
        after a broken connection (it adds, as :meth:`add`).  A host too old to have it
        gets nothing: :class:`StoreUnsupportedError`, and the caller falls back."""
        v = _bytes(key, value)
        lid = self._lease_id(lease)
        link = await self._ensure_link(self.read_timeout)
        if "arrive" not in link.ops:
            raise StoreUnsupportedError(
                f"arrive: the store host at {self.address} predates it (it lists "
                f"{sorted(link.ops)})"
            )
        return cast(
            tuple[int, int, int, bool],
            await self._leased(
                lease,
                self._request("arrive", lambda: (counter, key, v, under, lid), retry=False),
            ),
        )

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        e = None if expected is None else _bytes(key, expected)
        d = _bytes(key, desired)
        lid = self._lease_id(lease)
        request = self._request("compare_set", lambda: (key, e, d, lid), retry=False)
        return cast(bytes, await self._leased(lease, request))

    async def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        ks = list(keys)
        left = self._deadline(timeout)
        await self._request("wait", lambda: (ks, left()), retry=True)

    async def delete(self, key: str) -> bool:
        return cast(bool, await self._request("delete", lambda: (key,), retry=True))

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        ks = list(keys)
        left = self._deadline(timeout)
        return cast(list[bytes], await self._request("multi_get", lambda: (ks, left()), retry=True))

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        d = {k: _bytes(k, v) for k, v in items.items()}
        await self._request("multi_set", lambda: (d,), retry=True)

    async def grant_lease(self, ttl: float) -> Lease:
        if not ttl > 0:
            raise StoreError(f"lease ttl must be positive, got {ttl!r}")
        # Safe to resend: a lease granted by a lost attempt has no keys and no renewals, so
        # the server expires it ttl later and nobody sees it.
        lease_id = cast(int, await self._request("grant_lease", lambda: (ttl,), retry=True))
        lease = NetLease(self, lease_id, ttl, self._instance)
        self._leases[lease_id] = lease
        lease._task = asyncio.get_running_loop().create_task(lease._renew_forever())
        return lease

    async def snapshot(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        return cast(
            tuple[int, dict[str, bytes]],
            await self._request("snapshot", lambda: (prefix,), retry=True),
        )

    async def watch(self, prefix: str, after: int, timeout: float | None = None) -> int:
        left = self._deadline(timeout)
        link = await self._ensure_link(self.read_timeout)
        try:
            return cast(
                int,
                await self._request(
                    "watch", lambda: (prefix, after, left()), retry=True, instance=link.instance
                ),
            )
        except _NewInstance as e:
            # The store came back with fresh data: everything under the prefix changed.
            return e.revision

    async def watch_snapshot(
        self, prefix: str, after: int, read_prefix: str, timeout: float | None = None
    ) -> tuple[int, dict[str, bytes]]:
        """A watch answered, at its wake, with ``read_prefix``'s snapshot taken by the host
        in the same step (one round trip; :class:`~elastic.store.WatchSnapshotStore`).

        A host too old to have the op (its ``hello`` does not list it) gets ``watch``
        then ``snapshot``: the same answer in two round trips.  After a reconnect to a
        store with fresh data, the snapshot is read at once, as :meth:`watch` returns.
        """
        left = self._deadline(timeout)
        link = await self._ensure_link(self.read_timeout)
        if "watch_snapshot" not in link.ops:
            await self.watch(prefix, after, timeout if timeout is None else left())
            return await self.snapshot(read_prefix)
        try:
            return cast(
                tuple[int, dict[str, bytes]],
                await self._request(
                    "watch_snapshot",
                    lambda: (prefix, after, read_prefix, left()),
                    retry=True,
                    instance=link.instance,
                ),
            )
        except _NewInstance:
            return await self.snapshot(read_prefix)


class _NewInstance(Exception):
    def __init__(self, revision: int) -> None:
        super().__init__(revision)
        self.revision = revision


def _bytes(key: str, value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise TypeError(f"store values are bytes, got {type(value).__name__} for {key!r}")
    return bytes(value)
