"""The ``--rdzv-conf`` keys each rendezvous backend accepts, and their check.

Pure data and one pure function (no I/O): ``elastic run`` checks the keys before it
starts anything, so a misspelt key is one line naming it instead of a setting silently
ignored (torch ignores unknown keys).

Keys, with what they do here:

* every backend: ``timeout`` (torch's legacy ``--rdzv-timeout``, set by the launcher),
  ``read_timeout`` (seconds a store operation may wait for an unreachable store before
  the agent gives up; default 60), ``token`` (the shared secret of the agent-hosted
  store; also ``ELASTIC_RDZV_TOKEN`` — never logged);
* ``c10d``, ``etcd``, ``etcd-v2`` (the dynamic rendezvous): ``join_timeout``,
  ``last_call_timeout``, ``close_timeout``, ``heartbeat_timeout`` (the lease's
  time-to-live), ``keep_alive_interval``, ``keep_alive_max_attempt``, ``master_port``
  (ours: the port rank 0 gives its workers instead of a free one);
* ``c10d``: ``is_host`` (this agent hosts the store; default: the endpoint's host is
  this machine), ``store_type`` (``tcp`` only);
* ``etcd``, ``etcd-v2``: ``protocol`` (``http``/``https``), ``cacert``/``ca_cert``,
  ``cert``/``ssl_cert``, ``key``/``ssl_cert_key`` (torch's two spellings), ``etcd_prefix``;
* ``static``: ``rank`` (set from ``--node-rank``), ``heartbeat_timeout``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["BACKEND_KEYS", "check_rdzv_conf"]

_COMMON = frozenset({"timeout", "read_timeout", "token"})
_DYNAMIC = frozenset(
    {
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
        "master_port",
    }
)
_ETCD = frozenset(
    {"protocol", "cacert", "ca_cert", "cert", "ssl_cert", "key", "ssl_cert_key", "etcd_prefix"}
)

BACKEND_KEYS: dict[str, frozenset[str]] = {
    "c10d": _COMMON | _DYNAMIC | {"is_host", "store_type"},
    "etcd": _COMMON | _DYNAMIC | _ETCD,
    "etcd-v2": _COMMON | _DYNAMIC | _ETCD,
    "static": _COMMON | {"rank", "heartbeat_timeout"},
}


def check_rdzv_conf(backend: str, conf: Mapping[str, Any]) -> str | None:
    """Why ``conf`` is not acceptable for ``backend`` (one line), or ``None``.

    Backends registered by users are not known here: anything goes for them.
    """
    known = BACKEND_KEYS.get(backend)
    if known is None:
        return None
    unknown = sorted(k for k in conf if k not in known)
    if unknown:
        return (
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for "
            f"--rdzv-backend {backend}; expected some of {', '.join(sorted(known))}"
        )
    store_type = conf.get("store_type")
    if store_type is not None and str(store_type).lower() != "tcp":
        return f"store_type={store_type!r}: only 'tcp' (the agent-hosted store) is available"
    protocol = conf.get("protocol")
    if protocol is not None and str(protocol).lower() not in ("http", "https"):
        return f"protocol={protocol!r}: expected http or https"
    return None
