"""torch's ``c10d_rendezvous_backend``: the rendezvous state as one key of a store.

:class:`C10dRendezvousBackend` keeps torch's key (``torch.rendezvous.<run_id>``) and
encoding (base64 of the state) over this project's store port; the state itself is
:class:`~elastic.rendezvous.backend_store.BackendStore`'s JSON, never a pickle.
"""

from __future__ import annotations

import binascii
import copy
import os
import sys
import tempfile
from base64 import b64decode, b64encode
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any, TypeVar, cast

from elastic.errors import StoreError
from elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousContext,
    RendezvousError,
    RendezvousParameters,
    RendezvousStateError,
    SyncRunner,
    SyncStore,
    _is_store_port,
    sync_store_of,
    torch_store,
)
from elastic.rendezvous.backend_store import RendezvousBackend, Token
from elastic.store import Store

__all__ = ["DEFAULT_PORT", "C10dRendezvousBackend", "KeyBackend", "create_backend"]

DEFAULT_PORT = 29400
T = TypeVar("T")

# torch's value of a state key that holds no state yet (base64 of "canimadam"): on a
# blocking store, whose ``get`` waits for an absent key, the key is created holding it
_NULL_SENTINEL = "Y2FuaW1hZGFt"


class KeyBackend(RendezvousBackend):
    """The rendezvous state as base64 in one key of a store port (torch's c10d and etcd
    backends differ only in the key, the name and the words of a connection error).

    ``store`` is the store port or a :class:`SyncStore` over it; ``sync_runner`` runs the
    store's coroutines for torch's blocking ``get_state``/``set_state`` (taken from a
    :class:`SyncStore` when one is given).  The token is the stored bytes: a
    ``compare_set`` on them is torch's fencing.

    ``store`` may also be a blocking store with torch's methods (``torch.distributed``'s
    ``TCPStore``, ``FileStore``, ``HashStore``, or any object with ``get`` and
    ``compare_set``): then the backend is torch's, call for call — the key is created
    holding torch's null sentinel, ``get_state``/``set_state`` call the store directly
    (the ``*_async`` methods too: they block, as a synchronous backend's do), and the
    store's ``ValueError``/``RuntimeError``/``TimeoutError`` become
    :class:`RendezvousConnectionError`.
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
        self._blocking: Any = None
        sync = sync_store_of(store)
        if sync is not None:
            sync_runner = sync_runner or sync._run
            store = sync.port
        elif not _is_store_port(store):
            self._blocking = store
        self._store: Store = cast(Store, store)  # a SyncStore was replaced by its port
        self._key = key
        self.sync_runner = sync_runner
        if self._blocking is not None:
            self._call_blocking("compare_set", key, "", _NULL_SENTINEL)

    def _call_blocking(self, op: str, *args: Any) -> Any:
        try:
            return getattr(self._blocking, op)(*args)
        except (ValueError, RuntimeError, TimeoutError) as exc:
            raise RendezvousConnectionError(
                f"The connection to {self._WHAT} has failed. See inner exception for details."
            ) from exc

    def get_state(self) -> tuple[bytes, Token] | None:
        """See base class."""
        if self._blocking is None:
            return super().get_state()
        return self._decode_state(bytes(self._call_blocking("get", self._key)))

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """See base class."""
        if self._blocking is None:
            return super().set_state(state, token)
        if token:
            if not isinstance(token, bytes):  # certainly not the current one
                result = self.get_state()
                return None if result is None else (*result, False)
            expected = token.decode()
        else:
            expected = _NULL_SENTINEL
        raw = self._call_blocking("compare_set", self._key, expected, b64encode(state).decode())
        decoded = self._decode_state(bytes(raw))
        if decoded is None:
            return None
        new_state, new_token = decoded
        return new_state, new_token, new_state == state

    async def _call(self, op: Awaitable[T]) -> T:
        try:
            return await op
        except (StoreError, TimeoutError, OSError) as exc:
            raise RendezvousConnectionError(
                f"The connection to {self._WHAT} has failed. See inner exception for details."
            ) from exc

    async def get_state_async(self) -> tuple[bytes, Token] | None:
        """See base class."""
        if self._blocking is not None:
            return self.get_state()
        raw = await self._call(self._store.try_get(self._key))
        return None if raw is None else self._decode_state(raw)

    async def set_state_async(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """See base class."""
        if self._blocking is not None:
            return self.set_state(state, token)
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
        decoded = self._decode_state(raw)
        if decoded is None:
            return None
        new_state, new_token = decoded
        return new_state, new_token, new_state == state

    def _decode_state(self, raw: bytes) -> tuple[bytes, Token] | None:
        if raw == _NULL_SENTINEL.encode():
            return None  # torch's empty key (a torch agent's, or a blocking store's)
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

    torch's parameters: ``store_type`` (``"tcp"``, the default, or ``"file"``),
    ``read_timeout`` (seconds, positive; default 60), ``is_host`` (bool or absent).

    ``tcp``: the store comes from :func:`elastic.real.rdzv_context.default_context`
    (real mode); it is returned as a :class:`SyncStore` (torch's blocking methods), as
    torch returns its ``Store``.  Except where a torch ``TCPStore`` already serves the
    endpoint and this node was not told to host (a program using ``torch.distributed``):
    then the store is torch's own ``TCPStore`` client, as torch's is.

    ``file``: torch's own ``FileStore`` at the endpoint's path (a new temporary file when
    the endpoint is empty), returned as it is, as torch does; it needs torch installed.

    torch's errors: a temporary file that cannot be made raises :class:`RendezvousError`,
    a ``FileStore`` that cannot be opened :class:`RendezvousConnectionError`.
    """
    store_type = str(params.get("store_type", "tcp")).strip().lower()
    if store_type == "file":
        file_store = _create_file_store(params)
        return C10dRendezvousBackend(file_store, params.run_id), file_store
    if store_type != "tcp":
        raise ValueError("Invalid store type given. Currently only supports file and tcp.")
    read_timeout = params.get_as_int("read_timeout", 60)
    if read_timeout is None or read_timeout <= 0:
        raise ValueError("The read timeout must be a positive integer.")
    is_host = params.get_as_bool("is_host")  # validated as torch does

    if params.backend != "c10d":  # the c10d store whatever the handler is named (torch's)
        params = copy.copy(params)
        params.backend = "c10d"
    if params.endpoint:
        # an endpoint without a port gets this module's DEFAULT_PORT, read now (torch's)
        from elastic.rendezvous.utils import parse_rendezvous_endpoint

        host, port = parse_rendezvous_endpoint(params.endpoint, default_port=DEFAULT_PORT)
        tcp_store = _torch_tcp_store_at(host, port, is_host, read_timeout)
        if tcp_store is not None:
            return C10dRendezvousBackend(tcp_store, params.run_id), tcp_store
        params = copy.copy(params)
        params.endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        endpoint: tuple[str, int] | None = (host, port)
    else:
        endpoint = None
    ctx = real_context(params, "the C10d store")
    assert ctx.sync_runner is not None
    store = SyncStore(ctx.store, ctx.sync_runner, timeout=float(read_timeout))
    return C10dRendezvousBackend(store, params.run_id), torch_store(store, endpoint)


