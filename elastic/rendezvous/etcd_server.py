"""torch's ``torch.distributed.elastic.rendezvous.etcd_server``, at torch's path.

The implementation is a real adapter (it starts a process): see
:mod:`elastic.real.etcd_server`.  Importing this module costs no gRPC.
"""

from __future__ import annotations

import logging
import shutil
import subprocess as _subprocess

from elastic.real.etcd_server import EtcdServer, find_free_port

__all__ = ["EtcdServer", "find_free_port", "stop_etcd"]

logger = logging.getLogger(__name__)


def stop_etcd(subprocess: _subprocess.Popen[bytes] | None, data_dir: str | None = None) -> None:
    """torch's helper: terminate an etcd process started by hand (and wait for it), then
    delete its ``data_dir``, when given."""
    if subprocess is not None and subprocess.poll() is None:
        logger.info("stopping etcd server")
        subprocess.terminate()
        subprocess.wait()
    if data_dir:
        logger.info("deleting etcd data dir: %s", data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
