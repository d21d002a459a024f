"""The store a real agent's rendezvous runs on: in memory, hosted, joined, or etcd.

Which store (torch's rules, and where they differ):

* one node (``--standalone``, ``--nnodes 1``): an in-memory store in the agent's own
  process.  Nobody else can join, so no socket is opened (launch latency is a benchmark).
* ``c10d`` on several nodes: the agent-hosted network store
  (:mod:`elastic.real.netstore`) at ``--rdzv-endpoint`` (default port 29400).  The agent
  whose machine the endpoint's host names (or with ``--rdzv-conf is_host=true``) hosts it,
  bound to that address; the others connect.  When the host was guessed and the port is
  taken on this machine (several agents of one job on one machine), the agent joins as a
  client instead — torch's rule.  Every agent, the host included, talks to the store as
  a client, so leases work the same for all.
* ``etcd`` / ``etcd-v2``: the etcd v3 API (:mod:`elastic.real.etcdstore`); the endpoint
  may list several members (``h1:2379,h2:2379``).
* ``static`` on several nodes: node rank 0 hosts the network store at
  ``--master-addr:--master-port`` (where torch hosts its TCPStore); the others connect.

A shared token (``--rdzv-conf token=…`` or ``ELASTIC_RDZV_TOKEN``) is demanded by the
hosted store and presented by its clients; it is never logged.

Invariant: whatever opened here is closed by :meth:`RendezvousStore.aclose`, which a
host calls only after the other agents left (or ``linger`` seconds), so that an agent
that finished first does not take the store away from the others' last writes.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from elastic.errors import ConfigError
from elastic.rendezvous.utils import parse_rendezvous_endpoint
from elastic.store import Store

if TYPE_CHECKING:
    from elastic.real.clock import AsyncioClock
    from elastic.real.netstore import StoreServer

__all__ = [
    "DEFAULT_C10D_PORT",
    "DEFAULT_ETCD_PORT",
    "TOKEN_ENV",
    "RendezvousStore",
    "matches_this_machine",
    "open_rendezvous_store",
]

logger = logging.getLogger(__name__)

DEFAULT_C10D_PORT = 29400
DEFAULT_ETCD_PORT = 2379
TOKEN_ENV = "ELASTIC_RDZV_TOKEN"
DEFAULT_READ_TIMEOUT = 60.0


class RendezvousStore:
    """An opened store: the port, what hosts it (if this agent does), and how to close."""

    def __init__(
        self,
        store: Store,
        where: str,
        *,
        server: StoreServer | None = None,
        closer: Any = None,
    ) -> None:
        self.store = store
        self.where = where
        self.server = server
        self._closer = closer

    @property
    def hosting(self) -> bool:
        return self.server is not None

    async def aclose(self, linger: float = 0.0) -> None:
        """Close the client, then (a host) wait up to ``linger`` s for the others to leave."""
        try:
            if self._closer is not None:
                await self._closer()
        finally:
            if self.server is not None:
                if linger > 0:
                    await self.server.wait_idle(linger)
                await self.server.aclose()


def _local_addresses() -> set[str]:
    import psutil

    addrs = {"127.0.0.1", "::1"}
    for infos in psutil.net_if_addrs().values():
        for a in infos:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                addrs.add(a.address.split("%", 1)[0])
    return addrs


def _is_loopback(host: str) -> bool:
    """``host`` is a loopback address in any spelling (``127.0.0.2``, ``0:…:0:1``)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _resolve(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return sorted({str(i[4][0]) for i in infos})


def matches_this_machine(host: str) -> bool:
    """torch's ``_matches_machine_hostname``: ``host`` names this machine."""
    if host == "localhost" or _is_loopback(host):
        return True
    if host in (socket.gethostname(), socket.getfqdn()):
        return True
    local = _local_addresses()
    return any(a in local for a in _resolve(host))


def _bind_address(host: str) -> str:
    """The local address ``host`` resolves to (bind there), else every interface."""
    if host == "localhost":
        return "127.0.0.1"
    local = _local_addresses()
    for a in _resolve(host):
        if a in local:
            return a
    return "0.0.0.0"


def _token(conf: Mapping[str, Any]) -> str | None:
    token = conf.get("token") or os.environ.get(TOKEN_ENV) or None
    return None if token is None else str(token)


def linger(conf: Mapping[str, Any]) -> float:
    """How long a store host waits at its close for the other agents to leave: the
    rendezvous' ``close_timeout`` (30 s; the handler refuses a bad value, so here one
    only falls back to the default)."""
    try:
        return float(conf.get("close_timeout", 30))
    except (TypeError, ValueError):
        return 30.0


def _float_key(conf: Mapping[str, Any], key: str, default: float) -> float:
    raw = conf.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not 0 < value < 1e9:
        raise ConfigError("--rdzv-conf", f"{key}={raw!r}; expected seconds > 0")
    return value


def _bool_key(conf: Mapping[str, Any], key: str) -> bool | None:
    raw = conf.get(key)
    if raw is None or isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "t", "yes", "y"):
        return True
    if text in ("0", "false", "f", "no", "n"):
        return False
    raise ConfigError("--rdzv-conf", f"{key}={raw!r}; expected true or false")


