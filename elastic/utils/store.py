"""``barrier``, ``synchronize`` and ``get_all`` over a torch-style synchronous store.

For programs that call torch's ``torch.distributed.elastic.utils.store`` helpers from their
workers with a ``torch.distributed`` store (``TCPStore``, ``HashStore``, a
``PrefixStore``…): anything with ``set``, ``get``, ``add``, ``wait``, ``multi_get``,
``set_timeout`` and a ``timeout`` property.  The store calls and their order are torch's,
so two implementations can meet at one barrier: ``<prefix>/num_members`` is counted up by
``add``, the member that brings it to ``world_size`` sets ``<prefix>/last_member``, and
every member waits for that key.  Keys are never deleted, so a prefix serves once.

A timed-out wait raises the store's own timeout error.  Given a ``rank``, ``barrier``
first finds out who is missing: every member sets ``<prefix><rank>/TRACE``; rank 0 waits
for each other rank's trace key (the first for ``trace_timeout``, the next ones 1 ms, at
most :data:`MAX_TRACE_MISSING_RANKS` missing), opens ``<prefix>/TRACING_GATE`` and names
the missing ranks in its error; the others wait for the gate and name rank 0 as the one
that knows, in an error of the type the store raised.  ``elastic`` does not depend on
torch: a timeout is torch's ``DistStoreError`` when torch is loaded (a torch store's
timeout is one) or :class:`StoreTimeoutError` (raise it from a store of your own).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Protocol

__all__ = ["StoreTimeoutError", "barrier", "get_all", "store_timeout", "synchronize"]

_NUM_MEMBERS = "/num_members"
_LAST_MEMBER_CHECKIN = "/last_member"
_TRACE = "/TRACE"
_TRACING_GATE = "/TRACING_GATE"
#: At most this many missing ranks are named in a barrier's timeout error.
MAX_TRACE_MISSING_RANKS = 16
_IGNORED = "<val_ignored>"


class StoreTimeoutError(TimeoutError):
    """A barrier timed out on a store that is not torch's (torch's raise ``DistStoreError``)."""


class BlockingStore(Protocol):
    """The part of a ``torch.distributed.Store`` these helpers use."""

    @property
    def timeout(self) -> timedelta: ...

    def set_timeout(self, timeout: timedelta, /) -> None: ...

    def set(self, key: str, value: Any, /) -> None: ...

    def add(self, key: str, value: int, /) -> int: ...

    def multi_get(self, keys: list[str], /) -> list[bytes]: ...

    def wait(self, keys: list[str], /, *args: Any) -> None: ...


def _timeout_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a store raises when a wait times out."""
    torch = sys.modules.get("torch")
    dist_error = getattr(getattr(torch, "_C", None), "_DistStoreError", None)
    if isinstance(dist_error, type) and issubclass(dist_error, BaseException):
        return (dist_error, StoreTimeoutError)
    return (StoreTimeoutError,)


@contextmanager
def store_timeout(store: BlockingStore, timeout: float) -> Iterator[None]:
    """Set ``store``'s timeout to ``timeout`` seconds for the block, then restore it.

    As torch, the old timeout is restored only when the block ends normally: after an
    error the store keeps the block's timeout.
    """
    old = store.timeout
    store.set_timeout(timedelta(seconds=timeout))
    yield
    store.set_timeout(old)


def _barrier_nonblocking(store: BlockingStore, world_size: int, key_prefix: str) -> str:
    """Check in at the barrier ``key_prefix``; the key to wait for (set by the last one in)."""
    last_member_key = key_prefix + _LAST_MEMBER_CHECKIN
    if store.add(key_prefix + _NUM_MEMBERS, 1) == world_size:
        store.set(last_member_key, _IGNORED)
    return last_member_key


def get_all(store: BlockingStore, rank: int, prefix: str, world_size: int) -> list[bytes]:
    """The values of ``<prefix>0`` … ``<prefix><world_size - 1>`` (each waited for).

    Every caller then checks in at ``<prefix>/finished``; rank 0 waits until all have, so
    that a rank 0 hosting the store leaves last.
    """
    data = store.multi_get([f"{prefix}{i}" for i in range(world_size)])
    finished = _barrier_nonblocking(store, world_size, f"{prefix}/finished")
    if rank == 0:
        store.wait([finished])
    return data


def synchronize(
    store: BlockingStore,
    data: bytes,
    rank: int,
    world_size: int,
    key_prefix: str,
    timeout: float = 300,
) -> list[bytes]:
    """Publish ``data`` as ``rank``'s and return every rank's, in rank order.

    Each store wait is bounded by ``timeout`` seconds.  The keys stay in the store, so a
    second call with the same ``key_prefix`` would read the first call's data.
    """
    with store_timeout(store, timeout):
        store.set(f"{key_prefix}{rank}", data)
        return get_all(store, rank, key_prefix, world_size)


def _missing_ranks(
    store: BlockingStore,
    world_size: int,
    key_prefix: str,
    rank: int,
    decode: Callable[[int], str],
    trace_timeout: float,
) -> list[str] | None:
    """After a barrier timed out: rank 0's list of missing ranks (decoded); another
    rank's pointer to rank 0; None if that rank could not reach rank 0's gate either."""
    errors = _timeout_errors()
    store.set(f"{key_prefix}{rank}{_TRACE}", _IGNORED)
    if rank != 0:
        try:
            store.wait([f"{key_prefix}{_TRACING_GATE}"])
        except errors:
            return None
        return [f"[<check rank 0 ({decode(0)}) for missing rank info>]"]
    missing: list[str] = []
    for i in range(1, world_size):
        if len(missing) >= MAX_TRACE_MISSING_RANKS:
            break
        # the first absent rank gets the whole trace_timeout; after that every rank
        # that was going to check in has had its chance
        wait = timedelta(seconds=trace_timeout) if not missing else timedelta(milliseconds=1)
        try:
            store.wait([f"{key_prefix}{i}{_TRACE}"], wait)
        except errors:
            missing.append(decode(i))
    store.set(f"{key_prefix}{_TRACING_GATE}", _IGNORED)
    return missing


def barrier(
    store: BlockingStore,
    world_size: int,
    key_prefix: str,
    barrier_timeout: float = 300,
    rank: int | None = None,
    rank_tracing_decoder: Callable[[int], str] | None = None,
    trace_timeout: float = 10,
) -> None:
    """Return once ``world_size`` callers have reached the barrier ``key_prefix``.

    Waits at most ``barrier_timeout`` seconds, then raises the store's timeout error; with
    ``rank`` given, the error names the missing ranks (through ``rank_tracing_decoder``,
    e.g. rank -> host name).  One use per ``key_prefix``.
    """
    if rank is None and rank_tracing_decoder is not None:
        raise AssertionError("Tracing requires rank information")
    with store_timeout(store, barrier_timeout):
        last_member_key = _barrier_nonblocking(store, world_size, key_prefix)
        try:
            store.wait([last_member_key])
        except _timeout_errors() as exc:
            if rank is None:
                raise
            missing = _missing_ranks(
                store,
                world_size,
                key_prefix,
                rank,
                rank_tracing_decoder or str,
                trace_timeout,
            )
            if missing is None:
                raise
            # the store's own error type (torch's DistStoreError for a torch store)
            raise type(exc)(
                f"Timed out waiting on barrier on rank {rank}, for key prefix: {key_prefix} "
                f"(world_size={world_size}, missing_ranks=[{', '.join(missing)}], "
                f"timeout={barrier_timeout})"
            ) from None
