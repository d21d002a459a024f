"""The store port over etcd's v3 API (gRPC): the rendezvous store of a real cluster.

Theory of operation
-------------------
The port was drawn after etcd v3, so the mapping is direct:

=================  ==========================================================
port               etcd v3
=================  ==========================================================
revision           etcd's store revision; a key's revision is its mod revision
get / wait         ``Range``; if absent, a ``Watch`` on the key from the
                   range's revision + 1 until a put (no polling)
add                ``Txn``: compare mod revision, put ``n + amount``; on a lost
                   race the failure branch reads the new value and we retry
                   after a jittered back-off (tasks of one client queue per key)
compare_set        ``Txn``: compare value (``None``: create revision == 0)
multi_get / _set   one ``Txn`` of ranges / puts (one revision)
lease              ``LeaseGrant`` (whole seconds, at least etcd's minimum);
                   one keep-alive stream per client renews every lease at
                   ``ttl / 3``; ``abandon`` renews once more then stops, so
                   etcd expires it ``ttl`` after the abandon, not before
snapshot           ``Range`` over the prefix with the header's revision
watch              ``Watch`` from ``after + 1``; a compacted revision returns the
                   current revision (the caller re-reads with ``snapshot``)
watch_snapshot     the ``Watch``, then a ``Range`` at the event's revision (two
                   RPCs, one port operation; the current revision if compacted)
=================  ==========================================================

Every key is stored under ``prefix`` (default ``/elastic/``) so several jobs share a
cluster; the port's keys are relative to it.

Timeouts: the first read of ``get``/``wait`` is not under their ``timeout`` (a present
key is returned even at ``timeout=0``); a ``watch`` with a short timeout still reports
changes already made (see :meth:`EtcdStoreClient.watch`).

Failures: a call that gets ``UNAVAILABLE`` (member down, no leader, leader changed)
is retried on the next endpoint with a short back-off until ``read_timeout`` has
passed, so a job rides out a leader change or one member down when it lists several
endpoints.  Watches require a leader (etcd closes them on a member that lost it) and
are re-created on the next endpoint from the last revision seen, so no event is lost.
Running out of time raises the builtin :class:`TimeoutError`; every other failure
raises :class:`~elastic.errors.StoreError` naming the endpoint.  A write whose
connection breaks after the request left may have been applied and is retried (etcd's
own client has the same window for non-idempotent requests): a retried ``set``,
``compare_set`` or ``multi_set`` is harmless, a retried ``add`` may count twice.

``grpc`` and the etcd protobufs (from ``aetcd``) are imported by :meth:`connect`, not
by this module, so ``elastic run`` with another backend never pays for them.

Fork
----
A process forked without exec (``multiprocessing``'s ``fork`` context running
``elastic.run.main``, say) inherits the parent's clients, the shared loop and gRPC's
state, but none of their threads: the loop thread and gRPC's completion-queue poller
are gone, and the first call in the child used to wait forever (or crash).  gRPC's own
fork support (``GRPC_ENABLE_FORK_SUPPORT``, off by default in grpcio 1.85) does not
help: it manages the synchronous stack only, not ``grpc.aio`` channels or the aio
poller, and gRPC core skips its fork handlers while that poller is inside gRPC.  So:

* :meth:`EtcdStoreClient.aclose` frees its channels at once (not when the collector
  breaks the client's reference cycles), so gRPC stops its poller thread when the last
  client closes, and its core threads a few ms later; a fork after that is clean, and
  the child connects as any process.
* ``os.register_at_fork`` hooks: ``before`` (in the parent, a few µs) notes whether
  gRPC's aio poller runs; in the 2 s after the last client closed, it first waits (at
  most those 2 s) for the poller and gRPC core's threads to end, since a fork while they
  wind down inherits the locks they hold; ``after_in_child``, every open client sets its channels,
  keep-alive and per-key locks aside — kept referenced and never touched, since
  closing or freeing them calls into threads that do not exist — and forgets the
  parent's leases (the parent still owns them); the process-wide loop of
  :func:`elastic.real.rdzv_context.shared_loop` is set aside the same way by that
  module's own hook, and the next use starts a new one.
  A client then reconnects on first use.
* If gRPC's poller was running at the fork (a client of the parent was open), gRPC
  cannot be used in the child at all: its epoll set is shared with the parent, and
  reviving it would let the child take the parent's events (a hang or a crash of the
  *parent*).  Then the first call raises a :class:`~elastic.errors.StoreError`
  saying so, at once, instead of hanging: close the clients before forking, or use
  the ``spawn``/``forkserver`` start method.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import os
import random
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from elastic.errors import ConfigError, StoreClosedError, StoreError
from elastic.memstore import StoreStats
from elastic.real.clock import AsyncioClock
from elastic.real.loop_thread import LoopThread
from elastic.store import Lease

__all__ = ["EtcdLease", "EtcdStoreClient", "cas_delay", "parse_endpoint", "shared_loop"]

T = TypeVar("T")


# etcd's default --max-txn-ops: a multi_set above it cannot be one revision
MAX_TXN_OPS = 128
# etcd's clientv3.WithRequireLeader, as gRPC metadata
_REQUIRE_LEADER = (("hasleader", "true"),)
# how long a watch with a short timeout waits for etcd to replay changes already made
REPLAY_GRACE = 1.0
# one attempt on one endpoint never waits longer than this, so a member that hangs
# (rather than refusing) is left for the next one well before read_timeout
ATTEMPT_TIMEOUT = 10.0
# gRPC keep-alive pings find a dead peer under a long watch; etcd refuses pings more
# often than every 5 s (--grpc-keepalive-min-time), so 10 s
_CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
)


def shared_loop() -> LoopThread:
    """The process's one event loop for synchronous users of etcd (torch's API, tests).

    ``grpc.aio`` binds its completion queue to the loops that use it: a second loop in
    the process (a new ``asyncio.run``, or a loop per thread) makes it log spurious
    "Event loop is closed" / ``BlockingIOError`` errors from its poller
    (grpc/grpc#25364).  So every synchronous etcd client of a process shares one loop:
    the same one torch-style rendezvous handlers run on
    (:func:`elastic.real.rdzv_context.shared_loop`), a daemon thread.
    """
    from elastic.real.rdzv_context import shared_loop as process_loop

    return process_loop()


def parse_endpoint(endpoint: str) -> str:
    """``host:port`` from ``host:port``, ``host`` (port 2379, as torch) or a URL."""
    s = endpoint.strip()
    for scheme in ("http://", "https://"):
        if s.startswith(scheme):
            s = s[len(scheme) :]
    s = s.rstrip("/")
    host, sep, port = s.rpartition(":")
    if not sep:
        host, port = s, "2379"
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            "etcd endpoint", f"{endpoint!r} is not host:port (for example 127.0.0.1:2379)"
        )
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _range_end(prefix: bytes) -> bytes:
    """The end of etcd's range holding every key that starts with ``prefix``."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return b"\0"  # every key


class _Grpc:
    """The lazily imported gRPC modules and etcd's protobuf classes."""

    def __init__(self) -> None:
        try:
            import grpc
            import grpc.aio
            from aetcd import rpc
        except ImportError as e:
            raise ConfigError(
                "--rdzv-backend etcd",
                f"needs the etcd client ({e.name} is not installed): pip install 'elastic[etcd]'",
            ) from None

        self.grpc: Any = grpc
        self.aio: Any = grpc.aio
        self.rpc: Any = rpc
        codes = grpc.StatusCode
        self.retry = {codes.UNAVAILABLE}
        self.deadline = codes.DEADLINE_EXCEEDED
        self.cancelled = codes.CANCELLED
        self.not_found = codes.NOT_FOUND
        self.out_of_range = codes.OUT_OF_RANGE  # a range at a compacted revision


_GRPC: _Grpc | None = None


def _grpc() -> _Grpc:
    global _GRPC
    if _GRPC is None:
        _GRPC = _Grpc()
    return _GRPC


# -- fork (see the module docstring) -------------------------------------------------

_clients: weakref.WeakSet[EtcdStoreClient] = weakref.WeakSet()  # open clients
_set_aside: list[object] = []  # what a forked child inherited: referenced, never touched
_poller_at_fork = False  # gRPC aio's poller thread ran when this process last forked
_grpc_lost_in_fork = False  # this process is a child forked while that poller ran

GRPC_AFTER_FORK = (
    "this process was forked while its parent had an etcd (gRPC) client open; gRPC "
    "cannot be used in such a child (its threads and epoll set belong to the parent): "
    "close the parent's etcd clients before forking, or start this process with the "
    "'spawn' or 'forkserver' start method"
)


def _grpc_aio_poller_running() -> bool:
    """True if gRPC aio's completion-queue poller thread runs in this process."""
    for t in threading.enumerate():
        owner = getattr(getattr(t, "_target", None), "__self__", None)
        if type(owner).__name__ == "PollerCompletionQueue":
            return True
    return False


# gRPC core's own threads (native, not Python's), by the names it gives them
_GRPC_CORE_THREADS = ("grpc", "event_engine", "lifeguard", "default-execut", "resolver-exec")
_SETTLE = 2.0  # seconds a fork waits for gRPC to wind down after the last client closed
_last_close = -math.inf  # time.monotonic() when a client of this process last closed


def _note_close() -> None:
    global _last_close
    _last_close = time.monotonic()


def _grpc_core_threads_alive() -> bool:
    """True if one of gRPC core's native threads is alive in this process (Linux:
    ``/proc/self/task``; elsewhere False).  They outlive the last channel by a few ms
    while gRPC shuts down; a fork meanwhile makes gRPC skip its fork handlers ("Other
    threads are currently calling into gRPC") and the child inherits locks those
    threads held: its first channel waits forever (1 fork in 200 right after a close,
    on a loaded machine)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith(_GRPC_CORE_THREADS):
                    return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


def _before_fork() -> None:
    global _poller_at_fork
    # only a process that made channels here can have a poller of ours
    running = _GRPC is not None and _grpc_aio_poller_running()
    if _GRPC is not None and not _clients:
        # every client is closed: gRPC stops its aio poller, then its core threads, a
        # few ms after the last channel went.  A fork while either is still inside gRPC
        # can hang or crash the child, even one that never uses gRPC (both seen in CI
        # runs), so the fork waits for them, bounded.  Core threads alive long after our
        # last close belong to some other user of gRPC in this process: not waited for.
        deadline = time.monotonic() + _SETTLE
        settle_until = _last_close + _SETTLE

        def busy() -> bool:
            return _grpc_aio_poller_running() or (
                time.monotonic() < settle_until and _grpc_core_threads_alive()
            )

        running = busy()
        while running and time.monotonic() < deadline:
            time.sleep(0.005)
            running = busy()
        running = _grpc_aio_poller_running()
    _poller_at_fork = running


def _after_fork_in_child() -> None:
    global _grpc_lost_in_fork
    _grpc_lost_in_fork = _grpc_lost_in_fork or _poller_at_fork
    for client in list(_clients):
        client._set_aside_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


class _Endpoint:
    """One member: its channel and stubs, made on first use."""

    __slots__ = ("channel", "kv", "lease", "maintenance", "name", "watch")

    def __init__(self, name: str, g: _Grpc, credentials: Any) -> None:
        self.name = name
        if credentials is None:
            self.channel: Any = g.aio.insecure_channel(name, options=_CHANNEL_OPTIONS)
        else:
            self.channel = g.aio.secure_channel(name, credentials, options=_CHANNEL_OPTIONS)
        self.kv: Any = g.rpc.KVStub(self.channel)
        self.lease: Any = g.rpc.LeaseStub(self.channel)
        self.watch: Any = g.rpc.WatchStub(self.channel)
        self.maintenance: Any = g.rpc.MaintenanceStub(self.channel)


class EtcdLease(Lease):
    """An etcd lease, renewed by its client's keep-alive stream while alive."""

    __slots__ = ("_abandoned_at", "_client", "_state", "id", "ttl")

    def __init__(self, client: EtcdStoreClient, lease_id: int, ttl: float) -> None:
        self._client = client
        self.id = lease_id
        self.ttl = ttl
        self._state = "alive"  # alive | abandoned | expired
        self._abandoned_at = 0.0

    def alive(self) -> bool:
        if self._state == "abandoned":
            return self._client._clock.now() < self._abandoned_at + self.ttl
        return self._state == "alive"

    def abandon(self) -> None:
        if self._state != "alive":
            return
        self._state = "abandoned"
        self._abandoned_at = self._client._clock.now()
        self._client._keeper.abandon(self)

    async def revoke(self) -> None:
        if self._state == "expired":
            return
        self._state = "expired"
        self._client._keeper.forget(self.id)
        self._client._granted.pop(self.id, None)
        g = self._client._g
        await self._client._unary(
            f"revoke lease {self.id:x}",
            lambda ep, t: ep.lease.LeaseRevoke(g.rpc.LeaseRevokeRequest(ID=self.id), timeout=t),
            ok_codes=(g.not_found,),  # it had expired already
        )

    def _expired(self) -> None:
        self._state = "expired"
        self._client._granted.pop(self.id, None)


class _KeepAlive:
    """Renews every live lease of one client over one ``LeaseKeepAlive`` stream.

    One task per client, not per lease: a heap of (due time, lease id); each lease is
    renewed every ``ttl / 3`` (etcd's own client's period).  A reply with ``TTL <= 0``
    means etcd already expired the lease; the lease is marked dead.
    """

    def __init__(self, client: EtcdStoreClient) -> None:
        self._client = client
        self._leases: dict[int, EtcdLease] = {}  # renewed periodically
        self._final: dict[int, EtcdLease] = {}  # abandoned: one last renewal, then none
        self._heap: list[tuple[float, int]] = []
        # each lease's one live due time: a heap entry that differs is stale and skipped
        # (a renewal retried after an error is pushed again; without this every error
        # doubled the lease's entries, and a store gone for good grew them without end)
        self._due: dict[int, float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[int, EtcdLease] = {}  # sent, reply not read yet

    def add(self, lease: EtcdLease) -> None:
        self._leases[lease.id] = lease
        self._push(lease.id, self._now() + lease.ttl / 3)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="etcd-lease-keepalive"
            )
        self._wake.set()

    def abandon(self, lease: EtcdLease) -> None:
        if self._leases.pop(lease.id, None) is not None:
            self._due.pop(lease.id, None)
            self._final[lease.id] = lease
            self._wake.set()

    def forget(self, lease_id: int) -> None:
        self._leases.pop(lease_id, None)
        self._final.pop(lease_id, None)
        self._due.pop(lease_id, None)

    def _push(self, lease_id: int, at: float) -> None:
        self._due[lease_id] = at
        heapq.heappush(self._heap, (at, lease_id))

    def _now(self) -> float:
        return self._client._clock.now()

    async def _run(self) -> None:
        g = self._client._g
        backoff = 0.1
        while not self._client._closed:
            now = self._now()
            due: list[EtcdLease] = []
            while self._heap and self._heap[0][0] <= now:
                at, lid = heapq.heappop(self._heap)
                lease = self._leases.get(lid)
                if lease is not None and self._due.get(lid) == at:
                    due.append(lease)
                    # a fixed schedule (no drift by the loop's lag), restarted from now
                    # if it fell a whole period behind (as the network store's client)
                    nxt = at + lease.ttl / 3
                    self._push(lid, nxt if nxt > now else now + lease.ttl / 3)
            final = list(self._final.values())
            self._final.clear()
            if due or final:
                try:
                    await self._send(due + final)
                    backoff = 0.1
                except g.aio.AioRpcError:
                    if self._client._closed:
                        return
                    self._drop_stream()
                    self._client._rotate_from(self._client._ep())
                    for lease in final:  # the last renewal still owed
                        self._final[lease.id] = lease
                    for lease in due:
                        if lease.id in self._leases:
                            self._push(lease.id, now + backoff)
                    backoff = min(2 * backoff, 1.0)
                    await asyncio.sleep(backoff)
                    continue
            self._wake.clear()
            wait = (self._heap[0][0] - self._now()) if self._heap else None
            # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancel that lands
            # as the event fires (abandon() then aclose()), and this task would never end
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def _send(self, leases: list[EtcdLease]) -> None:
        g = self._client._g
        if self._call is None:
            ep = self._client._ep()
            self._call = ep.lease.LeaseKeepAlive()
            self._reader = asyncio.get_running_loop().create_task(
                self._read(self._call), name="etcd-lease-keepalive-reader"
            )
        for lease in leases:
            self._waiting[lease.id] = lease
            await self._call.write(g.rpc.LeaseKeepAliveRequest(ID=lease.id))

    async def _read(self, call: Any) -> None:
        g = self._client._g
        try:
            while True:
                resp = await call.read()
                if resp is g.aio.EOF:
                    break
                lease = self._waiting.pop(resp.ID, None)
                if lease is not None and resp.TTL <= 0:
                    self.forget(resp.ID)
                    lease._expired()
        except g.aio.AioRpcError:
            pass
        if call is self._call:  # broken or ended: the next renewal opens a new stream
            self._call = None
            self._wake.set()

    def _drop_stream(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def aclose(self) -> None:
        for t in (self._task, self._reader):
            if t is not None:
                t.cancel()
        for t in (self._task, self._reader):
            if t is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        self._drop_stream()


class EtcdStoreClient:
    """The Store port over an etcd v3 cluster.  Create with :meth:`connect`."""

    def __init__(self) -> None:  # use connect()
        self._g = _grpc()
        self._clock: AsyncioClock = AsyncioClock()
        self._prefix = b"/elastic/"
        self._endpoints: list[_Endpoint] = []  # empty: (re)connect on first use
        self._names: list[str] = []
        self._credentials: Any = None
        self._current = 0
        self._read_timeout = 60.0
        self._closed = False
        self._keeper = _KeepAlive(self)
        # what a benchmark reads: operations, bytes of key + value written (as
        # MemoryStore counts them), and add() transactions lost to a concurrent writer
        self.stats = StoreStats()
        self.cas_retries = 0
        self._granted: dict[int, EtcdLease] = {}  # not known to be expired or revoked
        self._add_locks: dict[str, asyncio.Lock] = {}

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[str],
        *,
        prefix: str = "/elastic/",
        clock: AsyncioClock | None = None,
        protocol: str = "http",
        cacert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        read_timeout: float = 60,
    ) -> EtcdStoreClient:
        """Connect to the cluster; the first endpoint that answers is used first.

        ``endpoints`` are ``host:port`` of one or more members.  ``protocol="https"``
        uses TLS with ``cacert`` (PEM file; the system roots if ``None``) and, for
        client authentication, ``cert`` and ``key``.  Raises
        :class:`~elastic.errors.StoreError` when no endpoint answers.
        """
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise ConfigError("etcd endpoints", "no endpoint given; expected host:port,...")
        names = [parse_endpoint(e) for e in endpoints]
        if protocol not in ("http", "https"):
            raise ConfigError("etcd protocol", f"{protocol!r}; expected 'http' or 'https'")
        if read_timeout <= 0:
            raise ConfigError("etcd read_timeout", f"{read_timeout!r}; expected seconds > 0")
        if (cert is None) != (key is None):
            raise ConfigError("etcd cert/key", "give both the client certificate and its key")
        self = cls()
        if clock is not None:
            self._clock = clock
        self._prefix = prefix.encode()
        self._read_timeout = float(read_timeout)
        credentials = None
        if protocol == "https":

            def pem(path: str | None, what: str) -> bytes | None:
                if path is None:
                    return None
                try:
                    with open(path, "rb") as f:
                        return f.read()
                except OSError as e:
                    raise ConfigError(f"etcd {what}", f"{path}: {e.strerror}") from None

            credentials = self._g.grpc.ssl_channel_credentials(
                root_certificates=pem(cacert, "cacert"),
                private_key=pem(key, "key"),
                certificate_chain=pem(cert, "cert"),
            )
        self._names, self._credentials = names, credentials
        self._open_channels()
        await self._first_contact(min(self._read_timeout, 5.0))
        _clients.add(self)
        return self

    def _open_channels(self) -> None:
        if _grpc_lost_in_fork:
            raise StoreError(f"etcd at {', '.join(self._names)}: {GRPC_AFTER_FORK}")
        self._endpoints = [_Endpoint(n, self._g, self._credentials) for n in self._names]

    def _set_aside_after_fork(self) -> None:
        """In a forked child: drop what the parent's threads own, without touching it."""
        if self._closed:
            return
        _set_aside.append((self._endpoints, self._keeper, self._add_locks, self._granted))
        self._endpoints = []
        self._keeper = _KeepAlive(self)
        self._add_locks = {}
        self._granted = {}  # the parent's leases: the parent renews or revokes them

    async def _first_contact(self, per_endpoint: float) -> None:
        """Ask every endpoint at once; start on the first that answers (a dead member
        listed first costs nothing)."""
        g = self._g

        async def status(i: int) -> int:
            await self._endpoints[i].maintenance.Status(
                g.rpc.StatusRequest(), timeout=per_endpoint, wait_for_ready=True
            )
            return i

        pending = {asyncio.ensure_future(status(i)) for i in range(len(self._endpoints))}
        errors: list[str] = []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                answered = []
                for t in done:  # read every outcome, so none is reported as unretrieved
                    e = t.exception()
                    if e is None:
                        answered.append(t.result())
                    elif isinstance(e, g.aio.AioRpcError):
                        errors.append(f"{e.code().name} {e.details()}")
                    else:
                        raise e
                if answered:
                    self._current = min(answered)
                    return
        finally:
            for t in pending:
                t.cancel()
        await self.aclose()
        raise StoreError(
            f"no etcd endpoint answered within {per_endpoint:g}s "
            f"({', '.join(self.endpoints)}: {'; '.join(errors)}); is etcd running there?"
        )

    async def aclose(self, *, revoke_leases: bool = False) -> None:
        """Close the client.  By default its leases are no longer renewed and their keys
        expire ``ttl`` later (as if this process died); with ``revoke_leases`` they are
        revoked first, so their keys vanish now (a graceful leave)."""
        if self._closed:
            return
        if revoke_leases:
            for lease in list(self._granted.values()):
                await lease.revoke()
        self._closed = True
        _clients.discard(self)
        await self._keeper.aclose()
        for ep in self._endpoints:
            await ep.channel.close()
        # freed now, not when the collector finds the client's cycles: gRPC stops its
        # poller thread once no channel is left, and a fork after that is clean
        self._endpoints = []
        _note_close()

    @property
    def endpoints(self) -> list[str]:
        return list(self._names)

    @property
    def prefix(self) -> str:
        return self._prefix.decode()

    # -- plumbing ---------------------------------------------------------------------
    def _ep(self) -> _Endpoint:
        if not self._endpoints:  # after a fork: reconnect, on the loop that uses us now
            self._check_open()
            self._open_channels()
        return self._endpoints[self._current]

    def _rotate_from(self, ep: _Endpoint) -> None:
        """Move on from ``ep`` (unless another call already did)."""
        if self._endpoints[self._current] is ep:
            self._current = (self._current + 1) % len(self._endpoints)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the etcd store client is closed; connect a new one")

    def _k(self, key: str) -> bytes:
        return self._prefix + key.encode()

    async def _unary(
        self,
        what: str,
        call: Callable[[_Endpoint, float], Awaitable[T]],
        *,
        ok_codes: tuple[Any, ...] = (),
    ) -> T | None:
        """Run ``call(endpoint, attempt timeout)``, failing over until ``read_timeout``."""
        g = self._g
        deadline = self._clock.now() + self._read_timeout
        delay = 0.05
        tried = 0
        while True:
            self._check_open()
            ep = self._ep()
            remaining = deadline - self._clock.now()
            try:
                return await call(ep, max(0.001, min(remaining, ATTEMPT_TIMEOUT)))
            except g.aio.AioRpcError as e:
                code = e.code()
                if code in ok_codes:
                    return None
                if self._closed and code == g.cancelled:
                    raise StoreClosedError(f"the etcd store client closed during {what}") from None
                left = deadline - self._clock.now()
                if code not in g.retry and code != g.deadline:
                    raise StoreError(
                        f"etcd at {ep.name}: {what} failed: {code.name}: {e.details()}"
                    ) from None
                if left <= 0:
                    if code == g.deadline:
                        raise TimeoutError(
                            f"etcd at {ep.name}: {what} got no answer within "
                            f"read_timeout={self._read_timeout:g}s"
                        ) from None
                    raise StoreError(
                        f"etcd: {what} failed on every endpoint for {self._read_timeout:g}s "
                        f"({', '.join(self.endpoints)}); last, {ep.name}: "
                        f"{code.name}: {e.details()}"
                    ) from None
                self._rotate_from(ep)
                tried += 1
                if tried % len(self._endpoints) == 0:  # a full turn: wait before the next
                    await asyncio.sleep(min(delay, left))
                    delay = min(2 * delay, 1.0)

    async def _must(self, what: str, call: Callable[[_Endpoint, float], Awaitable[T]]) -> T:
        r = await self._unary(what, call)
        assert r is not None  # no ok_codes: every failure raised
        return r

    async def _range(self, key: bytes, range_end: bytes = b"") -> Any:
        req = self._g.rpc.RangeRequest(key=key, range_end=range_end)
        return await self._must(f"range {key!r}", lambda ep, t: ep.kv.Range(req, timeout=t))

    async def _txn(
        self, what: str, compare: list[Any], success: list[Any], failure: list[Any]
    ) -> Any:
        req = self._g.rpc.TxnRequest(compare=compare, success=success, failure=failure)
        return await self._must(what, lambda ep, t: ep.kv.Txn(req, timeout=t))

    def _put_op(self, key: bytes, value: bytes, lease: int = 0) -> Any:
        return self._g.rpc.RequestOp(
            request_put=self._g.rpc.PutRequest(key=key, value=value, lease=lease)
        )

    def _range_op(self, key: bytes) -> Any:
        return self._g.rpc.RequestOp(request_range=self._g.rpc.RangeRequest(key=key))

    async def _watch_first(
        self, key: bytes, range_end: bytes, start: int, accept: Callable[[Any], bool]
    ) -> tuple[int, Any]:
        """The first event on ``[key, range_end)`` at revision >= ``start`` that
        ``accept`` takes: ``(its revision, event)``; ``(current revision, None)`` if
        ``start`` was compacted away.  One watch stream per call; a broken stream is
        re-created on the next endpoint from the last revision seen."""
        g = self._g
        delay = 0.05
        while True:
            self._check_open()
            ep = self._ep()
            # "hasleader": the member ends the stream if it loses its leader (a partitioned
            # member would otherwise keep a watch open that never fires); we move on
            call = ep.watch.Watch(metadata=_REQUIRE_LEADER)
            try:
                create = g.rpc.WatchCreateRequest(
                    key=key, range_end=range_end, start_revision=start
                )
                await call.write(g.rpc.WatchRequest(create_request=create))
                while True:
                    resp = await call.read()
                    if resp is g.aio.EOF:
                        break
                    if resp.compact_revision:  # (this reply's header carries no revision)
                        return max(await self.revision(), int(resp.compact_revision)), None
                    if resp.canceled:
                        raise StoreError(
                            f"etcd at {ep.name}: the watch on {key!r} was cancelled: "
                            f"{resp.cancel_reason or 'no reason given'}"
                        )
                    for ev in resp.events:
                        start = int(ev.kv.mod_revision) + 1
                        if accept(ev):
                            return int(ev.kv.mod_revision), ev
                    delay = 0.05
            except g.aio.AioRpcError as e:
                code = e.code()
                if self._closed and code == g.cancelled:
                    raise StoreClosedError("the etcd store client closed during a watch") from None
                if code not in g.retry:
                    raise StoreError(
                        f"etcd at {ep.name}: watch on {key!r} failed: {code.name}: {e.details()}"
                    ) from None
            finally:
                call.cancel()
            self._rotate_from(ep)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    async def _in_time(self, timeout: float | None, coro: Awaitable[T], message: str) -> T:
        if timeout is None:
            return await coro
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                return await coro
        except TimeoutError:
            raise TimeoutError(message) from None

    # -- the port ----------------------------------------------------------------------
    async def set(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        self._check_open()
        self.stats.ops += 1
        lid = self._own(lease, key)
        req = self._g.rpc.PutRequest(key=self._k(key), value=bytes(value), lease=lid)
        try:
            await self._must(f"set {key!r}", lambda ep, t: ep.kv.Put(req, timeout=t))
        except StoreError as e:
            raise self._lease_gone(e, lease, lid, key) from None
        self.stats.bytes_written += len(req.key) + len(req.value)

    @staticmethod
    def _lease_gone(e: StoreError, lease: Lease | None, lid: int, key: str) -> StoreError:
        """What a write attaching ``key`` to ``lease`` raises when etcd refused it."""
        if lease is None or "lease not found" not in str(e):
            return e
        if isinstance(lease, EtcdLease):
            lease._expired()
        return StoreError(f"lease {lid:x} has expired; cannot attach {key!r} to it")

    def _own(self, lease: Lease | None, key: str) -> int:
        if lease is None:
            return 0
        if not isinstance(lease, EtcdLease) or lease._client is not self:
            raise StoreError("that lease was granted by another store")
        if not lease.alive():
            raise StoreError(f"lease {lease.id:x} has expired; cannot attach {key!r} to it")
        return lease.id

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        self._check_open()
        self.stats.ops += 1
        k = self._k(key)
        # the first read is not under ``timeout``: a present key returns even at timeout=0
        resp = await self._range(k)
        if resp.kvs:
            return bytes(resp.kvs[0].value)
        shown = "forever" if timeout is None else f"{timeout:g}s"
        return await self._in_time(
            timeout,
            self._wait_put(k, int(resp.header.revision) + 1),
            f"key {key!r} was not set within {shown}",
        )

    async def _wait_put(self, k: bytes, start: int) -> bytes:
        """The value of the first put of ``k`` at revision >= ``start`` (no polling)."""
        put = self._g.rpc.Event.PUT
        while True:
            _, ev = await self._watch_first(k, b"", start, lambda e: e.type == put)
            if ev is not None:
                return bytes(ev.kv.value)
            resp = await self._range(k)  # compacted under us: read again
            if resp.kvs:
                return bytes(resp.kvs[0].value)
            start = int(resp.header.revision) + 1

    async def try_get(self, key: str) -> bytes | None:
        self._check_open()
        self.stats.ops += 1
        resp = await self._range(self._k(key))
        return bytes(resp.kvs[0].value) if resp.kvs else None

    async def add(self, key: str, amount: int) -> int:
        self._check_open()
        self.stats.ops += 1
        # tasks of one client adding to one key queue here instead of racing in etcd
        lock = self._add_locks.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                return await self._add(key, amount)
        finally:
            if not lock.locked() and self._add_locks.get(key) is lock:
                del self._add_locks[key]

    async def _add(self, key: str, amount: int) -> int:
        rpc = self._g.rpc
        k = self._k(key)
        resp = await self._range(k)
        kvs = resp.kvs
        tries = 0
        while True:
            cur = bytes(kvs[0].value) if kvs else None
            mod = int(kvs[0].mod_revision) if kvs else 0
            try:
                base = int(cur) if cur is not None else 0
            except ValueError:
                shown = (cur or b"")[:40]
                raise StoreError(f"add({key!r}): the value {shown!r} is not an integer") from None
            new = base + amount
            cmp = rpc.Compare(
                key=k,
                target=rpc.Compare.MOD,
                result=rpc.Compare.EQUAL,
                mod_revision=mod,
            )
            value = str(new).encode()
            t = await self._txn(
                f"add {key!r}", [cmp], [self._put_op(k, value)], [self._range_op(k)]
            )
            if t.succeeded:
                self.stats.bytes_written += len(k) + len(value)
                return new
            kvs = t.responses[0].response_range.kvs  # lost a race: the value now
            # Back off before the next try: N nodes adding at once would otherwise cost
            # O(N^2) transactions (each round one wins, the rest retry at once).  etcd
            # has no server-side increment; torch's EtcdStore sleeps U(0, 0.1) s too.
            self.cas_retries += 1
            await asyncio.sleep(random.uniform(0, min(0.25, 0.001 * 2**tries)))
            tries += 1

    async def arrive(
        self, counter: str, key: str, value: bytes, under: str, *, lease: Lease | None = None
    ) -> tuple[int, int, int, bool]:
        """An arrival as one transaction (:class:`~elastic.store.ArriveStore`): fenced on
        the counter's mod revision as :meth:`add` is, it reads the keys under ``under``
        and ``key`` itself before its two puts (so the counts do not depend on whether a
        range in a transaction sees the transaction's own puts) and retries, with the
        same back-off, when another arrival changed the counter first."""
        self._check_open()
        self.stats.ops += 1
        lid = self._own(lease, key)
        lock = self._add_locks.setdefault(counter, asyncio.Lock())
        try:
            async with lock:
                return await self._arrive(counter, key, bytes(value), under, lid, lease)
        finally:
            if not lock.locked() and self._add_locks.get(counter) is lock:
                del self._add_locks[counter]

    async def _arrive(
        self, counter: str, key: str, value: bytes, under: str, lid: int, lease: Lease | None
    ) -> tuple[int, int, int, bool]:
        rpc = self._g.rpc
        c, k, u = self._k(counter), self._k(key), self._k(under)

        def count(key: bytes, range_end: bytes = b"") -> Any:
            return rpc.RequestOp(
                request_range=rpc.RangeRequest(key=key, range_end=range_end, count_only=True)
            )

        reads = [count(u, _range_end(u)), count(k), count(u)]
        kvs = (await self._range(c)).kvs
        tries = 0
        while True:
            cur = bytes(kvs[0].value) if kvs else None
            try:
                base = int(cur) if cur is not None else 0
            except ValueError:
                shown = (cur or b"")[:40]
                raise StoreError(
                    f"arrive: the counter {counter!r} holds {shown!r}, not an integer"
                ) from None
            cmp = rpc.Compare(
                key=c,
                target=rpc.Compare.MOD,
                result=rpc.Compare.EQUAL,
                mod_revision=int(kvs[0].mod_revision) if kvs else 0,
            )
            n = str(base + 1).encode()
            try:
                t = await self._txn(
                    f"arrive {key!r}",
                    [cmp],
                    [*reads, self._put_op(c, n), self._put_op(k, value, lid)],
                    [self._range_op(c)],
                )
            except StoreError as e:
                raise self._lease_gone(e, lease, lid, key) from None
            if t.succeeded:
                self.stats.bytes_written += len(c) + len(n) + len(k) + len(value)
                under_n, had_key, marked = (int(r.response_range.count) for r in t.responses[:3])
                # the counts were read before the puts: add this key if it is new under u
                present = under_n + (1 if k.startswith(u) and not had_key else 0)
                return base + 1, int(t.header.revision), present, marked > 0
            kvs = t.responses[0].response_range.kvs  # lost a race: the counter now
            self.cas_retries += 1
            await asyncio.sleep(random.uniform(0, min(0.25, 0.001 * 2**tries)))
            tries += 1

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Lease | None = None
    ) -> bytes:
        self._check_open()
        self.stats.ops += 1
        lid = self._own(lease, key)
        rpc = self._g.rpc
        k = self._k(key)
        if expected is None:
            cmp = rpc.Compare(
                key=k, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0
            )
        else:
            cmp = rpc.Compare(
                key=k, target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL, value=bytes(expected)
            )
        try:
            t = await self._txn(
                f"compare_set {key!r}",
                [cmp],
                [self._put_op(k, bytes(desired), lid)],
                [self._range_op(k)],
            )
        except StoreError as e:
            raise self._lease_gone(e, lease, lid, key) from None
        if t.succeeded:
            self.stats.bytes_written += len(k) + len(desired)
            return bytes(desired)
        kvs = t.responses[0].response_range.kvs
        return bytes(kvs[0].value) if kvs else b""

    async def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        self._check_open()
        self.stats.ops += 1
        # which keys are missing, read before the clock starts (so timeout=0 works)
        missing: list[tuple[str, int]] = []
        for key in keys:
            resp = await self._range(self._k(key))
            if not resp.kvs:
                missing.append((key, int(resp.header.revision) + 1))
        if not missing:
            return

        async def all_of() -> None:
            for key, start in missing:
                await self._wait_put(self._k(key), start)

        if timeout is None:
            await all_of()
            return
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await all_of()
        except TimeoutError:
            still = [k for k in keys if await self.try_get(k) is None]
            raise TimeoutError(
                f"keys {still[:5]!r}{'…' if len(still) > 5 else ''} "
                f"were not set within {timeout:g}s"
            ) from None

    async def delete(self, key: str) -> bool:
        self._check_open()
        self.stats.ops += 1
        req = self._g.rpc.DeleteRangeRequest(key=self._k(key))
        resp = await self._must(f"delete {key!r}", lambda ep, t: ep.kv.DeleteRange(req, timeout=t))
        return int(resp.deleted) > 0

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        await self.wait(keys, timeout)
        if not keys:
            return []
        out: list[bytes] = []
        for i in range(0, len(keys), MAX_TXN_OPS):
            chunk = keys[i : i + MAX_TXN_OPS]
            t = await self._txn(
                f"multi_get {chunk[0]!r}…", [], [self._range_op(self._k(k)) for k in chunk], []
            )
            for r in t.responses:
                kvs = r.response_range.kvs
                if not kvs:  # deleted between the wait and the read: wait again
                    return await self.multi_get(keys, timeout)
                out.append(bytes(kvs[0].value))
        return out

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        self._check_open()
        self.stats.ops += 1
        if not items:
            return
        if len(items) > MAX_TXN_OPS:
            raise StoreError(
                f"multi_set of {len(items)} keys: etcd applies at most {MAX_TXN_OPS} in one "
                "transaction (--max-txn-ops); split the call"
            )
        ops = [self._put_op(self._k(k), bytes(v)) for k, v in items.items()]
        await self._txn(f"multi_set {next(iter(items))!r}…", [], ops, [])
        self.stats.bytes_written += sum(len(self._k(k)) + len(v) for k, v in items.items())

    async def grant_lease(self, ttl: float) -> Lease:
        self._check_open()
        if not ttl > 0:
            raise StoreError(f"lease ttl must be positive, got {ttl!r}")
        self.stats.ops += 1
        req = self._g.rpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl)))
        resp = await self._must("grant lease", lambda ep, t: ep.lease.LeaseGrant(req, timeout=t))
        if resp.error:
            raise StoreError(f"etcd at {self._ep().name}: grant lease failed: {resp.error}")
        # etcd grants whole seconds and at least its minimum TTL (1.5 x election timeout)
        lease = EtcdLease(self, int(resp.ID), float(resp.TTL))
        self._granted[lease.id] = lease
        self._keeper.add(lease)
        return lease

    async def snapshot(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        self._check_open()
        self.stats.ops += 1
        p = self._k(prefix)
        resp = await self._range(p, _range_end(p))
        cut = len(self._prefix)
        return int(resp.header.revision), {
            bytes(kv.key)[cut:].decode(): bytes(kv.value) for kv in resp.kvs
        }

    async def watch(self, prefix: str, after: int, timeout: float | None = None) -> int:
        """The first revision > ``after`` that changed a key under ``prefix``.

        With a ``timeout``, changes already made (revisions up to now) are still
        reported however short it is: etcd replays a new watcher's history from its
        sync loop (every 100 ms), so when the store has moved past ``after`` the
        replay gets up to :data:`REPLAY_GRACE` seconds before ``timeout`` counts.
        """
        rev, _ = await self._wake(prefix, after, timeout)
        return rev

    async def _wake(self, prefix: str, after: int, timeout: float | None) -> tuple[int, Any]:
        """The wait of :meth:`watch` and :meth:`watch_snapshot` (one operation):
        (the first revision > ``after`` under ``prefix``, its event; None if compacted)."""
        self._check_open()
        self.stats.ops += 1
        p = self._k(prefix)
        if timeout is not None and await self.revision() > after:
            timeout = max(timeout, REPLAY_GRACE)
        return await self._in_time(
            timeout,
            self._watch_first(p, _range_end(p), after + 1, lambda e: True),
            f"no change under {prefix!r} after revision {after} within {timeout}s",
        )

    async def watch_snapshot(
        self, prefix: str, after: int, read_prefix: str, timeout: float | None = None
    ) -> tuple[int, dict[str, bytes]]:
        """:meth:`watch`, then ``read_prefix`` as it was at the revision that woke it
        (:class:`~elastic.store.WatchSnapshotStore`).

        etcd's watch answers with the event, not a range, so this is two RPCs inside
        the store (the watch, then a ``Range`` at the event's revision), one operation
        to the caller.  If that revision was compacted in between (or the watch woke
        because its start was), the range is read at the current revision instead,
        which the port allows (the revision returned is at least the woken one).
        """
        rev, event = await self._wake(prefix, after, timeout)
        q = self._k(read_prefix)
        g = self._g
        resp = None
        if event is not None:
            at = g.rpc.RangeRequest(key=q, range_end=_range_end(q), revision=rev)
            resp = await self._unary(
                f"range {q!r} at revision {rev}",
                lambda ep, t: ep.kv.Range(at, timeout=t),
                ok_codes=(g.out_of_range,),
            )
        if resp is None:
            resp = await self._range(q, _range_end(q))
            rev = int(resp.header.revision)
        cut = len(self._prefix)
        return rev, {bytes(kv.key)[cut:].decode(): bytes(kv.value) for kv in resp.kvs}

    async def revision(self) -> int:
        """The cluster's current revision."""
        req = self._g.rpc.RangeRequest(
            key=self._prefix, range_end=_range_end(self._prefix), count_only=True
        )
        resp = await self._must("read the revision", lambda ep, t: ep.kv.Range(req, timeout=t))
        return int(resp.header.revision)


def cas_delay() -> None:
    """torch's pause (0 to 0.1 s, random) between its v2 compare-and-swap retries.  Ours
    makes each operation one v3 transaction and never retries; kept for programs that
    call it (``elastic.rendezvous.etcd_store.cas_delay``)."""
    time.sleep(random.uniform(0, 0.1))
