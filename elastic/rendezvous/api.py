"""The rendezvous API, with torch's names, messages and defaults.

A :class:`RendezvousHandler` has two faces, and a subclass implements either:

* asynchronous (``*_async`` methods), awaited by the agent on the clock port in either
  world — the project's handlers;
* torch's synchronous methods (``next_rendezvous()``, ``is_closed()``, …) — a torch
  user's own handler.

Whichever face a subclass leaves out is derived from the other:

* the synchronous methods of an asynchronous handler run the coroutine to completion
  with the handler's ``sync_runner`` — in real mode
  :meth:`elastic.real.loop_thread.LoopThread.run`, set by ``get_rendezvous_handler``;
  without one they raise ``RuntimeError`` naming what is missing.  The
  :class:`RendezvousInfo` they return carries a :class:`SyncStore` (torch's blocking
  ``Store`` methods) instead of the store port;
* the asynchronous methods of a synchronous handler run the blocking call in a thread,
  through the ``thread_runner`` the agent binds (:meth:`RendezvousHandler.bind_clock`)
  from a clock that can run threads (the real one; the simulator cannot, and refuses
  such a handler in one line).  A synchronous handler has no watch: its
  :meth:`RendezvousHandler.watch_async` asks ``num_nodes_waiting()`` and
  ``is_closed()`` every ``monitor_interval``, as torch's agent does.

The agent learns of membership changes with :meth:`RendezvousHandler.watch_async`,
which returns when the current round is no longer the one to run (nodes are waiting,
a peer's lease expired, or the rendezvous was closed) — no polling of
``num_nodes_waiting()``.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

from elastic._records import Frozen, set_fields
from elastic.clock import Clock
from elastic.errors import ElasticError
from elastic.rendezvous.assignment import AgentAssignment
from elastic.store import Store

__all__ = [
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousContext",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "SyncRunner",
    "SyncStore",
    "ThreadRunner",
    "ThreadedStore",
    "sync_store_of",
    "torch_store",
]

T = TypeVar("T")


def __getattr__(name: str) -> Any:
    """torch keeps the registry in ``api``; ours lives in :mod:`.registry` (it imports us)."""
    if name in (
        "rendezvous_handler_registry",
        "RendezvousHandlerRegistry",
        "RendezvousHandlerCreator",
    ):
        from elastic.rendezvous import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SyncRunner = Callable[[Coroutine[Any, Any, Any]], Any]
#: Runs a blocking call in a worker thread and awaits its result (real mode only).
ThreadRunner = Callable[[Callable[[], Any]], Awaitable[Any]]


def _is_store_port(store: Any) -> bool:
    """Whether ``store`` is the asynchronous store port, not a blocking (torch) ``Store``.

    A port's ``get`` is a coroutine function, or it has the port's own operations
    (``grant_lease`` and ``watch``, which torch's ``Store`` lacks): a port may implement
    its methods as plain functions that return awaitables (the simulator's store client
    does), which ``inspect.iscoroutinefunction`` alone would call blocking.
    """
    if inspect.iscoroutinefunction(getattr(store, "get", None)):
        return True
    return callable(getattr(store, "grant_lease", None)) and callable(getattr(store, "watch", None))


class RendezvousError(ElasticError):
    """Represents the base type for rendezvous errors."""


class RendezvousClosedError(RendezvousError):
    """Raised when a rendezvous is closed."""


class RendezvousTimeoutError(RendezvousError):
    """Raised when a rendezvous did not complete on time."""


class RendezvousConnectionError(RendezvousError):
    """Raised when the connection to a rendezvous backend has failed."""


class RendezvousStateError(RendezvousError):
    """Raised when the state of a rendezvous is corrupt."""


class RendezvousGracefulExitError(RendezvousError):
    """Raised when node wasn't included in rendezvous and gracefully exits.

    Not an error: a node not admitted when the rendezvous closes ends quietly.
    """


@dataclass  # torch's is a plain dataclass: mutable, no slots
class RendezvousStoreInfo:
    """Where workers bootstrap their own process group (MASTER_ADDR / MASTER_PORT)."""

    MASTER_ADDR_KEY: ClassVar[str] = "MASTER_ADDR"
    MASTER_PORT_KEY: ClassVar[str] = "MASTER_PORT"

    master_addr: str
    master_port: int

    @staticmethod
    async def build_async(
        rank: int, store: Store, local_addr: str, server_port: int, timeout: float | None = None
    ) -> RendezvousStoreInfo:
        """Rank 0 publishes its address and port; every rank reads them back."""
        if rank == 0:
            await store.multi_set(
                {
                    RendezvousStoreInfo.MASTER_ADDR_KEY: local_addr.encode(),
                    RendezvousStoreInfo.MASTER_PORT_KEY: str(server_port).encode(),
                }
            )
        addr, port = await store.multi_get(
            [RendezvousStoreInfo.MASTER_ADDR_KEY, RendezvousStoreInfo.MASTER_PORT_KEY], timeout
        )
        return RendezvousStoreInfo(addr.decode(), int(port.decode()))

    @staticmethod
    def build(
        rank: int, store: Any, local_addr: str | None = None, server_port: int | None = None
    ) -> RendezvousStoreInfo:
        """torch's factory, blocking: rank 0 publishes its address and a port; all read them.

        ``store`` is a synchronous store (torch's ``Store`` methods, e.g. the
        :class:`SyncStore` of a :class:`RendezvousInfo` from ``next_rendezvous()``).
        Rank 0 uses ``local_addr`` (default: this host's FQDN) and ``server_port``
        (default: a free TCP port).  In the agent's own loop use :meth:`build_async`.
        """
        if _is_store_port(store):
            raise TypeError(
                "RendezvousStoreInfo.build() needs a synchronous store (torch's Store "
                "methods); for the asynchronous store port use build_async()"
            )
        if rank == 0:
            if local_addr is None or server_port is None:
                # Resolving the host name and finding a free port are real-mode I/O.
                from elastic.launcher.api import fqdn, free_port

                local_addr = local_addr or fqdn()
                server_port = server_port or free_port()
            store.set(RendezvousStoreInfo.MASTER_ADDR_KEY, local_addr.encode())
            store.set(RendezvousStoreInfo.MASTER_PORT_KEY, str(server_port).encode())
        addr = bytes(store.get(RendezvousStoreInfo.MASTER_ADDR_KEY)).decode()
        port = int(bytes(store.get(RendezvousStoreInfo.MASTER_PORT_KEY)).decode())
        return RendezvousStoreInfo(addr, port)


def _as_bytes(value: str | bytes, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, got {type(value).__name__}")


def _seconds(timeout: timedelta | float | None) -> float | None:
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return timeout


class SyncStore:
    """torch's blocking ``Store`` methods over the store port, for callers off the loop.

    Every call runs the port's coroutine with ``runner`` (a
    :meth:`~elastic.real.loop_thread.LoopThread.run`) and blocks until it is done;
    values may be given as ``str`` or ``bytes`` and are returned as ``bytes``.
    ``port`` is the asynchronous store underneath, for code on the loop.  ``timeout``
    bounds ``get``/``wait``/``multi_get`` as a torch store's timeout does (torch's
    default, 300 s; ``TimeoutError`` after it); as on torch's store, ``timeout`` reads
    as a ``timedelta`` and :meth:`set_timeout` changes it (``elastic.utils.store``'s
    barrier does, as torch's).
    """

    __slots__ = ("_run", "_timeout", "port")

    def __init__(self, port: Store, runner: SyncRunner, timeout: float | None = 300.0) -> None:
        self.port = port
        self._run = runner
        self._timeout = timeout

    @property
    def timeout(self) -> timedelta:
        """torch's ``Store.timeout`` (``timedelta.max`` when the store has none)."""
        return timedelta.max if self._timeout is None else timedelta(seconds=self._timeout)

    @timeout.setter
    def timeout(self, timeout: timedelta | float) -> None:
        self.set_timeout(timeout)

    def set_timeout(self, timeout: timedelta | float) -> None:
        """torch's ``Store.set_timeout``: the bound of later waits (seconds or a
        ``timedelta``; assigning ``timeout`` does the same)."""
        seconds = _seconds(timeout)
        self._timeout = None if timeout == timedelta.max or seconds is None else seconds

    @property
    def underlying_store(self) -> Any:
        """torch's ``PrefixStore.underlying_store``, when the port is a prefixed view
        (a round's store is): the store it wraps, as given to the handler."""
        inner = getattr(self.port, "underlying_store", None)
        if inner is None:
            raise AttributeError(f"a store over {type(self.port).__name__} wraps no store")
        return inner

    def set(self, key: str, value: str | bytes) -> None:
        self._run(self.port.set(key, _as_bytes(value, "value")))

    def get(self, key: str) -> bytes:
        value: bytes = self._run(self.port.get(key, self._timeout))
        return value

    def add(self, key: str, value: int) -> int:
        total: int = self._run(self.port.add(key, value))
        return total

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        """torch's semantics: an empty ``expected_value`` matches an absent key."""
        expected = _as_bytes(expected_value, "expected_value")
        desired = _as_bytes(desired_value, "desired_value")

        async def cas() -> bytes:
            current = await self.port.try_get(key)
            if current is None:
                if expected:
                    return expected  # torch returns the expected value when the key is absent
                return await self.port.compare_set(key, None, desired)
            return await self.port.compare_set(key, expected, desired)

        result: bytes = self._run(cas())
        return result

    def wait(self, keys: Sequence[str], timeout: timedelta | float | None = None) -> None:
        seconds = self._timeout if timeout is None else _seconds(timeout)
        self._run(self.port.wait(list(keys), seconds))

    def check(self, keys: Sequence[str]) -> bool:
        async def present() -> bool:
            for key in keys:
                if await self.port.try_get(key) is None:
                    return False
            return True

        ok: bool = self._run(present())
        return ok

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        values: list[bytes] = self._run(self.port.multi_get(list(keys), self._timeout))
        return values

    def multi_set(self, keys: Sequence[str], values: Sequence[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(
                f"multi_set needs as many values as keys (got {len(keys)} keys, "
                f"{len(values)} values)"
            )
        items = {k: _as_bytes(v, "value") for k, v in zip(keys, values, strict=True)}
        self._run(self.port.multi_set(items))

    def delete_key(self, key: str) -> bool:
        existed: bool = self._run(self.port.delete(key))
        return existed

    def num_keys(self) -> int:
        async def count() -> int:
            _, snap = await self.port.snapshot("")
            return len(snap)

        n: int = self._run(count())
        return n


def sync_store_of(store: object) -> SyncStore | None:
    """The :class:`SyncStore` behind ``store`` (itself, or the one a torch-typed store
    from :func:`torch_store` wraps), else ``None``."""
    if isinstance(store, SyncStore):
        return store
    inner = getattr(store, "_elastic_sync_store", None)
    return inner if isinstance(inner, SyncStore) else None


_TORCH_STORE_CLASS: Any = None


def torch_store(store: SyncStore, endpoint: tuple[str, int] | None = None) -> Any:
    """``store`` as a ``torch.distributed.Store`` when the program has imported
    ``torch.distributed`` (else ``store`` itself: no torch import here).

    What torch's blocking API hands out (``next_rendezvous().store``, ``create_backend``'s
    store) is a torch ``Store`` there, and programs pass it to ``init_process_group`` or
    ``PrefixStore``; a :class:`SyncStore` has torch's methods but not its type.  The
    object returned is a subclass of torch's ``Store`` whose methods (the ones torch's
    C++ calls back: ``set``, ``get``, ``add``, ``compare_set``, ``wait``, ``check``,
    ``delete_key``, ``num_keys``, ``multi_get``, ``multi_set``) are the
    :class:`SyncStore`'s; a blocking call waits with the GIL released, so torch's
    threads and the store's loop thread go on.  With ``endpoint`` (``create_backend``'s
    c10d store, where torch returns a ``TCPStore``), ``host`` and ``port`` are its, as a
    ``TCPStore``'s are.
    """
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not hasattr(dist, "Store"):
        return store
    global _TORCH_STORE_CLASS
    if _TORCH_STORE_CLASS is None:
        _TORCH_STORE_CLASS = _make_torch_store_class(dist.Store)
    return _TORCH_STORE_CLASS(store, endpoint)


def _make_torch_store_class(base: Any) -> Any:
    class TorchSyncStore(base):  # type: ignore[misc]
        """A :class:`SyncStore` typed as torch's ``Store`` (see :func:`torch_store`)."""

        def __init__(self, sync: SyncStore, endpoint: tuple[str, int] | None = None) -> None:
            super().__init__()
            self._elastic_sync_store = sync
            self._elastic_endpoint = endpoint

        def __repr__(self) -> str:
            return f"TorchSyncStore({self._elastic_sync_store.port!r})"

        @property
        def host(self) -> str:
            """The rendezvous endpoint's host, as a ``TCPStore``'s ``host``."""
            if self._elastic_endpoint is None:
                raise AttributeError("this store was not opened at an endpoint: no host")
            return self._elastic_endpoint[0]

        @property
        def port(self) -> int:
            """The rendezvous endpoint's port, as a ``TCPStore``'s ``port``."""
            if self._elastic_endpoint is None:
                raise AttributeError("this store was not opened at an endpoint: no port")
            return self._elastic_endpoint[1]

        @property
        def underlying_store(self) -> Any:
            return self._elastic_sync_store.underlying_store

        @property
        def timeout(self) -> timedelta:
            return self._elastic_sync_store.timeout

        @timeout.setter
        def timeout(self, timeout: timedelta | float) -> None:
            self._elastic_sync_store.set_timeout(timeout)

        def set_timeout(self, timeout: timedelta | float) -> None:
            self._elastic_sync_store.set_timeout(timeout)

        def set(self, key: str, value: str | bytes) -> None:
            self._elastic_sync_store.set(key, value)

        def get(self, key: str) -> bytes:
            return self._elastic_sync_store.get(key)

        def add(self, key: str, value: int) -> int:
            return self._elastic_sync_store.add(key, value)

        def compare_set(
            self, key: str, expected_value: str | bytes, desired_value: str | bytes
        ) -> bytes:
            return self._elastic_sync_store.compare_set(key, expected_value, desired_value)

        def wait(self, keys: Sequence[str], timeout: timedelta | float | None = None) -> None:
            self._elastic_sync_store.wait(keys, timeout)

        def check(self, keys: Sequence[str]) -> bool:
            return self._elastic_sync_store.check(keys)

        def multi_get(self, keys: Sequence[str]) -> list[bytes]:
            return self._elastic_sync_store.multi_get(keys)

        def multi_set(self, keys: Sequence[str], values: Sequence[str | bytes]) -> None:
            self._elastic_sync_store.multi_set(keys, values)

        def delete_key(self, key: str) -> bool:
            return self._elastic_sync_store.delete_key(key)

        def num_keys(self) -> int:
            return self._elastic_sync_store.num_keys()

    return TorchSyncStore


class ThreadedStore:
    """The store port over a blocking store with torch's methods, each call in a thread.

    What the agent needs of a synchronous handler's store (``set``, ``get``, ``add``,
    ``compare_set``, ``wait``, ``delete``, ``multi_get``, ``multi_set``, ``try_get``).
    Leases, snapshots and watches are not in torch's ``Store``: they raise
    ``NotImplementedError`` naming the method.
    """

    def __init__(self, store: Any, runner: ThreadRunner) -> None:
        self.store = store
        self._run = runner

    @property
    def underlying_store(self) -> Any:
        """The blocking store this adapter calls (what torch's views report)."""
        return self.store

    async def _call(self, name: str, *args: Any) -> Any:
        method = getattr(self.store, name)
        return await self._run(lambda: method(*args))

    async def set(self, key: str, value: bytes, *, lease: Any = None) -> None:
        if lease is not None:
            raise NotImplementedError("a torch Store has no leases: set(lease=) is not supported")
        await self._call("set", key, value)

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        if timeout is not None:
            await self.wait([key], timeout)
        return bytes(await self._call("get", key))

    async def try_get(self, key: str) -> bytes | None:
        if not await self._call("check", [key]):
            return None
        return bytes(await self._call("get", key))

    async def add(self, key: str, amount: int) -> int:
        return int(await self._call("add", key, amount))

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, *, lease: Any = None
    ) -> bytes:
        if lease is not None:
            raise NotImplementedError(
                "a torch Store has no leases: compare_set(lease=) is not supported"
            )
        return bytes(await self._call("compare_set", key, expected or b"", desired))

    async def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """The port's ``wait``: :class:`TimeoutError` when ``timeout`` passes.  A timeout
        of 0 or less is a look (``check``): c10d takes a zero timeout for "none" in some
        stores (``HashStore`` waits for ever) and for "now" in others (``TCPStore``).
        torch's timeout error (``DistStoreError``) becomes :class:`TimeoutError`."""
        if timeout is not None and timeout <= 0:
            if not await self._call("check", list(keys)):
                raise TimeoutError(f"wait({list(keys)!r}): not all set")
            return
        try:
            if timeout is None:
                await self._call("wait", list(keys))
            else:
                await self._call("wait", list(keys), timedelta(seconds=timeout))
        except RuntimeError as e:
            if type(e).__name__ == "DistStoreError" or "timeout" in str(e).lower():
                raise TimeoutError(f"wait({list(keys)!r}): {e}") from e
            raise

    async def delete(self, key: str) -> bool:
        return bool(await self._call("delete_key", key))

    async def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        await self.wait(keys, timeout)
        return [bytes(v) for v in await self._call("multi_get", list(keys))]

    async def multi_set(self, items: Mapping[str, bytes]) -> None:
        await self._call("multi_set", list(items), list(items.values()))

    async def grant_lease(self, ttl: float) -> Any:
        raise NotImplementedError("a torch Store has no leases: grant_lease() is not supported")

    async def snapshot(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        raise NotImplementedError("a torch Store has no snapshots: snapshot() is not supported")

    async def watch(self, prefix: str, after: int, timeout: float | None = None) -> int:
        raise NotImplementedError("a torch Store has no watches: watch() is not supported")


class RendezvousInfo:
    """Holds the information about the rendezvous.

    ``assignment`` (not torch's; default ``None``): this member's rank block, when the
    handler's round carries it (the dynamic rendezvous, once told the agent's role and
    local world size by :meth:`RendezvousHandler.set_member_info`).  The agent then skips
    torch's rank exchange through the round's store; with ``None`` it runs it.
    """

    __slots__ = ("_bootstrap_store_info", "_rank", "_store", "_world_size", "assignment", "round")

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        bootstrap_store_info: RendezvousStoreInfo,
        round: int = 0,
        assignment: AgentAssignment | None = None,
    ) -> None:
        self._store = store
        self._rank = rank
        self._world_size = world_size
        self._bootstrap_store_info = bootstrap_store_info
        self.round = round
        self.assignment = assignment

    @property
    def store(self) -> Any:
        """Store used by the agents of this round (prefixed by the round).

        The store port (asynchronous) from ``next_rendezvous_async()``; a
        :class:`SyncStore` (torch's blocking methods) from ``next_rendezvous()``.
        """
        return self._store

    @property
    def rank(self) -> int:
        """Rank within a group (the agent's group rank)."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Global group size."""
        return self._world_size

    @property
    def bootstrap_store_info(self) -> RendezvousStoreInfo:
        """Store info the workers bootstrap their process group from."""
        return self._bootstrap_store_info


class RendezvousContext(Frozen):
    """The ports and identity a handler needs (torch reads them from globals; we pass them).

    ``node_id`` must be unique among the job's agents; ``node_addr`` is what rank 0
    publishes as MASTER_ADDR.  ``port_chooser`` gives rank 0 a MASTER_PORT (a free TCP
    port in real mode, any int in the simulator); without it the ``master_port`` config
    key, else 29500, is used.  ``sync_runner`` (real mode) runs a coroutine to completion
    from any thread; handlers built on this context get it for torch's blocking API.
    """

    __slots__ = ("clock", "node_addr", "node_id", "port_chooser", "store", "sync_runner")
    store: Store
    clock: Clock
    node_addr: str
    node_id: str
    port_chooser: Callable[[], int] | None
    sync_runner: SyncRunner | None

    def __init__(
        self,
        store: Store,
        clock: Clock,
        node_addr: str,
        node_id: str,
        port_chooser: Callable[[], int] | None = None,
        sync_runner: SyncRunner | None = None,
    ) -> None:
        set_fields(self, "store", store)
        set_fields(self, "clock", clock)
        set_fields(self, "node_addr", node_addr)
        set_fields(self, "node_id", node_id)
        set_fields(self, "port_chooser", port_chooser)
        set_fields(self, "sync_runner", sync_runner)


_PAIRS = {
    "next_rendezvous": "next_rendezvous_async",
    "is_closed": "is_closed_async",
    "set_closed": "set_closed_async",
    "num_nodes_waiting": "num_nodes_waiting_async",
    "shutdown": "shutdown_async",
}


class RendezvousHandler(ABC):
    """Main rendezvous interface.

    Implement ``get_backend``, ``get_run_id`` and, for each of ``next_rendezvous``,
    ``is_closed``, ``set_closed``, ``num_nodes_waiting`` and ``shutdown``, either torch's
    synchronous method or its ``*_async`` twin (see the module docstring).
    """

    sync_runner: SyncRunner | None = None
    thread_runner: ThreadRunner | None = None
    _watch_clock: Clock | None = None
    _watch_interval: float = 30.0

    @abstractmethod
    def get_backend(self) -> str:
        """Return the name of the rendezvous backend."""

    @property
    def use_agent_store(self) -> bool:
        """Whether the store of :class:`RendezvousInfo` can be reused by workers."""
        return False

    @abstractmethod
    def get_run_id(self) -> str:
        """The run id of the rendezvous."""

    # which face a subclass implements ----------------------------------------------
    @classmethod
    def synchronous_methods(cls) -> list[str]:
        """torch's methods this class implements only synchronously (run in a thread)."""
        return [
            sync
            for sync, coro in _PAIRS.items()
            if getattr(cls, sync) is not getattr(RendezvousHandler, sync)
            and getattr(cls, coro) is getattr(RendezvousHandler, coro)
        ]

    def bind_clock(self, clock: Clock, monitor_interval: float = 30.0) -> None:
        """Let the agent drive a synchronous handler on ``clock`` without blocking it.

        Does nothing for a handler whose every method is asynchronous.  Otherwise the
        clock must offer ``run_in_thread`` (the real one does); the simulator's does not,
        and a synchronous handler is refused there with one line.
        """
        sync = self.synchronous_methods()
        if not sync:
            return
        runner = getattr(clock, "run_in_thread", None)
        if runner is None:
            raise RendezvousError(
                f"{type(self).__name__} implements only torch's synchronous "
                f"{', '.join(m + '()' for m in sync)}, which would block the simulator: "
                f"implement {', '.join(_PAIRS[m] + '()' for m in sync)} to simulate it"
            )
        self.thread_runner = runner
        self._watch_clock = clock
        self._watch_interval = monitor_interval

    async def _in_thread(self, method: str) -> Any:
        fn = getattr(self, method)
        if getattr(type(self), method) is getattr(RendezvousHandler, method):
            raise NotImplementedError(
                f"{type(self).__name__} implements neither {method}() nor {_PAIRS[method]}()"
            )
        if self.thread_runner is None:
            raise RuntimeError(
                f"{type(self).__name__}.{method}() is synchronous: the agent runs it in a "
                "thread once bind_clock() was given a real clock; call it directly instead"
            )
        return await self.thread_runner(fn)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.sync_runner is None:
            coro.close()
            raise RuntimeError(
                f"{type(self).__name__}: the synchronous rendezvous API needs a sync_runner "
                "(real mode); in the simulator await the *_async methods instead"
            )
        result: T = self.sync_runner(coro)
        return result

    def _check_async(self, method: str) -> None:
        if getattr(type(self), method) is getattr(RendezvousHandler, method):
            raise NotImplementedError(
                f"{type(self).__name__} implements neither {_sync_of(method)}() nor {method}()"
            )

    # the asynchronous face ------------------------------------------------------------
    async def next_rendezvous_async(self) -> RendezvousInfo:
        """Main entry-point into the rendezvous barrier.

        For a synchronous handler, the info's store is made the store port: a
        :class:`SyncStore` gives back its port; another blocking store (torch's
        ``Store`` methods) is called in threads (:class:`ThreadedStore`).
        """
        info: RendezvousInfo = await self._in_thread("next_rendezvous")
        store = info.store
        sync = sync_store_of(store)
        if sync is not None:
            store = sync.port
        elif not _is_store_port(store):
            assert self.thread_runner is not None
            store = ThreadedStore(store, self.thread_runner)
        return RendezvousInfo(
            store,
            info.rank,
            info.world_size,
            info.bootstrap_store_info,
            getattr(info, "round", 0),  # torch's own RendezvousInfo has neither
            getattr(info, "assignment", None),
        )

    async def watch_async(self) -> str:
        """Wait until the current round should end; return why.

        Reasons: ``"nodes_waiting"`` (late arrivals want in), ``"peer_lost"`` (a member's
        lease expired), ``"restarted"`` (another member already opened the next round,
        e.g. because its workers failed), ``"closed"``.  Never returns while the round
        stays valid.  Every reason means: call :meth:`next_rendezvous_async` again.

        This default (for a synchronous handler, which has no watch) asks
        ``num_nodes_waiting_async()`` and ``is_closed_async()`` every monitor interval.
        """
        clock = self._watch_clock
        if clock is None:
            raise NotImplementedError(
                f"{type(self).__name__} implements no watch_async(); an asynchronous "
                "handler must (the agent awaits it instead of polling)"
            )
        while True:
            if await self.is_closed_async():
                return "closed"
            if await self.num_nodes_waiting_async() > 0:
                return "nodes_waiting"
            await clock.sleep(self._watch_interval)

    def set_member_info(self, role: str, local_world_size: int) -> None:
        """What the agent will run as a member: its role and local world size.

        Called by the agent before each :meth:`next_rendezvous_async`.  A handler that
        can compute the round's rank assignment (the dynamic rendezvous: its decider
        reads every joiner anyway) publishes them when it joins and returns each member's
        block in :attr:`RendezvousInfo.assignment`; this default ignores them, and the
        agent then exchanges ranks through the round's store as torch does.
        """
        return  # nothing to publish: the agent runs torch's exchange

    async def watch_members_async(self) -> str:
        """Wait until a member of the current round is lost or the round ends; return why.

        What the agent awaits beside the rank exchange of a round just formed: unlike
        :meth:`watch_async`, late arrivals (``"nodes_waiting"``) do not end it, so the
        exchange finishes and the round runs first.  A handler that cannot tell them apart
        keeps this default, which is :meth:`watch_async` itself (a late arrival then ends
        the round before it runs).
        """
        return await self.watch_async()

    async def is_closed_async(self) -> bool:
        """Whether the rendezvous has been closed."""
        closed: bool = await self._in_thread("is_closed")
        return closed

    async def set_closed_async(self) -> None:
        """Mark the rendezvous as closed."""
        await self._in_thread("set_closed")

    async def num_nodes_waiting_async(self) -> int:
        """The number of nodes who arrived late at the rendezvous barrier."""
        n: int = await self._in_thread("num_nodes_waiting")
        return n

    async def shutdown_async(self) -> bool:
        """Close all resources that were open for the rendezvous."""
        if type(self).shutdown is RendezvousHandler.shutdown:
            return True  # nothing to close
        done: bool = await self._in_thread("shutdown")
        return done

    # torch's synchronous face -------------------------------------------------------
    def next_rendezvous(self) -> RendezvousInfo:
        """Main entry-point into the rendezvous barrier (blocking).

        The returned info's ``store`` is a :class:`SyncStore`, typed as torch's ``Store``
        when the program has imported ``torch.distributed`` (:func:`torch_store`).
        """
        self._check_async("next_rendezvous_async")
        info = self._run(self.next_rendezvous_async())
        assert self.sync_runner is not None
        return RendezvousInfo(
            torch_store(SyncStore(info.store, self.sync_runner)),
            info.rank,
            info.world_size,
            info.bootstrap_store_info,
            info.round,
            info.assignment,
        )

    def is_closed(self) -> bool:
        """Check whether the rendezvous has been closed."""
        self._check_async("is_closed_async")
        return self._run(self.is_closed_async())

    def set_closed(self) -> None:
        """Mark the rendezvous as closed."""
        self._check_async("set_closed_async")
        self._run(self.set_closed_async())

    def num_nodes_waiting(self) -> int:
        """Return the number of nodes who arrived late at the rendezvous barrier."""
        self._check_async("num_nodes_waiting_async")
        return self._run(self.num_nodes_waiting_async())

    def shutdown(self) -> bool:
        """Close all resources that were open for the rendezvous."""
        if type(self).shutdown_async is RendezvousHandler.shutdown_async:
            closed = True
        else:
            closed = self._run(self.shutdown_async())
        # a handler the registry built on the real ports hands its store back (the last
        # user of an etcd client closes it), once
        on_shutdown = getattr(self, "__dict__", {}).pop("_on_shutdown", None)
        if on_shutdown is not None:
            on_shutdown()
        return closed


def _sync_of(method: str) -> str:
    return method.removesuffix("_async")


_TRUE = {"1", "true", "t", "yes", "y"}
_FALSE = {"0", "false", "f", "no", "n"}


class RendezvousParameters:
    """Hold the parameters to construct a :class:`RendezvousHandler`."""

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not backend:
            raise ValueError("The rendezvous backend name must be a non-empty string.")
        if min_nodes < 1:
            raise ValueError(
                f"The minimum number of rendezvous nodes ({min_nodes}) must be greater than zero."
            )
        if max_nodes < min_nodes:
            raise ValueError(
                f"The maximum number of rendezvous nodes ({max_nodes}) must be greater than or "
                f"equal to the minimum number of rendezvous nodes ({min_nodes})."
            )
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.config: dict[str, Any] = kwargs
        self.local_addr = local_addr

    def get(self, key: str, default: Any = None) -> Any:
        """Return the value for ``key`` if ``key`` exists, else ``default``."""
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """Return the value for ``key`` as a ``bool``."""
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if value == 1:
                return True
            if value == 0:
                return False
        elif isinstance(value, str):
            if value.lower() in _TRUE:
                return True
            if value.lower() in _FALSE:
                return False
        raise ValueError(
            f"The rendezvous configuration option '{key}' does not represent a valid boolean value."
        )

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        """Return the value for ``key`` as an ``int``."""
        value = self.get(key, default)
        if value is None:
            return value
        try:
            return int(value)
        except ValueError as e:
            raise ValueError(
                f"The rendezvous configuration option '{key}' does not represent a valid "
                "integer value."
            ) from e
