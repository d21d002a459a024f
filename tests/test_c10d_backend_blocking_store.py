"""The c10d backend over a blocking store with torch's methods, and create_backend's
connection errors, as torch's ``c10d_rendezvous_backend`` behaves."""

from __future__ import annotations

import asyncio
import threading
from base64 import b64encode

import pytest

from elastic.rendezvous import RendezvousConnectionError, RendezvousParameters
from elastic.rendezvous.api import RendezvousStateError
from elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend, create_backend
from elastic.rendezvous.etcd_rendezvous_backend import create_backend as etcd_create_backend
from elastic.utils.distributed import get_free_port

KEY = "torch.rendezvous.run"


class BlockingStore:
    """torch's Store semantics for what the backend calls: ``get`` of an absent key waits
    (here: fails at once, as a timed-out wait would), ``compare_set`` sets the key when it
    holds ``expected`` (absent counts as ``""``) and returns what the key holds after."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.calls: list[str] = []
        self.fail: Exception | None = None
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes:
        self.calls.append("get")
        if self.fail is not None:
            raise self.fail
        if key not in self.data:
            raise TimeoutError(f"wait timeout for {key}")
        return self.data[key]

    def set(self, key: str, value: str | bytes) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self.calls.append("compare_set")
        if self.fail is not None:
            raise self.fail
        with self._lock:
            current = self.data.get(key, b"")
            if current == expected.encode():
                self.data[key] = desired.encode()
            elif key not in self.data:
                return expected.encode()
            return self.data[key]


def test_a_new_backend_reads_no_state_and_writes_the_first() -> None:
    store = BlockingStore()
    backend = C10dRendezvousBackend(store, "run")
    assert backend.get_state() is None
    state, token, ok = backend.set_state(b"s1") or (None, None, None)
    assert (state, ok) == (b"s1", True)
    assert store.data[KEY] == b64encode(b"s1")
    assert backend.get_state() == (b"s1", token)


def test_a_write_with_an_old_or_foreign_token_returns_the_current_state() -> None:
    store = BlockingStore()
    backend = C10dRendezvousBackend(store, "run")
    _, token1, _ = backend.set_state(b"s1") or (None, b"", None)
    _, token2, ok2 = backend.set_state(b"s2", token1) or (None, None, None)
    assert ok2 is True
    assert backend.set_state(b"s3", token1) == (b"s2", token2, False)  # stale token
    assert backend.set_state(b"s3", "not bytes") == (b"s2", token2, False)
    assert backend.set_state(b"s3") == (b"s2", token2, False)  # no token: the key exists


def test_a_second_backend_on_the_same_store_keeps_the_state() -> None:
    store = BlockingStore()
    C10dRendezvousBackend(store, "run").set_state(b"kept")
    other = C10dRendezvousBackend(store, "run")
    assert (other.get_state() or (None,))[0] == b"kept"


def test_corrupt_state_and_store_failures_are_torchs_errors() -> None:
    store = BlockingStore()
    backend = C10dRendezvousBackend(store, "run")
    store.set(KEY, "non_base64")
    with pytest.raises(RendezvousStateError, match=r"^The state object is corrupt"):
        backend.get_state()
    store.fail = RuntimeError("connection reset")
    with pytest.raises(
        RendezvousConnectionError,
        match=r"^The connection to the C10d store has failed\. See inner exception for details\.$",
    ) as info:
        backend.get_state()
    assert isinstance(info.value.__cause__, RuntimeError)


def test_the_async_methods_on_a_blocking_store_give_the_same_answers() -> None:
    backend = C10dRendezvousBackend(BlockingStore(), "run")
    assert asyncio.run(backend.get_state_async()) is None
    result = asyncio.run(backend.set_state_async(b"a"))
    assert result is not None and result[0] == b"a" and result[2] is True


def _params(endpoint: str, **config: str) -> RendezvousParameters:
    return RendezvousParameters(
        backend="mine", endpoint=endpoint, run_id="r", min_nodes=1, max_nodes=1, **config
    )


@pytest.mark.timeout(60)
def test_is_host_false_connects_even_for_one_node_and_fails_in_torchs_words() -> None:
    params = _params(f"localhost:{get_free_port()}", is_host="false", read_timeout="1")
    with pytest.raises(
        RendezvousConnectionError,
        match=r"^The connection to the C10d store has failed\. See inner exception for details\.$",
    ) as info:
        create_backend(params)
    assert "cannot be reached" in str(info.value.__cause__)


@pytest.mark.timeout(60)
def test_an_endpoint_that_names_no_host_is_a_connection_error() -> None:
    for is_host in ("true", "false"):
        with pytest.raises(RendezvousConnectionError, match=r"^The connection to the C10d"):
            create_backend(_params("no-such-host.invalid:29400", is_host=is_host))


@pytest.mark.timeout(60)
def test_create_backend_under_any_handler_name_gives_a_working_c10d_store() -> None:
    backend, store = create_backend(_params(f"localhost:{get_free_port()}"))
    assert backend.name == "c10d"
    backend.set_state(b"dummy_state")
    assert store.get("torch.rendezvous.r") == b64encode(b"dummy_state")


@pytest.mark.timeout(60)
def test_an_unreachable_etcd_fails_in_torchs_words_with_ours_inside() -> None:
    params = RendezvousParameters(
        backend="etcd-v2",
        endpoint=f"localhost:{get_free_port()}",
        run_id="r",
        min_nodes=1,
        max_nodes=1,
        read_timeout="1",
    )
    with pytest.raises(
        RendezvousConnectionError,
        match=r"^The connection to etcd has failed\. See inner exception for details\.$",
    ) as info:
        etcd_create_backend(params)
    assert "cannot be reached" in str(info.value.__cause__)
