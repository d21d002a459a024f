"""torch's legacy ``etcd_rendezvous``: :class:`EtcdRendezvousHandler` (backend ``etcd``).

torch's legacy handler runs its own etcd v2 protocol (a rendezvous "barrier" of
ephemeral nodes and a polling loop).  Ours keeps its names, parameters and defaults and
runs the project's dynamic rendezvous (:mod:`.dynamic_rendezvous`) over the store port
the :class:`EtcdRendezvous` is given — the etcd v3 client, or a
:class:`~elastic.memstore.MemoryStore` — under ``etcd_prefix``: the same decisions as
the ``c10d`` backend, with etcd's watches and leases instead of polling.
"""

from __future__ import annotations

from datetime import timedelta

from elastic.clock import Clock
from elastic.rendezvous.api import RendezvousContext, RendezvousParameters
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from elastic.rendezvous.prefix_store import PrefixStore
from elastic.store import Store

__all__ = [
    "EtcdRendezvous",
    "EtcdRendezvousHandler",
    "EtcdRendezvousRetryImmediately",
    "EtcdRendezvousRetryableFailure",
    "create_rdzv_handler",
]

_DEFAULT_TIMEOUT = 600  # 10 minutes
_DEFAULT_LAST_CALL_TIMEOUT = 30  # 30 seconds
_DEFAULT_PREFIX = "/torchelastic/p2p"


class EtcdRendezvousRetryableFailure(Exception):
    """torch's: a step of its etcd v2 protocol that may be retried after a pause.

    Ours runs the dynamic rendezvous, which retries inside the handler and never raises
    this; the name is here for programs that import or catch it."""


class EtcdRendezvousRetryImmediately(Exception):
    """torch's: a step of its etcd v2 protocol to retry at once (never raised by ours,
    as :class:`EtcdRendezvousRetryableFailure`)."""


class EtcdRendezvous:
    """The parameters of a legacy etcd rendezvous (torch's constructor), and its ports.

    ``client`` is the store port holding the rendezvous; ``clock``, ``node_id`` and
    ``node_addr`` (keyword-only, ours) are the clock port and this node's identity.
    """

    def __init__(
        self,
        client: Store,
        prefix: str,
        run_id: str,
        num_min_workers: int,
        num_max_workers: int,
        timeout: float,
        last_call_timeout: float,
        *,
        clock: Clock,
        node_id: str,
        node_addr: str | None = None,
    ) -> None:
        if num_min_workers < 1:
            raise ValueError(
                f"The minimum number of workers ({num_min_workers}) must be greater than zero."
            )
        if num_max_workers < num_min_workers:
            raise ValueError(
                f"The maximum number of workers ({num_max_workers}) must be greater than or "
                f"equal to the minimum number of workers ({num_min_workers})."
            )
        self.client = client
        self._prefix = prefix if prefix.endswith("/") else prefix + "/"
        self._run_id = run_id
        self._num_min_workers = num_min_workers
        self._num_max_workers = num_max_workers
        self._timeout = timeout
        self._last_call_timeout = last_call_timeout
        self.clock = clock
        self.node_id = node_id
        self.node_addr = node_addr or node_id

    @property
    def run_id(self) -> str:
        return self._run_id


class EtcdRendezvousHandler(DynamicRendezvousHandler):
    """Implements a :class:`RendezvousHandler` backed by etcd (the ``etcd`` backend).

    Build it with :func:`create_rdzv_handler` (or ``get_rendezvous_handler`` with
    ``backend="etcd"``); see the module docstring for how it differs from torch's.
    """

    def __init__(self, rdzv_impl: EtcdRendezvous, local_addr: str | None = None) -> None:
        self._rdzv_impl = rdzv_impl
        settings = RendezvousSettings(
            rdzv_impl.run_id,
            rdzv_impl._num_min_workers,
            rdzv_impl._num_max_workers,
            RendezvousTimeout(
                join=timedelta(seconds=rdzv_impl._timeout),
                last_call=timedelta(seconds=rdzv_impl._last_call_timeout),
            ),
        )
        super().__init__(
            rdzv_impl.node_id,
            local_addr or rdzv_impl.node_addr,
            settings,
            "etcd",
            PrefixStore(rdzv_impl.client, rdzv_impl._prefix),
            rdzv_impl.clock,
        )


def create_rdzv_handler(
    params: RendezvousParameters, ctx: RendezvousContext | None = None
) -> EtcdRendezvousHandler:
    """Create an :class:`EtcdRendezvousHandler` from ``params`` (torch's keys).

    Keys: ``timeout`` (join, 600 s), ``last_call_timeout`` (30 s), ``etcd_prefix``
    (``/torchelastic/p2p``), ``protocol`` (``http``/``https``).  Without ``ctx`` the
    real ports come from :func:`elastic.real.rdzv_context.default_context`.
    """
    protocol = str(params.get("protocol", "http")).strip().lower()
    if protocol not in ("http", "https"):
        raise ValueError("The etcd protocol must be HTTP or HTTPS.")
    if ctx is None:
        from elastic.real.rdzv_context import default_context

        ctx = default_context(params)
    timeout = params.get_as_int("timeout", _DEFAULT_TIMEOUT)
    last_call = params.get_as_int("last_call_timeout", _DEFAULT_LAST_CALL_TIMEOUT)
    assert timeout is not None and last_call is not None
    rdzv = EtcdRendezvous(
        ctx.store,
        str(params.get("etcd_prefix", _DEFAULT_PREFIX)),
        params.run_id,
        params.min_nodes,
        params.max_nodes,
        timeout,
        last_call,
        clock=ctx.clock,
        node_id=ctx.node_id,
        node_addr=ctx.node_addr,
    )
    handler = EtcdRendezvousHandler(rdzv, params.local_addr)
    handler.sync_runner = ctx.sync_runner
    return handler
