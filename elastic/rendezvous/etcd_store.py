"""torch's ``EtcdStore``: the synchronous c10d ``Store`` methods over etcd, v3 API.

torch's class (``torch.distributed.elastic.rendezvous.etcd_store``) speaks etcd's v2 API
through python-etcd and base64-encodes keys and values (v2 keys are path strings); etcd
3.4 disables v2 by default and 3.6 removed it (pytorch#158326).  This one speaks v3
through an :class:`~elastic.real.etcdstore.EtcdStoreClient`, so keys and values are
stored as they are (UTF-8 for ``str``): the data is not readable by torch's class.

Semantics kept from torch and c10d:

* ``get`` and ``wait`` wait up to ``timeout`` (default 300 s, c10d's) and then raise
  ``LookupError``, as torch's EtcdStore does; ``check`` does not wait;
* ``add`` treats an absent key as 0 and stores decimal text;
* ``compare_set(key, expected, desired)`` follows TCPStore: ``expected == b""`` matches an
  absent key; an absent key with another ``expected`` is left alone and ``expected`` is
  returned; otherwise the value after the operation is returned.

The waits are etcd watches (torch: a v2 long-poll of the whole directory per wake-up).
Every call runs on :func:`~elastic.real.etcdstore.shared_loop` and blocks the caller.

Example::

    server = EtcdServer(); server.start()
    store = EtcdStore(server.get_client(), "/torch/elastic/store")
    store.set("k", b"v"); store.get("k")        # b"v"
"""

from __future__ import annotations

import datetime
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from elastic.real.etcdstore import EtcdStoreClient, cas_delay, shared_loop

__all__ = ["EtcdStore", "cas_delay"]

T = TypeVar("T")
DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)  # c10d's kDefaultTimeout


def _key(key: str | bytes) -> str:
    if isinstance(key, bytes):
        return key.decode()
    if isinstance(key, str):
        return key
    raise ValueError("Value must be of type str or bytes")


def _value(value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise ValueError("Value must be of type str or bytes")


class EtcdStore:
    """torch's ``EtcdStore(etcd_client, etcd_store_prefix, timeout=None)`` over etcd v3."""

    def __init__(
        self,
        etcd_client: EtcdStoreClient,
        etcd_store_prefix: str,
        timeout: datetime.timedelta | None = None,
    ) -> None:
        self.client = etcd_client
        self.prefix = (
            etcd_store_prefix if etcd_store_prefix.endswith("/") else etcd_store_prefix + "/"
        )
        self._timeout = timeout if timeout is not None else DEFAULT_TIMEOUT

    # -- plumbing ---------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return shared_loop().run(coro)

    def _k(self, key: str | bytes) -> str:
        return self.prefix + _key(key)

    @property
    def timeout(self) -> datetime.timedelta:
        return self._timeout

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout

    # -- c10d Store -------------------------------------------------------------------
    def set(self, key: str | bytes, value: str | bytes) -> None:
        """Write ``value`` at ``key``."""
        self._run(self.client.set(self._k(key), _value(value)))

    def get(self, key: str | bytes) -> bytes:
        """The value at ``key``, waiting up to ``timeout``; ``LookupError`` after."""
        try:
            return self._run(self.client.get(self._k(key), self._timeout.total_seconds()))
        except TimeoutError:
            raise LookupError(f"Key {_key(key)} not found in EtcdStore") from None

    def add(self, key: str | bytes, num: int) -> int:
        """Atomically add ``num`` to the integer at ``key`` (absent: 0); the new value."""
        return self._run(self.client.add(self._k(key), int(num)))

    def compare_set(
        self, key: str | bytes, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        """TCPStore's compare-and-set (see the module docstring)."""
        k, expected, desired = self._k(key), _value(expected_value), _value(desired_value)

        async def op() -> bytes:
            if expected == b"":
                got = await self.client.compare_set(k, None, desired)
                if got == desired or got != b"":
                    return got
            got = await self.client.compare_set(k, expected, desired)
            if got == b"" and await self.client.try_get(k) is None:
                return expected  # c10d: an absent key with a non-empty expected value
            return got

        return self._run(op())

    def wait(
        self, keys: Sequence[str | bytes], override_timeout: datetime.timedelta | None = None
    ) -> None:
        """Wait until every key exists; ``LookupError`` after the timeout."""
        timeout = override_timeout if override_timeout is not None else self._timeout
        try:
            self._run(self.client.wait([self._k(k) for k in keys], timeout.total_seconds()))
        except TimeoutError:
            raise LookupError("Timeout while waiting for keys in EtcdStore") from None

    def check(self, keys: Sequence[str | bytes]) -> bool:
        """True if every key exists now (no wait)."""

        async def op() -> bool:
            return all([await self.client.try_get(self._k(k)) is not None for k in keys])

        return self._run(op())

    def multi_get(self, keys: Sequence[str | bytes]) -> list[bytes]:
        try:
            return self._run(
                self.client.multi_get([self._k(k) for k in keys], self._timeout.total_seconds())
            )
        except TimeoutError:
            raise LookupError("Timeout while waiting for keys in EtcdStore") from None

    def multi_set(self, keys: Sequence[str | bytes], values: Sequence[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")
        self._run(
            self.client.multi_set(
                {self._k(k): _value(v) for k, v in zip(keys, values, strict=True)}
            )
        )

    def append(self, key: str | bytes, value: str | bytes) -> None:
        """Append ``value`` to the bytes at ``key`` (absent: create it), atomically."""
        k, tail = self._k(key), _value(value)

        async def op() -> None:
            cur = await self.client.try_get(k)
            while True:
                new = (cur or b"") + tail
                got = await self.client.compare_set(k, cur, new)
                if got == new:
                    return
                cur = await self.client.try_get(k)

        self._run(op())

    def delete_key(self, key: str | bytes) -> bool:
        return self._run(self.client.delete(self._k(key)))

    def num_keys(self) -> int:
        """How many keys are under this store's prefix."""

        async def op() -> int:
            _, snap = await self.client.snapshot(self.prefix)
            return len(snap)

        return self._run(op())

    def has_extended_api(self) -> bool:
        return True
