"""torch's module path for the static rendezvous (``backend="static"``)."""

from __future__ import annotations

from typing import Any

from elastic.rendezvous.api import RendezvousParameters
from elastic.rendezvous.static import StaticRendezvous, create_static_handler

__all__ = ["StaticTCPRendezvous", "create_rdzv_handler"]

StaticTCPRendezvous = StaticRendezvous


def create_rdzv_handler(params: RendezvousParameters, ctx: Any = None) -> StaticRendezvous:
    """torch's factory; without ``ctx`` the real ports of
    :func:`elastic.real.rdzv_context.default_context`."""
    if ctx is None:
        from elastic.real.rdzv_context import default_context

        ctx = default_context(params)
    handler = create_static_handler(params, ctx)
    if handler.sync_runner is None:
        handler.sync_runner = ctx.sync_runner
    return handler
