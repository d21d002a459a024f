"""The rendezvous API, with torch's names, messages and defaults.

A :class:`RendezvousHandler` is asynchronous at its core (``*_async`` methods, awaited
by the agent on the clock port in either world).  torch's synchronous methods
(``next_rendezvous()``, ``is_closed()``, …) are kept for compatibility: they run the
asynchronous method to completion with the handler's ``sync_runner`` — in real mode
:meth:`elastic.real.loop_thread.LoopThread.run`, passed to ``get_rendezvous_handler``;
without one (and in the simulator, where nothing may block) they raise.

The agent learns of membership changes with :meth:`RendezvousHandler.watch_async`,
which returns when the current round is no longer the one to run (nodes are waiting,
a peer's lease expired, or the rendezvous was closed) — no polling of
``num_nodes_waiting()``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from elastic._records import Frozen, set_fields
from elastic.clock import Clock
from elastic.errors import ElasticError
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
]

T = TypeVar("T")
SyncRunner = Callable[[Coroutine[Any, Any, Any]], Any]


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


class RendezvousInfo:
    """Holds the information about the rendezvous."""

    __slots__ = ("_bootstrap_store_info", "_rank", "_store", "_world_size", "round")

    def __init__(
        self,
        store: Store,
        rank: int,
        world_size: int,
        bootstrap_store_info: RendezvousStoreInfo,
        round: int = 0,
    ) -> None:
        self._store = store
        self._rank = rank
        self._world_size = world_size
        self._bootstrap_store_info = bootstrap_store_info
        self.round = round

    @property
    def store(self) -> Store:
        """Store used by the agents of this round (prefixed by the round)."""
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
    key, else 29500, is used.
    """

    __slots__ = ("clock", "node_addr", "node_id", "port_chooser", "store")
    store: Store
    clock: Clock
    node_addr: str
    node_id: str
    port_chooser: Callable[[], int] | None

    def __init__(
        self,
        store: Store,
        clock: Clock,
        node_addr: str,
        node_id: str,
        port_chooser: Callable[[], int] | None = None,
    ) -> None:
        set_fields(self, "store", store)
        set_fields(self, "clock", clock)
        set_fields(self, "node_addr", node_addr)
        set_fields(self, "node_id", node_id)
        set_fields(self, "port_chooser", port_chooser)


class RendezvousHandler(ABC):
    """Main rendezvous interface."""

    sync_runner: SyncRunner | None = None

    @abstractmethod
    def get_backend(self) -> str:
        """Return the name of the rendezvous backend."""

    @property
    def use_agent_store(self) -> bool:
        """Whether the store of :class:`RendezvousInfo` can be reused by workers."""
        return False

    @abstractmethod
    async def next_rendezvous_async(self) -> RendezvousInfo:
        """Main entry-point into the rendezvous barrier."""

    @abstractmethod
    async def watch_async(self) -> str:
        """Wait until the current round should end; return why.

        Reasons: ``"nodes_waiting"`` (late arrivals want in), ``"peer_lost"`` (a member's
        lease expired), ``"restarted"`` (another member already opened the next round,
        e.g. because its workers failed), ``"closed"``.  Never returns while the round
        stays valid.  Every reason means: call :meth:`next_rendezvous_async` again.
        """

    async def watch_members_async(self) -> str:
        """Wait until a member of the current round is lost or the round ends; return why.

        What the agent awaits beside the rank exchange of a round just formed: unlike
        :meth:`watch_async`, late arrivals (``"nodes_waiting"``) do not end it, so the
        exchange finishes and the round runs first.  A handler that cannot tell them apart
        keeps this default, which is :meth:`watch_async` itself (a late arrival then ends
        the round before it runs).
        """
        return await self.watch_async()

    @abstractmethod
    async def is_closed_async(self) -> bool:
        """Whether the rendezvous has been closed."""

    @abstractmethod
    async def set_closed_async(self) -> None:
        """Mark the rendezvous as closed."""

    @abstractmethod
    async def num_nodes_waiting_async(self) -> int:
        """The number of nodes who arrived late at the rendezvous barrier."""

    @abstractmethod
    def get_run_id(self) -> str:
        """The run id of the rendezvous."""

    async def shutdown_async(self) -> bool:
        """Close all resources that were open for the rendezvous."""
        return True

    # torch's synchronous API --------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.sync_runner is None:
            coro.close()
            raise RuntimeError(
                f"{type(self).__name__}: the synchronous rendezvous API needs a sync_runner "
                "(real mode); in the simulator await the *_async methods instead"
            )
        result: T = self.sync_runner(coro)
        return result

    def next_rendezvous(self) -> RendezvousInfo:
        return self._run(self.next_rendezvous_async())

    def is_closed(self) -> bool:
        return self._run(self.is_closed_async())

    def set_closed(self) -> None:
        self._run(self.set_closed_async())

    def num_nodes_waiting(self) -> int:
        return self._run(self.num_nodes_waiting_async())

    def shutdown(self) -> bool:
        return self._run(self.shutdown_async())


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
