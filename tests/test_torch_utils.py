"""elastic.utils: torch's store helpers, free ports and get_logger, as torch's users call them."""

from __future__ import annotations

import logging
import socket
import sys
import threading
from datetime import timedelta
from typing import Any

import pytest

from elastic.utils import get_env_variable_or_raise, get_socket_with_port, macros
from elastic.utils import store as store_util
from elastic.utils.distributed import get_free_port
from elastic.utils.logging import _derive_module_name, get_logger


class ThreadStore:
    """A torch-style blocking store for threads: waits time out with StoreTimeoutError."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._timeout = timedelta(seconds=30)
        self.log: list[tuple[Any, ...]] = []

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self.log.append(("set_timeout", timeout))
        self._timeout = timeout

    def set(self, key: str, value: Any) -> None:
        self.log.append(("set", key))
        with self._cond:
            self._data[key] = value.encode() if isinstance(value, str) else bytes(value)
            self._cond.notify_all()

    def add(self, key: str, value: int) -> int:
        self.log.append(("add", key))
        with self._cond:
            n = int(self._data.get(key, b"0")) + value
            self._data[key] = str(n).encode()
            self._cond.notify_all()
            return n

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self.log.append(("wait", tuple(keys)))
        limit = (timeout or self._timeout).total_seconds()
        with self._cond:
            if not self._cond.wait_for(lambda: all(k in self._data for k in keys), limit):
                raise store_util.StoreTimeoutError(f"wait for {keys}")

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.wait(keys)
        with self._cond:
            return [self._data[k] for k in keys]


def _in_threads(n: int, fn: Any) -> list[Any]:
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            out[i] = fn(i)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_synchronize_gives_every_rank_all_ranks_data_in_rank_order() -> None:
    store = ThreadStore()
    out = _in_threads(4, lambda i: store_util.synchronize(store, f"d{i}".encode(), i, 4, "p/"))
    assert out == [[b"d0", b"d1", b"d2", b"d3"]] * 4


def test_synchronize_restores_the_stores_timeout_after_the_block() -> None:
    store = ThreadStore()
    store_util.synchronize(store, b"x", 0, 1, "one/", timeout=7)
    assert store.timeout == timedelta(seconds=30)
    assert ("set_timeout", timedelta(seconds=7)) in store.log


def test_barrier_returns_once_all_have_arrived_and_only_the_last_sets_the_flag() -> None:
    store = ThreadStore()
    assert _in_threads(3, lambda i: store_util.barrier(store, 3, "b")) == [None] * 3
    assert [op for op in store.log if op == ("set", "b/last_member")] == [("set", "b/last_member")]


def test_barrier_timeout_names_the_missing_rank_on_rank_0_and_points_others_to_rank_0() -> None:
    store = ThreadStore()

    def member(i: int) -> None:
        store_util.barrier(
            store,
            3,
            "t",
            barrier_timeout=1.0,
            rank=i,
            rank_tracing_decoder=lambda r: f"host-{r}",
            # rank 1 waits for rank 0's verdict up to barrier_timeout: keep rank 0's own
            # wait for the missing rank well inside that
            trace_timeout=0.05,
        )

    errors = _in_threads(2, member)  # rank 2 never comes
    assert all(isinstance(e, store_util.StoreTimeoutError) for e in errors)
    assert "missing_ranks=[host-2]" in str(errors[0])
    assert "check rank 0 (host-0) for missing rank info" in str(errors[1])


def test_barrier_without_rank_re_raises_the_stores_timeout() -> None:
    with pytest.raises(store_util.StoreTimeoutError):
        store_util.barrier(ThreadStore(), 2, "x", barrier_timeout=0.05)


def test_barrier_refuses_a_tracing_decoder_without_a_rank() -> None:
    with pytest.raises(AssertionError, match="requires rank"):
        store_util.barrier(ThreadStore(), 1, "x", rank_tracing_decoder=str)


def test_get_socket_with_port_listens_on_localhost_until_closed() -> None:
    sock = get_socket_with_port()
    try:
        port = sock.getsockname()[1]
        assert port > 0
        with socket.create_connection(("localhost", port), timeout=5):
            pass
    finally:
        sock.close()


def test_get_socket_with_port_skips_an_address_family_the_host_cannot_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = socket.socket
    families: list[int] = []

    def picky(family: int = -1, *args: Any) -> socket.socket:
        families.append(family)
        if len(families) == 1:
            raise OSError("address family not supported")
        return real(socket.AF_INET, *args)

    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda *a, **k: [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0)),
        ],
    )
    monkeypatch.setattr(socket, "socket", picky)
    sock = get_socket_with_port()
    sock.close()
    assert families == [socket.AF_INET6, socket.AF_INET]


def test_get_free_port_returns_a_port_that_can_be_bound() -> None:
    port = get_free_port()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("localhost", port))


def test_get_env_variable_or_raise_names_the_missing_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ELASTIC_T_SET", "v")
    monkeypatch.delenv("ELASTIC_T_UNSET", raising=False)
    assert get_env_variable_or_raise("ELASTIC_T_SET") == "v"
    with pytest.raises(ValueError, match="ELASTIC_T_UNSET"):
        get_env_variable_or_raise("ELASTIC_T_UNSET")


def test_local_rank_macro_is_substituted_in_string_arguments_only() -> None:
    args: list[object] = ["--rank", macros.local_rank, f"/d/{macros.local_rank}.log", 3]
    assert macros.substitute(args, "5") == ["--rank", "5", "/d/5.log", 3]


def test_get_logger_is_named_after_the_calling_module_and_reads_loglevel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOGLEVEL", "DEBUG")
    assert get_logger().name == __name__
    assert get_logger(None).name == __name__
    assert get_logger("a.b").name == "a.b"
    assert get_logger("a.b").level == logging.DEBUG
    assert _derive_module_name(depth=1) == __name__


def test_barrier_timeout_keeps_the_stores_error_type_when_torch_is_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch's DistStoreError is caught too once torch is imported, but a store of ours
    # still gets its own error type back (the full suite imports torch elsewhere)
    import types

    fake_c = types.SimpleNamespace(_DistStoreError=type("_DistStoreError", (RuntimeError,), {}))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=fake_c))
    with pytest.raises(store_util.StoreTimeoutError, match="missing_ranks=\\[1\\]"):
        store_util.barrier(ThreadStore(), 2, "k", barrier_timeout=0.05, rank=0, trace_timeout=0.05)

    class TorchLike(ThreadStore):
        def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
            try:
                super().wait(keys, timeout)
            except store_util.StoreTimeoutError as exc:
                raise fake_c._DistStoreError(str(exc)) from None

    with pytest.raises(fake_c._DistStoreError, match="missing_ranks=\\[1\\]"):
        store_util.barrier(TorchLike(), 2, "k", barrier_timeout=0.05, rank=0, trace_timeout=0.05)