def _endpoint(endpoint: str, default_port: int, flag: str = "--rdzv-endpoint") -> tuple[str, int]:
    try:
        return parse_rendezvous_endpoint(endpoint, default_port)
    except ValueError as e:
        raise ConfigError(flag, f"got {endpoint!r}; {e}") from None


async def _host_or_join(
    host: str,
    port: int,
    *,
    is_host: bool | None,
    token: str | None,
    read_timeout: float,
    clock: AsyncioClock,
    what: str,
) -> RendezvousStore:
    from elastic.real.netstore import NetStoreClient, StoreServer

    server: StoreServer | None = None
    guessed = is_host is None
    if is_host is None:
        is_host = matches_this_machine(host)
    connect_host = host
    if is_host:
        bind = _bind_address(host)
        candidate = StoreServer(bind, port, token=token)
        try:
            await candidate.start()
        except OSError as e:
            if not guessed:
                raise ConfigError(
                    "--rdzv-endpoint",
                    f"cannot host the {what} store at {bind}:{port}: {e.strerror or e}",
                ) from None
            logger.info(
                "The %s store port %s:%d is taken on this machine; joining as a client",
                what,
                bind,
                port,
            )
        else:
            server = candidate
            connect_host = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
            port = candidate.port
    try:
        client = await NetStoreClient.connect(
            connect_host,
            port,
            token=token,
            clock=clock,
            connect_timeout=read_timeout,
            read_timeout=read_timeout,
        )
    except BaseException:
        if server is not None:
            await server.aclose()
        raise
    where = f"{what} store {'hosted here at' if server else 'at'} {connect_host}:{port}"
    return RendezvousStore(client, where, server=server, closer=client.aclose)


async def _open_etcd(
    endpoint: str, conf: Mapping[str, Any], read_timeout: float, clock: AsyncioClock
) -> RendezvousStore:
    from elastic.real.etcdstore import EtcdStoreClient

    members = [e for e in (p.strip() for p in endpoint.split(",")) if e]
    if not members:
        raise ConfigError(
            "--rdzv-endpoint", f"got {endpoint!r}; the etcd backend needs host:port[,host:port…]"
        )
    endpoints = []
    for m in members:
        h, p = _endpoint(m, DEFAULT_ETCD_PORT)
        endpoints.append(f"[{h}]:{p}" if ":" in h else f"{h}:{p}")
    protocol = str(conf.get("protocol") or "http").lower()
    prefix = str(conf.get("etcd_prefix") or "/elastic/")
    client = await EtcdStoreClient.connect(
        endpoints,
        prefix=prefix,
        clock=clock,
        protocol=protocol,
        cacert=conf.get("cacert") or conf.get("ca_cert"),
        cert=conf.get("cert") or conf.get("ssl_cert"),
        key=conf.get("key") or conf.get("ssl_cert_key"),
        read_timeout=read_timeout,
    )
    return RendezvousStore(client, f"etcd at {','.join(endpoints)}", closer=client.aclose)


async def open_rendezvous_store(
    backend: str,
    endpoint: str,
    max_nodes: int,
    conf: Mapping[str, Any],
    clock: AsyncioClock,
) -> RendezvousStore:
    """Open the store ``backend`` needs for a job of up to ``max_nodes`` nodes.

    Raises :class:`ConfigError` for a bad endpoint or key, and the store's own errors
    (:class:`~elastic.errors.StoreError`, :class:`TimeoutError`) when it cannot be reached
    within ``read_timeout``.
    """
    read_timeout = _float_key(conf, "read_timeout", DEFAULT_READ_TIMEOUT)
    if backend in ("etcd", "etcd-v2"):
        return await _open_etcd(endpoint, conf, read_timeout, clock)
    # one node needs no network store, unless told that another process hosts it
    if max_nodes <= 1 and backend in ("c10d", "static") and _bool_key(conf, "is_host") is not False:
        from elastic.memstore import MemoryStore

        store = MemoryStore(clock)
        return RendezvousStore(store, "in-process store (one node)")
    token = _token(conf)
    if backend == "c10d":
        host, port = _endpoint(endpoint, DEFAULT_C10D_PORT)
        if port == 0:
            raise ConfigError(
                "--rdzv-endpoint",
                f"got {endpoint!r}; port 0 (any free port) only works for a one-node job: "
                f"give the port the other nodes will connect to (torch's default is "
                f"{DEFAULT_C10D_PORT})",
            )
        return await _host_or_join(
            host,
            port,
            is_host=_bool_key(conf, "is_host"),
            token=token,
            read_timeout=read_timeout,
            clock=clock,
            what="c10d",
        )
    if backend == "static":
        host, port = _endpoint(endpoint, -1, "--master-addr/--master-port")
        if port <= 0:
            raise ConfigError(
                "--master-port",
                f"got {endpoint!r}; the static rendezvous of several nodes needs the port "
                "node 0 listens on",
            )
        rank = int(conf.get("rank", 0))
        return await _host_or_join(
            host,
            port,
            is_host=rank == 0,
            token=token,
            read_timeout=read_timeout,
            clock=clock,
            what="static rendezvous",
        )
    from elastic.memstore import MemoryStore

    # a user's own backend: it is given an in-process store and reaches its peers itself
    return RendezvousStore(MemoryStore(clock), "in-process store")
