"""torch's ``etcd_rendezvous_backend``: the rendezvous state as one key in etcd.

``client`` is any object implementing the store port (:class:`elastic.store.Store`):
the project's etcd v3 client, or :class:`~elastic.memstore.MemoryStore` in tests.  The
state is base64 of :class:`~elastic.rendezvous.backend_store.BackendStore`'s JSON.
"""

from __future__ import annotations

from typing import Any

from elastic.rendezvous.api import (
    RendezvousParameters,
    SyncRunner,
    SyncStore,
    torch_store,
)
from elastic.rendezvous.c10d_rendezvous_backend import KeyBackend, real_context
from elastic.rendezvous.utils import parse_rendezvous_endpoint
from elastic.store import Store

__all__ = ["EtcdRendezvousBackend", "create_backend"]


class EtcdRendezvousBackend(KeyBackend):
    """Represents an etcd-based rendezvous backend.

    Args:
        client: the store holding the state (the store port).
        run_id: the run id of the rendezvous.
        key_prefix: the path under which to store the rendezvous state.
        ttl: the TTL of the rendezvous state (default two hours).  Kept as torch's
            ``ttl`` attribute; the store port has no per-key TTL, so the state lives as
            long as the store (agents' liveness is held by leases instead).
    """

    _DEFAULT_TTL = 7200  # 2 hours
    _WHAT = "etcd"

    def __init__(
        self,
        client: Store | SyncStore,
        run_id: str,
        key_prefix: str | None = None,
        ttl: int | None = None,
        *,
        sync_runner: SyncRunner | None = None,
    ) -> None:
        key = key_prefix + "/" + run_id if key_prefix else run_id
        super().__init__(client, run_id, key, sync_runner=sync_runner)
        self._ttl = ttl if ttl and ttl > 0 else self._DEFAULT_TTL

    @property
    def name(self) -> str:
        """See base class."""
        return "etcd-v2"


def create_backend(params: RendezvousParameters) -> tuple[EtcdRendezvousBackend, Any]:
    """Create a new :class:`EtcdRendezvousBackend` from the specified parameters.

    torch's parameters and errors: ``read_timeout`` (positive, default 60),
    ``protocol`` (``http``/``https``), ``ssl_cert``, ``ssl_cert_key``, ``ca_cert``.  The
    store comes from :func:`elastic.real.rdzv_context.default_context`; the state key
    is under torch's ``/torch/elastic/rendezvous``.  Returns the backend and the store
    (a :class:`SyncStore`, prefixed ``/torch/elastic/store``).
    """
    parse_rendezvous_endpoint(params.endpoint, default_port=2379)
    read_timeout = params.get_as_int("read_timeout", 60)
    if read_timeout is None or read_timeout <= 0:
        raise ValueError("The read timeout must be a positive integer.")
    protocol = str(params.get("protocol", "http")).strip().lower()
    if protocol not in ("http", "https"):
        raise ValueError("The protocol must be HTTP or HTTPS.")

    from elastic.rendezvous.prefix_store import PrefixStore

    ctx = real_context(params, "etcd")
    assert ctx.sync_runner is not None
    backend = EtcdRendezvousBackend(
        ctx.store,
        params.run_id,
        key_prefix="/torch/elastic/rendezvous",
        sync_runner=ctx.sync_runner,
    )
    store = SyncStore(
        PrefixStore(ctx.store, "/torch/elastic/store/"), ctx.sync_runner, float(read_timeout)
    )
    return backend, torch_store(store)