def _torch_tcp_store_at(host: str, port: int, is_host: bool | None, read_timeout: int) -> Any:
    """torch's own ``TCPStore`` client, when the program uses ``torch.distributed``, was not
    told to host (``is_host`` false or absent) and a torch ``TCPStore`` already serves the
    endpoint (torch's ``create_backend`` then connects to it as a client); else ``None``.

    The rendezvous then runs over that blocking store as over any torch ``Store`` (no
    leases: torch's keep-alives in the state).  No torch import here: a program that
    never imported ``torch.distributed`` gets the project's store."""
    dist = sys.modules.get("torch.distributed")
    if is_host or dist is None or not hasattr(dist, "TCPStore"):
        return None
    from elastic.real.torch_probe import answers_torch_ping, who_listens

    # ours first (a second at most: a torch server stays silent to it), then torch's, and
    # only where a program took the connection
    if who_listens(host, port, min(float(read_timeout), 1.0)) != "other":
        return None
    if not answers_torch_ping(host, port, min(float(read_timeout), 10.0)):
        return None
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=read_timeout))
    except (RuntimeError, ValueError, TimeoutError) as exc:
        raise RendezvousConnectionError(
            "The connection to the C10d store has failed. See inner exception for details."
        ) from exc


def real_context(params: RendezvousParameters, what: str) -> RendezvousContext:
    """Real mode's context for ``params``; a store that cannot be reached raises torch's
    words (naming ``what``) with ours as the inner exception."""
    from elastic.real.rdzv_context import default_context

    try:
        return default_context(params)
    except RendezvousConnectionError as exc:
        raise RendezvousConnectionError(
            f"The connection to {what} has failed. See inner exception for details."
        ) from exc


def _create_file_store(params: RendezvousParameters) -> Any:
    try:
        file_store_class = globals().get("FileStore") or __getattr__("FileStore")
    except ImportError as exc:
        raise ValueError(
            f"store_type=file (rendezvous endpoint {params.endpoint!r}) needs torch's "
            "FileStore and torch is not installed; install torch or use store_type=tcp."
        ) from exc
    path = params.endpoint
    if not path:
        try:
            fd, path = tempfile.mkstemp()
            os.close(fd)
        except OSError as exc:
            raise RendezvousError(
                "The file creation for C10d store has failed. See inner exception for details."
            ) from exc
    try:
        return file_store_class(path)
    except (ValueError, RuntimeError) as exc:
        raise RendezvousConnectionError(
            "The connection to the C10d store has failed. See inner exception for details."
        ) from exc


def __getattr__(name: str) -> Any:
    # torch's FileStore as a name of this module (torch's tests patch it here), imported
    # only when asked for: torch is optional
    if name == "FileStore":
        from torch.distributed import FileStore

        return FileStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
