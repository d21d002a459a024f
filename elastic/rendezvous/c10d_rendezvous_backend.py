"""torch's ``c10d_rendezvous_backend``: the rendezvous state as one key of a store.

:class:`C10dRendezvousBackend` keeps torch's key (``torch.rendezvous.<run_id>``) and
encoding (base64 of the state) over this project's store port; the state itself is
:class:`~elastic.rendezvous.backend_store.BackendStore`'s JSON, never a pickle.
"""

from __future__ import annotations

import binascii
from base64 import b64decode, b64encode
from collections.abc import Awaitable
from typing import Any, TypeVar

from elastic.errors import StoreError
from elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousParameters,
    RendezvousStateError,
    SyncRunner,
    SyncStore,
)
from elastic.rendezvous.backend_store import RendezvousBackend, Token
from elastic.store import Store

__all__ = ["DEFAULT_PORT", "C10dRendezvousBackend", "KeyBackend", "create_backend"]

DEFAULT_PORT = 29400
T = TypeVar("T")


class KeyBackend(RendezvousBackend):
    """The rendezvous state as base64 in one key of a store port (torch's c10d and etcd
    backends differ only in the key, the name and the words of a connection error).

    ``store`` is the store port or a :class:`SyncStore` over it; ``sync_runner`` runs the
    store's coroutines for torch's blocking ``get_state``/``set_state`` (taken from a
    :class:`SyncStore` when one is given).  The token is the stored bytes: a
    ``compare_set`` on them is torch's fencing.
    """

    _WHAT = "the store"

    def __init__(
        self,
        store: Store | SyncStore,
        run_id: str,
        key: str,
        *,
        sync_runner: SyncRunner | None = None,
    ) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        if isinstance(store, SyncStore):
            sync_runner = sync_runner or store._run
            store = store.port
        self._store: Store = store
        self._key = key
        self.sync_runner = sync_runner

    async def _call(self, op: Awaitable[T]) -> T:
        try:
            return await op
        except (StoreError, TimeoutError, OSError) as exc:
            raise RendezvousConnectionError(
                f"The connection to {self._WHAT} has failed. See inner exception for details."
            ) from exc

    async def get_state_async(self) -> tuple[bytes, Token] | None:
        """See base class."""
        raw = await self._call(self._store.try_get(self._key))
        return None if raw is None else self._decode_state(raw)

    async def set_state_async(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """See base class."""
        encoded = b64encode(state)
        expected: bytes | None = None
        if token:
            # Shortcut if we know for sure that the token is not valid.
            if not isinstance(token, bytes):
                result = await self.get_state_async()
                return None if result is None else (*result, False)
            expected = token
        raw = await self._call(self._store.compare_set(self._key, expected, encoded))
        if not raw:  # the key is absent: torch's compare_set gives the expected value back
            return None
        new_state, new_token = self._decode_state(raw)
        return new_state, new_token, new_state == state

    def _decode_state(self, raw: bytes) -> tuple[bytes, Token]:
        try:
            return b64decode(raw, validate=True), bytes(raw)
        except binascii.Error as exc:
            raise RendezvousStateError(
                "The state object is corrupt. See inner exception for details."
            ) from exc


class C10dRendezvousBackend(KeyBackend):
    """Represents a C10d-backed rendezvous backend.

    Args:
        store: the store (the store port, or a :class:`SyncStore` over it) to keep the
            state in.
        run_id: the run id of the rendezvous.
        sync_runner: runs the store's coroutines for torch's blocking ``get_state`` /
            ``set_state`` (taken from a :class:`SyncStore` when one is given).
    """

    _WHAT = "the C10d store"

    def __init__(
        self, store: Store | SyncStore, run_id: str, *, sync_runner: SyncRunner | None = None
    ) -> None:
        super().__init__(store, run_id, "torch.rendezvous." + run_id, sync_runner=sync_runner)

    @property
    def name(self) -> str:
        """See base class."""
        return "c10d"


def create_backend(params: RendezvousParameters) -> tuple[C10dRendezvousBackend, Any]:
    """Create a new :class:`C10dRendezvousBackend` from the specified parameters.

    torch's parameters: ``store_type`` (``"tcp"``, the default; ``"file"`` is refused:
    this project has no file store), ``read_timeout`` (seconds, positive; default 60),
    ``is_host`` (bool or absent).  The store comes from
    :func:`elastic.real.rdzv_context.default_context` (real mode); it is returned as a
    :class:`SyncStore` (torch's blocking methods), as torch returns its ``Store``.
    """
    store_type = str(params.get("store_type", "tcp")).strip().lower()
    if store_type == "file":
        raise ValueError(
            "The C10d store type 'file' is not supported by elastic (it has no file store); "
            "use store_type=tcp."
        )
    if store_type != "tcp":
        raise ValueError("Invalid store type given. Currently only supports file and tcp.")
    read_timeout = params.get_as_int("read_timeout", 60)
    if read_timeout is None or read_timeout <= 0:
        raise ValueError("The read timeout must be a positive integer.")
    params.get_as_bool("is_host")  # validated as torch does; the context decides who hosts

    from elastic.real.rdzv_context import default_context

    ctx = default_context(params)
    assert ctx.sync_runner is not None
    store = SyncStore(ctx.store, ctx.sync_runner, timeout=float(read_timeout))
    return C10dRendezvousBackend(store, params.run_id), store
