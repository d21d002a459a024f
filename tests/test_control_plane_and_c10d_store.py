"""torch's ``control_plane.worker_main`` and ``utils.distributed.create_c10d_store`` at
elastic's paths: real torch where it is installed, fakes for what a host cannot show
(a port taken on the first tries, a barrier that times out, no torch)."""

from __future__ import annotations

import http.client
import logging
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

import elastic.control_plane as control_plane
import elastic.utils.distributed as distributed
from elastic.control_plane import TORCH_WORKER_SERVER_SOCKET, worker_main
from elastic.utils.distributed import create_c10d_store, get_free_port, get_socket_with_port

# --- the worker server -----------------------------------------------------------------


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(self._path)
        self.sock = sock


def _post(path: str, url: str) -> tuple[int, bytes]:
    conn = _UnixHTTPConnection(path)
    try:
        conn.request("POST", url)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _refuses(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return True
    return False


def test_worker_main_has_torchs_public_names() -> None:
    assert control_plane.__all__ == ["worker_main"]
    assert TORCH_WORKER_SERVER_SOCKET == "TORCH_WORKER_SERVER_SOCKET"


@pytest.mark.timeout(60)
def test_worker_main_serves_torchs_handlers_on_the_socket_and_stops_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch.distributed")
    path = str(tmp_path / "worker.sock")
    monkeypatch.setenv(TORCH_WORKER_SERVER_SOCKET, path)
    with worker_main():
        assert _post(path, "/handler/ping") == (200, b"pong")
        status, body = _post(path, "/handler/no_such_handler")
        assert status == 404 and b"no_such_handler" in body
    assert _refuses(path)


@pytest.mark.timeout(60)
def test_worker_main_as_a_decorator_shuts_the_server_down_when_main_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch.distributed")
    path = str(tmp_path / "worker.sock")
    monkeypatch.setenv(TORCH_WORKER_SERVER_SOCKET, path)
    seen: list[tuple[int, bytes]] = []

    @worker_main()
    def main() -> None:
        seen.append(_post(path, "/handler/ping"))
        raise ValueError("main failed")

    with pytest.raises(ValueError, match="main failed"):
        main()
    assert seen == [(200, b"pong")]
    assert _refuses(path)


@pytest.mark.timeout(60)
def test_worker_main_without_the_variable_does_nothing_and_imports_no_torch() -> None:
    code = (
        "import os, sys\n"
        "os.environ.pop('TORCH_WORKER_SERVER_SOCKET', None)\n"
        "from elastic.control_plane import worker_main\n"
        "@worker_main()\n"
        "def main():\n"
        "    return 7\n"
        "print(main(), 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["7", "False"]


def test_worker_main_with_the_variable_but_no_torch_says_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TORCH_WORKER_SERVER_SOCKET, str(tmp_path / "s"))
    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", None)
    with pytest.raises(ImportError, match="install torch"), worker_main():
        pass


# --- create_c10d_store with torch ----------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_lone_server_on_port_minus_one_gets_a_free_port_and_works() -> None:
    pytest.importorskip("torch.distributed")
    store = create_c10d_store(is_server=True, server_addr="localhost", timeout=10)
    assert store.port > 0
    store.set("k", b"v")
    assert store.get("k") == b"v"


def test_several_members_need_a_port_given() -> None:
    pytest.importorskip("torch.distributed")
    with pytest.raises(ValueError, match="server_port must be specified when world_size > 1"):
        create_c10d_store(is_server=True, server_addr="localhost", world_size=2)


@pytest.mark.timeout(60)
def test_a_server_and_two_clients_meet_and_share_keys() -> None:
    pytest.importorskip("torch.distributed")
    port = get_free_port()
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            store = create_c10d_store(False, "localhost", port, world_size=3, timeout=20)
            store.set(f"client/{i}", str(i).encode())
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    server = create_c10d_store(True, "localhost", port, world_size=3, timeout=20)
    for t in threads:
        t.join(30)
    assert errors == []
    assert server.get("client/0") == b"0" and server.get("client/1") == b"1"


@pytest.mark.timeout(60)
def test_a_server_waiting_in_vain_for_clients_times_out_as_both_torch_and_python_say() -> None:
    torch_dist = pytest.importorskip("torch.distributed")
    port = get_free_port()
    with pytest.raises(TimeoutError) as info:
        create_c10d_store(True, "localhost", port, world_size=2, timeout=1)
    assert isinstance(info.value, torch_dist.DistStoreError)  # torch 2.13's type


@pytest.mark.timeout(60)
def test_a_client_without_a_server_times_out() -> None:
    pytest.importorskip("torch.distributed")
    with get_socket_with_port() as sock:
        port = sock.getsockname()[1]
    with pytest.raises(TimeoutError) as info:
        create_c10d_store(False, "localhost", port, world_size=2, timeout=1)
    assert isinstance(info.value, RuntimeError)


@pytest.mark.timeout(60)
def test_a_client_to_a_socket_that_never_answers_keeps_to_its_timeout() -> None:
    # torch 2.13's own client waits for ever here (its timeout does not cover it)
    pytest.importorskip("torch.distributed")
    sock = get_socket_with_port()  # listening, never accepting: not a TCPStore
    port = sock.getsockname()[1]
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=f"no TCPStore answered at localhost:{port}"):
            create_c10d_store(False, "localhost", port, timeout=1)
        assert time.monotonic() - t0 < 20  # 2 x 1 s + 5 s, and a loaded machine
    finally:
        sock.close()
    # the client's thread ends once the other side closes: nothing is left behind
    deadline = time.monotonic() + 20
    while any(t.name.startswith("tcpstore-client") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the client's thread outlived the socket"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_a_server_on_a_taken_port_says_so_as_an_os_error_and_torchs_error() -> None:
    torch_dist = pytest.importorskip("torch.distributed")
    first = create_c10d_store(True, "localhost", server_port=0, timeout=5)
    with pytest.raises(OSError, match=f"port: {first.port} already in use") as info:
        create_c10d_store(True, "localhost", server_port=first.port, timeout=5)
    assert isinstance(info.value, torch_dist.DistNetworkError)


# --- create_c10d_store's decisions, with a fake torch ---------------------------------------


class _FakeStore:
    def __init__(self, fails: list[BaseException], calls: list[dict[str, Any]], **kw: Any) -> None:
        calls.append(kw)
        if fails:
            raise fails.pop(0)
        self.port = kw["port"]
        self.timeout = kw["timeout"]

    def set_timeout(self, timeout: Any) -> None:
        self.timeout = timeout

    def add(self, key: str, n: int) -> int:
        return n

    def set(self, key: str, value: Any) -> None:
        pass

    def wait(self, keys: list[str], *args: Any) -> None:
        raise RuntimeError("Socket Timeout")


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> tuple[list[BaseException], list[dict[str, Any]]]:
    """A torch whose TCPStore raises the queued errors first, then is made."""
    fails: list[BaseException] = []
    calls: list[dict[str, Any]] = []
    dist = types.ModuleType("torch.distributed")
    dist.TCPStore = lambda **kw: _FakeStore(fails, calls, **kw)  # type: ignore[attr-defined]
    torch = types.ModuleType("torch")
    torch.distributed = dist  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    return fails, calls


def _in_use() -> RuntimeError:
    return RuntimeError("The server socket has failed to listen ... name: EADDRINUSE")


def test_a_random_port_taken_is_retried_on_another_up_to_retries_attempts(
    fake_torch: tuple[list[BaseException], list[dict[str, Any]]],
) -> None:
    fails, calls = fake_torch
    fails += [_in_use(), _in_use()]
    create_c10d_store(True, "localhost", wait_for_workers=False, retries=3)
    assert len(calls) == 3
    fails += [_in_use(), _in_use()]
    calls.clear()
    with pytest.raises(OSError, match="already in use"):
        create_c10d_store(True, "localhost", wait_for_workers=False, retries=2)
    assert len(calls) == 2


def test_a_port_given_and_taken_is_not_retried(
    fake_torch: tuple[list[BaseException], list[dict[str, Any]]],
) -> None:
    fails, calls = fake_torch
    fails += [_in_use()]
    with pytest.raises(RuntimeError, match="on localhost, port: 4321 already in use"):
        create_c10d_store(True, "localhost", 4321, wait_for_workers=False)
    assert [c["port"] for c in calls] == [4321]


def test_a_barrier_that_times_out_is_a_timeout_error(
    fake_torch: tuple[list[BaseException], list[dict[str, Any]]],
) -> None:
    with pytest.raises(TimeoutError, match="timed out waiting for all 2 members to join"):
        create_c10d_store(True, "localhost", 4321, world_size=2, timeout=1)


def test_use_libuv_is_ignored_with_torchs_warning_and_the_variable_decides(
    fake_torch: tuple[list[BaseException], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, calls = fake_torch
    monkeypatch.setenv("USE_LIBUV", "0")
    with caplog.at_level(logging.WARNING, logger=distributed.__name__):
        create_c10d_store(True, "localhost", wait_for_workers=False, use_libuv=True)
    assert calls[0]["use_libuv"] is False
    assert "use_libuv is deprecated" in caplog.text


def test_create_c10d_store_without_torch_says_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(ImportError, match="install torch"):
        create_c10d_store(True, "localhost")


def test_the_module_has_torchs_public_names() -> None:
    assert set(distributed.__all__) == {
        "create_c10d_store",
        "get_free_port",
        "get_socket_with_port",
    }
    with get_socket_with_port() as sock:
        assert sock.getsockname()[1] > 0
    assert get_free_port() > 0
